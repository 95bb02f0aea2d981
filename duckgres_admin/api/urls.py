"""API routes under /api/v1/ (spec reshard §5; Trino: spec trino-pools §5)."""

from django.urls import URLPattern, URLResolver, path

from duckgres_admin.api import drain_views, trino_views, views

urlpatterns: list[URLPattern | URLResolver] = [
    path("reshards", views.ReshardListView.as_view(), name="reshard-list"),
    path("reshards/targets", views.ReshardTargetsView.as_view(), name="reshard-targets"),
    path("reshards/<int:op_id>", views.ReshardDetailView.as_view(), name="reshard-detail"),
    path("reshards/<int:op_id>/log", views.ReshardLogView.as_view(), name="reshard-log"),
    path("reshards/<int:op_id>/cancel", views.ReshardCancelView.as_view(), name="reshard-cancel"),
    path(
        "reshards/<int:op_id>/password",
        views.ReshardPasswordView.as_view(),
        name="reshard-password",
    ),
    path("warehouses", views.WarehouseListView.as_view(), name="warehouse-list"),
    path("warehouses/<str:org>", views.WarehouseDetailView.as_view(), name="warehouse-detail"),
    path("warehouses/<str:org>/reshards", views.ReshardStartView.as_view(), name="reshard-start"),
    path("warehouses/<str:org>/restores", views.RestoreStartView.as_view(), name="restore-start"),
    path(
        "warehouses/<str:org>/backups",
        views.WarehouseBackupsView.as_view(),
        name="warehouse-backups",
    ),
    path(
        "warehouses/<str:org>/backups/restore-test",
        views.RestoreTestView.as_view(),
        name="backup-restore-test",
    ),
    path(
        "warehouses/<str:org>/trino",
        trino_views.WarehouseTrinoView.as_view(),
        name="warehouse-trino",
    ),
    path(
        "warehouses/<str:org>/trino/cell",
        trino_views.WarehouseTrinoCellView.as_view(),
        name="warehouse-trino-cell",
    ),
    path(
        "warehouses/<str:org>/trino/cell/move",
        trino_views.WarehouseTrinoMoveView.as_view(),
        name="warehouse-trino-cell-move",
    ),
    path("trino/cells", trino_views.TrinoCellsView.as_view(), name="trino-cells"),
    path("trino/orgs", trino_views.TrinoOrgsView.as_view(), name="trino-orgs"),
    path("trino/instances", trino_views.TrinoInstancesView.as_view(), name="trino-instances"),
    path("warehouses/<str:org>/leases", views.LeaseCreateView.as_view(), name="lease-create"),
    path(
        "warehouses/<str:org>/leases/<int:lease_id>",
        views.LeaseDetailView.as_view(),
        name="lease-detail",
    ),
    path(
        "warehouses/<str:org>/leases/<int:lease_id>/renew",
        views.LeaseRenewView.as_view(),
        name="lease-renew",
    ),
    path("metadata-stores", views.MetadataStoreListView.as_view(), name="metadata-store-list"),
    path(
        "metadata-stores/<str:name>",
        views.MetadataStoreDetailView.as_view(),
        name="metadata-store-detail",
    ),
    path(
        "metadata-stores/<str:name>/drain",
        drain_views.StoreDrainCreateView.as_view(),
        name="store-drain",
    ),
    path(
        "metadata-stores/<str:name>/drains",
        drain_views.StoreDrainsView.as_view(),
        name="store-drains",
    ),
    path("drains/<int:drain_id>", drain_views.DrainDetailView.as_view(), name="drain-detail"),
    path("drains/<int:drain_id>/pause", drain_views.DrainPauseView.as_view(), name="drain-pause"),
    path(
        "drains/<int:drain_id>/resume", drain_views.DrainResumeView.as_view(), name="drain-resume"
    ),
    path(
        "drains/<int:drain_id>/cancel", drain_views.DrainCancelView.as_view(), name="drain-cancel"
    ),
]
