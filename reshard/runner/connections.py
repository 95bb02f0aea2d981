"""Connections the steps, rollback and roll-forward open to metadata stores (spec §4.9, §4.11).

The single place runner work opens metadata-store connections. Rules:

- passwords reach psycopg only as ``password=`` (``lib.pgadmin.connect``, which also enforces
  TLS, ``require_auth=scram-sha-256`` and pins ``search_path``/``row_security``); every password
  resolved here is added to the run context's scrubber before it can appear anywhere;
- every statement runs under ``statement_timeout`` and ``lock_timeout`` sized from the step's
  deadline (``RunContext.statement_seconds``), so a session outside the product holding a lock
  can delay a step but never block it forever (safeguard reshard-67);
- every connection is registered with the run context while in use, with
  ``interrupt_on_stop``: fencing, SIGTERM and an acted-on cancel cancel its running statement,
  and :func:`registered` turns the resulting ``QueryCanceled`` into :class:`Interrupted` so the
  step machine reports the stop, not a database error;
- fences, terminations and drops use the store's **direct** endpoint (never the pooler);
  tenant probes use the tenant endpoint (pooler when configured) and pin nothing there;
- the target side of a copy logs in **as the tenant** (cnpg targets: with the password of
  ``target_password_secret_ref`` that ``cutover`` rendered the role with), never as the
  provisioner with ``SET ROLE``: catalog work on a shared shard runs with the tenant's own
  rights (safeguard reshard-60). cnpg sources are fenced (NOLOGIN), so the source side stays the
  provisioner with ``SET ROLE``; its sessions are pinned like every other.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg import sql

from duckgres_admin.lib import pgadmin, secretrefs
from duckgres_admin.models import MetadataStore, ReshardOperation
from duckgres_admin.platform.names import runner_name
from reshard.runner.context import RunContext
from reshard.runner.errors import Interrupted, StepError

PgConn = psycopg.Connection[tuple[object, ...]]
# lock_timeout as a share of statement_timeout.
LOCK_SHARE = 0.9


def app_name(op_id: int) -> str:
    return runner_name(op_id)


@dataclass(frozen=True)
class Provisioner:
    store: MetadataStore
    password: str

    @property
    def direct(self) -> pgadmin.Endpoint:
        return pgadmin.Endpoint(self.store.host, self.store.port, self.store.sslmode)

    @property
    def tenant_endpoint(self) -> pgadmin.Endpoint:
        """Where the data plane's tenant logins go: the pooler when set, else direct."""
        if self.store.pooler_host:
            return pgadmin.Endpoint(
                self.store.pooler_host,
                self.store.pooler_port or self.store.port,
                self.store.pooler_sslmode or self.store.sslmode,
            )
        return self.direct


def cnpg_store(name: str) -> MetadataStore:
    store = MetadataStore.objects.filter(name=name).first()
    if store is None or store.kind != "cnpg":
        raise StepError(
            f"cnpg store {name or '<empty>'} is "
            + ("not registered" if store is None else f"registered as {store.kind}")
        )
    return store


def resolve_secret(ctx: RunContext, ref: str, what: str) -> str:
    """Resolve a secret reference and register the value with the scrubber."""
    try:
        value = secretrefs.resolve(ref)
    except secretrefs.SecretRefError as exc:
        raise StepError(f"cannot resolve {what}: {exc}") from None
    ctx.scrubber.add(value)
    return value


def provisioner(ctx: RunContext, store_name: str) -> Provisioner:
    store = cnpg_store(store_name)
    password = resolve_secret(
        ctx, store.provisioner_password_ref, f"the provisioner password of store {store.name}"
    )
    return Provisioner(store, password)


@contextlib.contextmanager
def registered(ctx: RunContext, conn: PgConn) -> Iterator[PgConn]:
    """Register ``conn`` (``interrupt_on_stop``) while the body runs; a statement the context
    cancelled (stop, cancel, fencing) surfaces as :class:`Interrupted`."""
    ctx.register_connection(conn, interrupt_on_stop=True)
    try:
        yield conn
    except psycopg.errors.QueryCanceled:
        if ctx.was_interrupted(conn):
            raise Interrupted() from None
        raise
    finally:
        ctx.unregister_connection(conn)


def open_store(
    ctx: RunContext,
    endpoint: pgadmin.Endpoint,
    *,
    dbname: str,
    user: str,
    password: str,
    connect_timeout: int = 10,
    autocommit: bool = True,
    pin: bool = True,
) -> PgConn:
    """``lib.pgadmin.connect`` with the op's ``application_name`` and the step's timeouts
    (``lock_timeout`` a tenth below ``statement_timeout``, so a lock wait reports itself as
    one: SQLSTATE 55P03)."""
    seconds = ctx.statement_seconds()
    return pgadmin.connect(
        endpoint,
        dbname=dbname,
        user=user,
        password=password,
        application_name=app_name(ctx.op_id),
        connect_timeout=connect_timeout,
        autocommit=autocommit,
        statement_timeout=seconds,
        lock_timeout=seconds * LOCK_SHARE,
        pin=pin,
    )


@contextlib.contextmanager
def provisioner_conn(
    ctx: RunContext,
    prov: Provisioner,
    *,
    dbname: str = "postgres",
    role: str = "",
    connect_timeout: int = 10,
) -> Iterator[PgConn]:
    """An autocommit provisioner connection on the direct endpoint (``SET ROLE`` optional)."""
    with (
        open_store(
            ctx,
            prov.direct,
            dbname=dbname,
            user=prov.store.provisioner_user,
            password=prov.password,
            connect_timeout=connect_timeout,
        ) as conn,
        registered(ctx, conn),
    ):
        if role:
            conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(role)))
        yield conn


def role_state(conn: PgConn, role: str) -> bool | None:
    """``rolcanlogin`` of ``role`` (None: the role does not exist)."""
    row = conn.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", [role]).fetchone()
    return None if row is None else bool(row[0])


def ensure_can_set_role(conn: PgConn, role: str, provisioner_user: str) -> None:
    """Let the provisioner ``SET ROLE`` to ``role`` (``CREATE DATABASE … OWNER`` needs it).

    On PostgreSQL 16+ a CREATEROLE role holds the roles it creates with ADMIN but without SET
    (``createrole_self_grant`` empty): membership alone (``pg_has_role … MEMBER``) is not
    enough, so the check is ``SET`` there, ``MEMBER`` before; the grant is the provisioner's
    own (its ADMIN allows it)."""
    row = conn.execute(
        "SELECT pg_catalog.pg_has_role(current_user, %s, "
        "CASE WHEN current_setting('server_version_num')::int >= 160000 THEN 'SET' "
        "ELSE 'MEMBER' END)",
        [role],
    ).fetchone()
    if not row or not row[0]:
        conn.execute(
            sql.SQL("GRANT {} TO {}").format(sql.Identifier(role), sql.Identifier(provisioner_user))
        )


def ensure_database(conn: PgConn, database: str, owner: str) -> bool:
    """``CREATE DATABASE … OWNER`` unless it exists (never adopted here: the callers check the
    owner first); whether it exists now."""
    if not database_exists(conn, database):
        conn.execute(
            sql.SQL("CREATE DATABASE {} OWNER {}").format(
                sql.Identifier(database), sql.Identifier(owner)
            )
        )
    return database_exists(conn, database)


def database_exists(conn: PgConn, database: str) -> bool:
    row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
    return row is not None


def classify(exc: BaseException, *, role: str, ref: str, where: str) -> str:
    """A probe failure as an operator-facing observation (spec §4.11)."""
    text = " ".join(str(exc).split())
    if pgadmin.is_auth_failure(exc):
        return (
            f"authentication failed for role {role} at {where} (stranded password?): {text}; "
            f"remedy: ALTER ROLE {role} WITH PASSWORD '<the password in secret {ref}>' on the "
            "store's primary"
        )
    return f"probe of {where} as {role} failed: {text}"


def tenant_probe(
    ctx: RunContext,
    endpoint: pgadmin.Endpoint,
    *,
    database: str,
    user: str,
    password: str,
) -> None:
    """Connect + ``SELECT 1`` as the tenant; raises the psycopg error. Nothing is pinned: the
    endpoint may be a transaction pooler (a session setting would outlive this client)."""
    with (
        open_store(
            ctx, endpoint, dbname=database, user=user, password=password, connect_timeout=8,
            pin=False,
        ) as conn,
        registered(ctx, conn),
    ):  # fmt: skip
        conn.execute("SELECT 1")


def tenant_login_observation(
    ctx: RunContext, prov: Provisioner, *, database: str, user: str, password: str, ref: str
) -> tuple[bool, str]:
    """A poll observation: a tenant login and ``SELECT 1`` through the store's tenant endpoint
    (the data plane's way in), a failure classified (§4.11)."""
    try:
        tenant_probe(ctx, prov.tenant_endpoint, database=database, user=user, password=password)
    except psycopg.Error as exc:
        return False, classify(
            exc, role=user, ref=ref, where=f"store {prov.store.name} tenant endpoint"
        )
    return True, f"tenant SELECT 1 on {database} succeeded"


def end_sessions(
    conn: PgConn,
    query: str,
    params: Sequence[Any],
    *,
    what: str,
    warn: Callable[[str], None],
    seconds: float,
    settle: int = 1,
) -> None:
    """Terminate the sessions ``query`` lists (their pids) until it lists none ``settle`` times
    in a row, a moment apart; ``StepError`` past ``seconds``. Each pass is logged. It never
    stops early: a rollback, which ignores stop, uses it too."""
    deadline = time.monotonic() + seconds
    quiet = 0
    while True:
        pids = [row[0] for row in conn.execute(query, params).fetchall()]
        quiet = 0 if pids else quiet + 1
        if quiet >= settle:
            return
        if pids:
            warn(f"ending {len(pids)} {what}")
            for pid in pids:
                conn.execute("SELECT pg_catalog.pg_terminate_backend(%s)", (pid,))
            if time.monotonic() > deadline:
                raise StepError(f"{len(pids)} {what} did not end within {seconds:.0f} s")
        time.sleep(0.25 if pids else 0.1)


# --- the two sides of a copy ------------------------------------------------------------------
@dataclass(frozen=True)
class Side:
    """How to reach one side's catalog as the tenant: logged in as the tenant (targets,
    external sources) or as the provisioner + ``SET ROLE`` (fenced cnpg sources)."""

    label: str
    endpoint: pgadmin.Endpoint
    database: str
    user: str
    password: str
    role: str = ""  # SET ROLE after connecting (cnpg sides)
    store: str = ""  # cnpg store name

    def connect(self, ctx: RunContext, *, autocommit: bool = True) -> PgConn:
        """A pinned connection with the step's timeouts (the caller registers it)."""
        conn = open_store(
            ctx,
            self.endpoint,
            dbname=self.database,
            user=self.user,
            password=self.password,
            autocommit=autocommit,
        )
        try:
            # The login's right (the provisioner's, not the tenant's): before any SET ROLE.
            pgadmin.yield_autovacuum_sooner(conn)
            if self.role:
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.role)))
                if not autocommit:
                    conn.commit()
        except BaseException:
            conn.close()
            raise
        return conn

    def redacted(self) -> str:
        text = self.endpoint.redacted(self.database, self.user)
        return f"{text} as role {self.role}" if self.role else text


def source_side(ctx: RunContext, op: ReshardOperation) -> Side:
    """The source from the op's durable fields (never the binding; spec §4.8)."""
    if op.source_kind == "cnpg":
        if not (op.source_endpoint and op.source_user and op.source_database):
            raise StepError(
                "the durable source fields (endpoint, user, database) are incomplete; refusing "
                "to guess the source"
            )
        prov = provisioner(ctx, op.from_shard)
        return Side(
            "source",
            pgadmin.Endpoint(op.source_endpoint, op.source_port or 5432, op.source_sslmode),
            op.source_database,
            prov.store.provisioner_user,
            prov.password,
            role=op.source_user,
            store=prov.store.name,
        )
    if not ctx.source_password:
        if op.source_password_secret_ref:
            ctx.set_source_password(
                resolve_secret(ctx, op.source_password_secret_ref, "the source password")
            )
        if not ctx.source_password:
            raise StepError(
                "external source password is not available to this runner — cancel and re-run "
                "the operation"
            )
    return Side(
        "source",
        # An empty sslmode is verify-full (lib.pgadmin); there is no weaker fallback.
        pgadmin.Endpoint(op.source_endpoint, op.source_port or 5432, op.source_sslmode),
        op.source_database,
        op.source_user,
        ctx.source_password,
    )


def target_side(ctx: RunContext, op: ReshardOperation) -> Side:
    """The target, logged in as the tenant (never provisioner + ``SET ROLE``, safeguard
    reshard-60). cnpg: the store's direct endpoint (never the pooler: the copy needs a session)
    and the password ``cutover`` rendered the tenant role with (``target_password_secret_ref``);
    external: the pulled password."""
    if op.target_kind == "cnpg":
        store = cnpg_store(op.to_shard)
        password = resolve_secret(
            ctx,
            op.target_password_secret_ref,
            f"the target password secret {op.target_password_secret_ref or '<empty>'}",
        )
        return Side(
            "target",
            pgadmin.Endpoint(store.host, store.port, store.sslmode),
            op.target_database,
            op.target_user,
            password,
            store=store.name,
        )
    if not ctx.target_password:
        raise StepError(
            "external target password is not available to this runner (takeover after a "
            "crash?) — cancel and re-run the operation"
        )
    return Side(
        "target",
        pgadmin.Endpoint(op.target_endpoint, op.target_port or 5432, op.target_sslmode),
        op.target_database,
        op.target_user,
        ctx.target_password,
    )


def quote_ident(name: str) -> sql.Identifier:
    return sql.Identifier(name)


def first(row: Any) -> Any:
    return None if row is None else row[0]
