"""API routes under /api/v1/ (spec reshard §5; Trino: spec trino-pools §5)."""

from django.urls import URLPattern, URLResolver, path

from duckgres_admin.api import (
    drain_views,
    lease_views,
    reshard_views,
    store_views,
    trino_views,
    warehouse_views,
)

urlpatterns: list[URLPattern | URLResolver] = [
    path("reshards", reshard_views.ReshardListView.as_view(), name="reshard-list"),
    path("reshards/targets", reshard_views.ReshardTargetsView.as_view(), name="reshard-targets"),
    path("reshards/<int:op_id>", reshard_views.ReshardDetailView.as_view(), name="reshard-detail"),
    path("reshards/<int:op_id>/log", reshard_views.ReshardLogView.as_view(), name="reshard-log"),
    path(
        "reshards/<int:op_id>/cancel",
        reshard_views.ReshardCancelView.as_view(),
        name="reshard-cancel",
    ),
    path(
        "reshards/<int:op_id>/password",
        reshard_views.ReshardPasswordView.as_view(),
        name="reshard-password",
    ),
    path("warehouses", warehouse_views.WarehouseListView.as_view(), name="warehouse-list"),
    path(
        "warehouses/<str:org>",
        warehouse_views.WarehouseDetailView.as_view(),
        name="warehouse-detail",
    ),
    path(
        "warehouses/<str:org>/reshards",
        reshard_views.ReshardStartView.as_view(),
        name="reshard-start",
    ),
    path(
        "warehouses/<str:org>/restores",
        reshard_views.RestoreStartView.as_view(),
        name="restore-start",
    ),
    path(
        "warehouses/<str:org>/backups",
        warehouse_views.WarehouseBackupsView.as_view(),
        name="warehouse-backups",
    ),
    path(
        "warehouses/<str:org>/backups/restore-test",
        warehouse_views.RestoreTestView.as_view(),
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
    path("warehouses/<str:org>/leases", lease_views.LeaseCreateView.as_view(), name="lease-create"),
    path(
        "warehouses/<str:org>/leases/<int:lease_id>",
        lease_views.LeaseDetailView.as_view(),
        name="lease-detail",
    ),
    path(
        "warehouses/<str:org>/leases/<int:lease_id>/renew",
        lease_views.LeaseRenewView.as_view(),
        name="lease-renew",
    ),
    path(
        "metadata-stores", store_views.MetadataStoreListView.as_view(), name="metadata-store-list"
    ),
    path(
        "metadata-stores/<str:name>",
        store_views.MetadataStoreDetailView.as_view(),
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
