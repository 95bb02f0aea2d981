"""Sub-step B ``recordSource`` (spec reshard §4.4 B; safeguards 3b, 4). Stamps nothing.

Reads the live binding, requires it complete, checks it against the op's submit-time source
(drift → pre-flip failure: the kind, the store or endpoint, the database and the user), refuses
a catalog another live warehouse is bound to as well, observes the tenant database and role on
a cnpg store with the provisioner on the **direct** endpoint (and the tenant role identity,
``reshard.engines.identity.tenant_role_message``), then persists the ``source_*`` fields and copies
them onto the in-memory op (a missing in-memory copy once produced ``DROP DATABASE ""``).
Never run after ``cutover``: the binding names the target by then.
"""

from __future__ import annotations

import contextlib

import psycopg

from duckgres_admin.lib import pgadmin, secretrefs
from duckgres_admin.models import MetadataStore, Warehouse
from reshard.engines import identity
from reshard.runner.env import StepEnv
from reshard.runner.errors import StepError

DRIFT = "metadata-store identity drift"


def run(env: StepEnv) -> None:
    op = env.op
    try:
        binding = Warehouse.objects.get(org_id=op.org_id)
    except Warehouse.DoesNotExist:
        raise StepError(f"org {op.org_id} has no managed warehouse row") from None
    kind = binding.metadata_store_kind
    store_name = binding.metadata_store_id or ""
    if kind == "cnpg":
        complete = all(
            (
                store_name,
                binding.metadata_store_database,
                binding.metadata_store_user,
                binding.metadata_store_password_ref,
            )
        )
    elif kind == "external":
        complete = all(
            (
                binding.metadata_store_host,
                binding.metadata_store_port,
                binding.metadata_store_database,
                binding.metadata_store_user,
                binding.metadata_store_password_ref,
            )
        )
    else:
        complete = False
    if not complete:
        raise StepError(
            f"incomplete metadata-store info in the binding of org {op.org_id} (kind "
            f"{kind or '<empty>'}); refusing to proceed"
        )
    _know_secrets(env, binding)
    _check_drift(env, binding)
    if kind == "cnpg":
        endpoint = _observe_cnpg_source(env, binding, store_name)
    else:
        endpoint = pgadmin.Endpoint(
            binding.metadata_store_host,
            int(binding.metadata_store_port or 5432),
            binding.metadata_store_sslmode or pgadmin.DEFAULT_SSLMODE,
        )
        try:
            env.ctx.set_source_password(secretrefs.resolve(binding.metadata_store_password_ref))
        except secretrefs.SecretRefError as exc:
            raise StepError(f"cannot resolve the source password: {exc}") from None
    fields = {
        "source_endpoint": endpoint.host,
        "source_port": endpoint.port,
        "source_sslmode": endpoint.sslmode,
        "source_user": binding.metadata_store_user,
        "source_database": binding.metadata_store_database,
        "source_password_secret_ref": binding.metadata_store_password_ref,
    }
    env.fence.update(**fields)
    for name, value in fields.items():
        setattr(op, name, value)
    env.log.info(
        "source recorded: "
        + endpoint.redacted(binding.metadata_store_database, binding.metadata_store_user)
        + (f" on cnpg store {store_name}" if kind == "cnpg" else " (external)")
    )


def _know_secrets(env: StepEnv, binding: Warehouse) -> None:
    """Best effort, before any message names a binding value: the scrubber learns the secrets
    this step may use (the drift and sharing messages quote names a hostile binding may have
    set to a password)."""
    refs = [binding.metadata_store_password_ref]
    if binding.metadata_store_kind == "cnpg":
        store = MetadataStore.objects.filter(name=binding.metadata_store_id or "").first()
        if store is not None:
            refs.append(store.provisioner_password_ref)
    for ref in refs:
        with contextlib.suppress(Exception):  # reported where the secret is needed
            env.ctx.scrubber.add(secretrefs.resolve(ref))


def _check_drift(env: StepEnv, binding: Warehouse) -> None:
    op = env.op
    kind = binding.metadata_store_kind
    store_name = binding.metadata_store_id or ""
    if kind != op.source_kind:
        raise StepError(
            f"{DRIFT}: the binding is now {kind} but the operation was submitted for a "
            f"{op.source_kind} source; refusing to proceed"
        )
    if kind == "cnpg" and store_name != op.from_shard:
        raise StepError(
            f"{DRIFT}: the binding now names cnpg store {store_name} but the operation was "
            f"submitted for store {op.from_shard}; refusing to proceed"
        )
    if kind == "cnpg" and (binding.metadata_store_database, binding.metadata_store_user) != (
        op.source_database,
        op.source_user,
    ):
        raise StepError(
            f"{DRIFT}: the binding now names database {binding.metadata_store_database} (user "
            f"{binding.metadata_store_user}) on cnpg store {store_name} but the operation was "
            f"submitted for database {op.source_database} (user {op.source_user}); refusing to "
            "proceed"
        )
    if kind == "external":
        now = (
            binding.metadata_store_host,
            int(binding.metadata_store_port or 0),
            binding.metadata_store_database,
            binding.metadata_store_user,
        )
        then = (op.source_endpoint, op.source_port, op.source_database, op.source_user)
        if now != then:
            raise StepError(
                f"{DRIFT}: the external binding is now {now[0]}:{now[1]}/{now[2]} (user "
                f"{now[3]}) but the operation was submitted for {then[0]}:{then[1]}/{then[2]} "
                f"(user {then[3]}); refusing to proceed"
            )
        other = identity.other_binding(
            org_id=op.org_id,
            database=binding.metadata_store_database,
            store_name=None,
            endpoints={(binding.metadata_store_host, int(binding.metadata_store_port or 5432))},
        )
        if other is not None:
            raise StepError(
                f"source database {binding.metadata_store_database} on "
                f"{binding.metadata_store_host}:{binding.metadata_store_port} is also the catalog "
                f"of warehouse {other.org_id}; refusing to move a catalog two warehouses share"
            )


def _observe_cnpg_source(env: StepEnv, binding: Warehouse, store_name: str) -> pgadmin.Endpoint:
    store = MetadataStore.objects.filter(name=store_name).first()
    if store is None or store.kind != "cnpg":
        raise StepError(
            f"{DRIFT}: cnpg store {store_name} is "
            + ("not registered" if store is None else f"registered as {store.kind}")
            + "; refusing to proceed"
        )
    try:
        password = secretrefs.resolve(store.provisioner_password_ref)
    except secretrefs.SecretRefError as exc:
        raise StepError(
            f"cannot resolve the provisioner password of store {store.name}: {exc}"
        ) from None
    env.ctx.scrubber.add(password)
    direct = pgadmin.Endpoint(store.host, store.port, store.sslmode)
    database = binding.metadata_store_database
    role = binding.metadata_store_user
    shared = identity.shared_catalog_message(org_id=env.op.org_id, database=database, store=store)
    if shared:
        raise StepError(
            f"{shared}; refusing to move a catalog two warehouses share (its fence and drop "
            "would hit the other warehouse)"
        )
    refusal: str | None = None
    try:
        with pgadmin.connect(
            direct,
            dbname="postgres",
            user=store.provisioner_user,
            password=password,
            application_name=env.app_name,
        ) as conn:
            env.ctx.register_connection(conn)
            try:
                row = conn.execute(
                    "SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = %s), "
                    "EXISTS (SELECT 1 FROM pg_roles WHERE rolname = %s)",
                    (database, role),
                ).fetchone()
                refusal = identity.tenant_role_message(
                    conn, org_id=env.op.org_id, role=role, database=database, store=store
                )
            finally:
                env.ctx.unregister_connection(conn)
    except psycopg.Error as exc:
        raise StepError(
            f"cannot observe the source on store {store.name} at "
            f"{direct.redacted('postgres', store.provisioner_user)}: {exc}"
        ) from None
    db_exists, role_exists = (bool(row[0]), bool(row[1])) if row else (False, False)
    if not (db_exists and role_exists):
        missing = " and ".join(
            what
            for what, ok in (
                (f"tenant database {database}", db_exists),
                (f"tenant role {role}", role_exists),
            )
            if not ok
        )
        raise StepError(
            f"{DRIFT}: {missing} not found on cnpg store {store.name} (binding: database "
            f"{database}, role {role}); refusing to proceed"
        )
    if refusal:
        raise StepError(f"source {refusal}; refusing to proceed")
    return direct
