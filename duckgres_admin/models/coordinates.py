"""Read-only views of other tenants' placement, for the server checks (identity.py).

The checks that keep two warehouses off one catalog or one role (``reshard.engines.identity``) must
see every live binding and every active operation's target, also when a runner asks: a runner's
config-store login sees its own organisation's rows only (migration 0022). These two views,
owned by the control plane's login, expose to whoever may select them only the coordinates
those checks compare — organisation, state, store, host, port, database, role — never a
password reference, a bucket or a role ARN. Both are ``security_barrier`` views, so a caller's
own functions in a ``WHERE`` clause cannot see rows the view's own filter removed.
"""

from __future__ import annotations

from django.db import models


class BindingCoordinates(models.Model):
    """Where each warehouse's catalog lives (view ``duckgres_binding_coordinates``)."""

    org_id = models.TextField(primary_key=True)
    state = models.TextField()
    metadata_store_kind = models.TextField()
    metadata_store_id = models.TextField(null=True, db_column="metadata_store_name")
    metadata_store_host = models.TextField()
    metadata_store_port = models.IntegerField(null=True)
    metadata_store_database = models.TextField()
    metadata_store_user = models.TextField()

    class Meta:
        managed = False
        db_table = "duckgres_binding_coordinates"


class ActiveTarget(models.Model):
    """The target of each pending or running operation (view ``duckgres_active_targets``)."""

    id = models.BigIntegerField(primary_key=True)
    org_id = models.TextField()
    target_kind = models.TextField()
    to_shard = models.TextField()
    target_user = models.TextField()
    target_database = models.TextField()

    class Meta:
        managed = False
        db_table = "duckgres_active_targets"
