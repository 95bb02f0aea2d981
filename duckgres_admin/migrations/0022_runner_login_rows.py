"""Row-level security for the per-operation runner logins (issue 25 item 3; docs/threat-model.md).

A runner connects to the config store as ``duckgres_runner_<installation tag>_op<id>``, a login
the launcher mints for that operation (``reshard.launchers.login``). ``duckgres_runner_op()``
reads the operation id from the *session* user, which only a superuser can change (``SET ROLE``
changes ``current_user``, not ``session_user``), so a runner cannot widen what it sees:

* a session whose user is not a runner login gets NULL, and the policies let it see every row
  (the control plane's login owns these tables and bypasses them anyway);
* a runner login of this pattern sees the rows of its own operation only; a name that starts
  like one but does not parse gets 0, which matches no operation.

The policies are permissive and the only ones on these tables; a runner login has no
``BYPASSRLS`` and owns nothing, so ``SET row_security = off`` makes its queries fail instead of
unfiltered. Which tables and columns it may touch at all is granted per login at mint time.

Metadata-store rows hold no secret (references only) and the server checks compare every
store's endpoints, so they are not filtered. The two views (``models/coordinates.py``) give the
identity checks every binding's and every active target's coordinates and nothing else.
"""

from __future__ import annotations

from django.db import migrations, models

FUNCTION = r"""
CREATE OR REPLACE FUNCTION duckgres_runner_op() RETURNS bigint
LANGUAGE sql STABLE PARALLEL SAFE
SET search_path = pg_catalog
AS $$
  SELECT CASE
    WHEN session_user::text !~ '^duckgres_runner_' THEN NULL
    ELSE coalesce(
      substring(session_user::text FROM '^duckgres_runner_[0-9a-f]{8,12}_op([0-9]{1,18})$')::bigint,
      0)
  END
$$
"""

_OWN_ORG = (
    "org_id = (SELECT o.org_id FROM duckgres_reshard_operations o "
    "WHERE o.id = duckgres_runner_op())"
)

# A runner may record only password references that are already its operation's: the source's
# is copied from the binding, and the binding takes only the op's source or target reference.
# The launcher mounts the Secrets these name into the next runner pod, so a runner that could
# write any reference there could have any Secret of the namespace mounted.
GUARD = r"""
CREATE OR REPLACE FUNCTION duckgres_runner_refs_guard() RETURNS trigger
LANGUAGE plpgsql
SET search_path = pg_catalog, public
AS $$
DECLARE
  me bigint := duckgres_runner_op();
BEGIN
  IF me IS NULL THEN
    RETURN NEW;
  END IF;
  IF TG_TABLE_NAME = 'duckgres_reshard_operations' THEN
    IF NEW.source_password_secret_ref IS DISTINCT FROM OLD.source_password_secret_ref
       AND NEW.source_password_secret_ref IS DISTINCT FROM (
         SELECT w.metadata_store_password_ref FROM duckgres_managed_warehouses w
         WHERE w.org_id = OLD.org_id) THEN
      RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
        MESSAGE = 'a runner records as the source password reference only the one its '
                  'warehouse binding holds';
    END IF;
  ELSIF NEW.metadata_store_password_ref IS DISTINCT FROM OLD.metadata_store_password_ref
     AND NOT EXISTS (
       SELECT 1 FROM duckgres_reshard_operations o
       WHERE o.id = me AND o.org_id = OLD.org_id
         AND NEW.metadata_store_password_ref IN (
           o.source_password_secret_ref, o.target_password_secret_ref)) THEN
    RAISE EXCEPTION USING ERRCODE = 'insufficient_privilege',
      MESSAGE = 'a runner binds its warehouse only to its operation''s source or target '
                'password reference';
  END IF;
  RETURN NEW;
END
$$
"""
GUARDED = ("duckgres_reshard_operations", "duckgres_managed_warehouses")

VIEWS = {
    "duckgres_binding_coordinates": (
        "SELECT org_id, state, metadata_store_kind, metadata_store_name, metadata_store_host, "
        "metadata_store_port, metadata_store_database, metadata_store_user "
        "FROM duckgres_managed_warehouses"
    ),
    "duckgres_active_targets": (
        "SELECT id, org_id, target_kind, to_shard, target_user, target_database "
        "FROM duckgres_reshard_operations WHERE state IN ('pending', 'running')"
    ),
}

# table -> the runner's own rows
POLICIES: dict[str, str] = {
    "duckgres_reshard_operations": "id = duckgres_runner_op()",
    "duckgres_reshard_operation_log": "operation_id = duckgres_runner_op()",
    "duckgres_reshard_operation_steps": "operation_id = duckgres_runner_op()",
    "duckgres_managed_warehouses": _OWN_ORG,
    "duckgres_managed_warehouse_trino": _OWN_ORG,
    "duckgres_connection_leases": _OWN_ORG,
}


def _forward() -> list[str]:
    statements = [FUNCTION]
    for table, own in POLICIES.items():
        statements += [
            f"ALTER TABLE {table} ENABLE ROW LEVEL SECURITY",
            f"DROP POLICY IF EXISTS duckgres_runner_own ON {table}",
            f"CREATE POLICY duckgres_runner_own ON {table} "
            f"USING (duckgres_runner_op() IS NULL OR ({own})) "
            f"WITH CHECK (duckgres_runner_op() IS NULL OR ({own}))",
        ]
    statements.append(GUARD)
    for table in GUARDED:
        statements += [
            f"DROP TRIGGER IF EXISTS duckgres_runner_refs_guard ON {table}",
            f"CREATE TRIGGER duckgres_runner_refs_guard BEFORE UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION duckgres_runner_refs_guard()",
        ]
    statements += [
        f"CREATE OR REPLACE VIEW {name} WITH (security_barrier) AS {query}"
        for name, query in VIEWS.items()
    ]
    return statements


def _backward() -> list[str]:
    statements: list[str] = [f"DROP VIEW IF EXISTS {name}" for name in VIEWS]
    statements += [f"DROP TRIGGER IF EXISTS duckgres_runner_refs_guard ON {t}" for t in GUARDED]
    statements.append("DROP FUNCTION IF EXISTS duckgres_runner_refs_guard()")
    for table in POLICIES:
        statements += [
            f"DROP POLICY IF EXISTS duckgres_runner_own ON {table}",
            f"ALTER TABLE {table} DISABLE ROW LEVEL SECURITY",
        ]
    return [*statements, "DROP FUNCTION IF EXISTS duckgres_runner_op()"]


class Migration(migrations.Migration):
    dependencies = [("duckgres_admin", "0021_installation_row")]

    operations = [
        migrations.RunSQL(sql=_forward(), reverse_sql=_backward()),
        migrations.CreateModel(
            name="ActiveTarget",
            fields=[
                ("id", models.BigIntegerField(primary_key=True, serialize=False)),
                ("org_id", models.TextField()),
                ("target_kind", models.TextField()),
                ("to_shard", models.TextField()),
                ("target_user", models.TextField()),
                ("target_database", models.TextField()),
            ],
            options={"db_table": "duckgres_active_targets", "managed": False},
        ),
        migrations.CreateModel(
            name="BindingCoordinates",
            fields=[
                ("org_id", models.TextField(primary_key=True, serialize=False)),
                ("state", models.TextField()),
                ("metadata_store_kind", models.TextField()),
                (
                    "metadata_store_id",
                    models.TextField(db_column="metadata_store_name", null=True),
                ),
                ("metadata_store_host", models.TextField()),
                ("metadata_store_port", models.IntegerField(null=True)),
                ("metadata_store_database", models.TextField()),
                ("metadata_store_user", models.TextField()),
            ],
            options={"db_table": "duckgres_binding_coordinates", "managed": False},
        ),
    ]
