"""The per-operation config-store login of a runner (issue 25 item 3; docs/threat-model.md).

A runner never receives the control plane's config-store login. The launcher mints, for each
launch, a login ``duckgres_runner_<installation tag>_op<id>`` and hands the runner a DSN for it
(pod launcher: a per-operation Secret its pod references; local launcher: the child's
environment). Invariants:

* **What it may touch** is granted here, table by table and column by column (``GRANTS``): its
  operation's row (never the columns that choose the next runner's image, the Secrets mounted
  into it, the endpoints or the restore's pinned object: ``IMMUTABLE_OP_COLUMNS``), its log and
  step rows, its organisation's warehouse (the binding's columns only) and leases, and the rows
  of its two stores. Nothing of ``auth_*``, sessions, operators, audit, other operations, drains,
  notifications or beat: those are not granted at all (``permission denied``).
* **Which rows** is decided by row-level security (migration 0022) on the *session* user, which
  the runner cannot change; it owns nothing and has no ``BYPASSRLS``, so it cannot switch the
  filter off.
* **A relaunch re-mints**: the password changes, so an earlier runner of the same operation
  cannot open new connections (its epoch fences what it already holds).
* **The login ends with the operation**: the janitor drops it (``sweep``) once the operation is
  terminal and its runner is gone. The password is set as a client-side SCRAM verifier, so it
  never reaches SQL text or a server log.

Minting needs ``CREATEROLE`` on the control plane's login (docs/configuration.md). Every
statement here runs under a ``lock_timeout``.
"""

from __future__ import annotations

import re
import secrets
from collections.abc import Iterable
from dataclasses import dataclass

from django.db import DatabaseError, connection, transaction
from psycopg import sql
from psycopg.conninfo import make_conninfo

from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.engines.restore.stream import installation_tag
from reshard.launchers.base import LauncherError
from reshard.warehouses.rules import GUARDED_WAREHOUSE_FIELDS

PREFIX = "duckgres_runner_"
_NAME = re.compile(r"^duckgres_runner_[0-9a-f]{8,12}_op([0-9]{1,18})$")
LOCK_TIMEOUT = "5s"

# Columns of the op row a runner never writes: who and what the operation is, where it writes,
# the image and Secrets of its next runner, and the API's pins. (The source's password
# reference is recorded by the runner, but migration 0022's trigger lets it record only the
# reference its warehouse's binding holds; the binding's, only the op's source or target one.)
IMMUTABLE_OP_COLUMNS: frozenset[str] = frozenset(
    {
        "id",
        "org_id",
        "created_by",
        "kind",
        "in_place",
        "source_kind",
        "from_shard",
        "target_kind",
        "to_shard",
        "target_password_secret_ref",
        "launcher",
        "runner_image",
        "password_url",
        "password_pull_digest",
        "respawn_attempts",
        "restore_backup_key",
        "restore_backup_bucket",
        "restore_backup_etag",
        "restore_backup_sha256",
        "restore_backup_size",
        "restore_backup_version_id",
        "drain_item_id",
        "created_at",
        "recovery_owner",
        "recovery_claimed_at",
        "recovered_at",
        "recovery_outcome",
    }
)


@dataclass(frozen=True)
class Grant:
    table: str
    privileges: tuple[str, ...]  # whole-table privileges
    update_columns: tuple[str, ...] = ()  # UPDATE on these columns only


def _op_update_columns() -> tuple[str, ...]:
    return tuple(
        f.column
        for f in ReshardOperation._meta.concrete_fields
        if f.column not in IMMUTABLE_OP_COLUMNS
    )


def _warehouse_update_columns() -> tuple[str, ...]:
    """The columns a running reshard owns (``GUARDED_WAREHOUSE_FIELDS``), and its message."""
    names = sorted({*GUARDED_WAREHOUSE_FIELDS, "status_message", "updated_at"})
    return tuple(str(Warehouse._meta.get_field(name).column) for name in names)  # type: ignore[union-attr]


def grants() -> tuple[Grant, ...]:
    """Everything a runner login may touch; rows are narrowed by migration 0022's policies."""
    return (
        Grant("duckgres_reshard_operations", ("SELECT",), _op_update_columns()),
        Grant("duckgres_reshard_operation_log", ("SELECT", "INSERT")),
        Grant("duckgres_reshard_operation_steps", ("SELECT", "INSERT", "UPDATE")),
        Grant("duckgres_managed_warehouses", ("SELECT",), _warehouse_update_columns()),
        Grant("duckgres_managed_warehouse_trino", ("SELECT",)),
        Grant("duckgres_connection_leases", ("SELECT",), ("state",)),
        Grant("duckgres_binding_coordinates", ("SELECT",)),
        Grant("duckgres_active_targets", ("SELECT",)),
        Grant("duckgres_metadata_stores", ("SELECT",)),
        Grant("duckgres_installation", ("SELECT",)),
    )


def role_name(op_id: int) -> str:
    return f"{PREFIX}{installation_tag()}_op{op_id}"


def op_id_of(role: str) -> int | None:
    match = _NAME.match(role)
    return int(match.group(1)) if match else None


def _grant_statements(ident: sql.Identifier) -> list[sql.Composed]:
    out: list[sql.Composed] = []
    for grant in grants():
        table = sql.Identifier(grant.table)
        out.append(
            sql.SQL("GRANT {} ON {} TO {}").format(
                sql.SQL(", ").join(sql.SQL(p) for p in grant.privileges), table, ident
            )
        )
        if grant.update_columns:
            out.append(
                sql.SQL("GRANT UPDATE ({}) ON {} TO {}").format(
                    sql.SQL(", ").join(sql.Identifier(c) for c in grant.update_columns),
                    table,
                    ident,
                )
            )
    return out


def _verifier(name: str, password: str) -> str:
    connection.ensure_connection()
    raw = connection.connection.pgconn
    return str(raw.encrypt_password(password.encode(), name.encode(), b"scram-sha-256").decode())


def mint(op_id: int) -> str:
    """Create (or re-password) the login of operation ``op_id`` with exactly ``grants()``; its
    DSN."""
    name = role_name(op_id)
    password = secrets.token_urlsafe(32)
    ident = sql.Identifier(name)
    try:
        verifier = sql.Literal(_verifier(name, password))
        with transaction.atomic(), connection.cursor() as cur:
            cur.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
            cur.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", [name])
            # A relaunch changes only the password: a CREATEROLE login that is not a superuser
            # may not even restate NOSUPERUSER on ALTER ROLE.
            template = (
                "ALTER ROLE {} WITH LOGIN PASSWORD {}"
                if cur.fetchone()
                else "CREATE ROLE {} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE NOINHERIT "
                "NOREPLICATION NOBYPASSRLS PASSWORD {}"
            )
            cur.execute(sql.SQL(template).format(ident, verifier).as_string(cur.connection))
            for statement in _grant_statements(ident):
                cur.execute(statement.as_string(cur.connection))
    except DatabaseError as exc:
        raise LauncherError(
            f"minting the config-store login {name} for the runner failed: {exc}. The control "
            "plane's DUCKGRES_CONFIG_STORE login needs CREATEROLE (docs/configuration.md)"
        ) from None
    return dsn_for(name, password)


def dsn_for(user: str, password: str) -> str:
    """The control plane's own config-store DSN with ``user`` and ``password`` in its place."""
    db = connection.settings_dict
    params = {
        "host": db.get("HOST") or None,
        "port": db.get("PORT") or None,
        "dbname": db.get("NAME"),
        **{k: v for k, v in (db.get("OPTIONS") or {}).items() if k != "application_name"},
        "user": user,
        "password": password,
    }
    return make_conninfo(**{k: str(v) for k, v in params.items() if v not in (None, "")})


def drop(name: str) -> None:
    """Revoke everything ``name`` was granted and drop it; gone already is fine."""
    ident = sql.Identifier(name)
    with transaction.atomic(), connection.cursor() as cur:
        cur.execute(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'")
        cur.execute("SELECT 1 FROM pg_catalog.pg_roles WHERE rolname = %s", [name])
        if cur.fetchone() is None:
            return
        for grant in grants():
            cur.execute(
                sql.SQL("REVOKE ALL ON {} FROM {}")
                .format(sql.Identifier(grant.table), ident)
                .as_string(cur.connection)
            )
        cur.execute(sql.SQL("DROP ROLE {}").format(ident).as_string(cur.connection))


def logins() -> list[str]:
    """This installation's runner logins that exist on the config store's server, in one
    query (none while the installation row is missing: reading never draws a tag)."""
    with connection.cursor() as cur:
        cur.execute(
            "SELECT r.rolname FROM pg_catalog.pg_roles r, duckgres_installation i "
            "WHERE i.id = 1 AND starts_with(r.rolname, %s || i.tag || '_op') "
            "ORDER BY r.rolname",
            [PREFIX],
        )
        return [str(row[0]) for row in cur.fetchall()]


def ended(names: Iterable[str], live_runners: set[int]) -> list[str]:
    """The logins whose operation is terminal (or gone) and has no runner object left."""
    ids = {name: op_id_of(name) for name in names}
    active = set(
        ReshardOperation.objects.filter(
            id__in=[i for i in ids.values() if i is not None], state__in=("pending", "running")
        ).values_list("id", flat=True)
    )
    return [
        name
        for name, op_id in ids.items()
        if op_id is not None and op_id not in active and op_id not in live_runners
    ]
