"""The start API's dry run (spec reshard §5.1 "Dry run", §6 ``pg_dump_client``).

Walks the start's whole preflight (``reshard.kinds.checks.CHECKS``: every check of start steps
2-6, the target identity checks included, the pg_dump client choice and a read of the source
catalog's size), then stops. Unlike the start, a failed check does not stop the others (a check
whose inputs are missing is reported ``not run: <reason>``). Nothing is created: no op row, no
stash entry, no op-log line, no audit record (the view skips it) and no Celery message. The
checks are the very ones the start walks, so an entry is ``ok`` exactly when the start would
pass it.

A failed entry's ``detail`` is the start's message followed by ``(start would answer <status>
[<code>])``; details pass through the scrubber (no password ever appears).

``source.tls`` / ``target.tls`` (``reshard.warehouses.store_tls.summary``) say what the connections
really use: the effective sslmode (never a default guessed here: an empty one is verify-full), the
configured one, whether a weaker mode is in effect and which store's ``tls_policy`` allowed it
with which reason, the channel binding and ``require_auth``. ``sslmode`` is that effective mode.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings

from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.models import MetadataStore, StoreKind, Warehouse
from reshard.engines import backup
from reshard.kinds import RESHARD, checks, online_kind
from reshard.kinds.checks import CnpgTarget, ExternalTarget, StartRequest
from reshard.operation import sequences
from reshard.warehouses import store_tls
from reshard.warehouses.vetting import hostport


def _source_json(warehouse: Warehouse, store: MetadataStore | None) -> dict[str, Any]:
    kind = warehouse.metadata_store_kind
    out: dict[str, Any] = {"kind": kind}
    if kind == StoreKind.CNPG:
        out["store"] = str(warehouse.metadata_store_id or "")
        if store is not None:
            out["tls"] = store_tls.summary(store.host, store.port, store.sslmode, store=store)
    else:
        port = warehouse.metadata_store_port or 5432
        host = warehouse.metadata_store_host
        out["endpoint"] = hostport(host, port) if host else ""
        out["tls"] = store_tls.summary(host, port, warehouse.metadata_store_sslmode)
    out["sslmode"] = _tls_mode(out)
    out.update(
        database=warehouse.metadata_store_database,
        user=warehouse.metadata_store_user,
        password_secret_ref=warehouse.metadata_store_password_ref,
    )
    return out


def _tls_mode(side: dict[str, Any]) -> str | None:
    """The sslmode a side's connections really use (None: unknown or refused)."""
    tls = side.get("tls")
    return str(tls["sslmode"]) if isinstance(tls, dict) and tls.get("sslmode") else None


def _target_json(
    request: StartRequest,
    cnpg: CnpgTarget | None,
    external: ExternalTarget | None,
) -> dict[str, Any]:
    t = request.target
    if cnpg is not None:
        store = cnpg.store
        tls = store_tls.summary(store.host, store.port, store.sslmode, store=store)
        return {
            "kind": StoreKind.CNPG.value,
            "store": store.name,
            "database": cnpg.database,
            "user": cnpg.user,
            "sslmode": tls["sslmode"],
            "tls": tls,
            "password_secret_ref": cnpg.ref,
        }
    if external is not None:
        tls = store_tls.summary(external.host, external.port, external.sslmode)
        return {
            "kind": StoreKind.EXTERNAL.value,
            "endpoint": external.label,
            "database": external.database,
            "user": external.user,
            "sslmode": tls["sslmode"],
            "tls": tls,
            "password_secret_ref": external.ref,
        }
    # Invalid target: echo the structure of what was asked, never the password.
    out: dict[str, Any] = {"kind": t.type}
    if t.type == StoreKind.CNPG:
        out["store"] = t.cnpg_shard.strip()
    else:
        out["endpoint"] = t.endpoint
    out.update(
        database=t.database,
        user=t.user,
        sslmode=t.sslmode,
        password_secret_ref=t.password_secret_ref,
    )
    return out


def _direction(source_kind: str, target_type: str) -> str | None:
    try:
        sequences.sequence(source_kind, target_type)
    except ValueError:
        return None
    return f"{source_kind}_to_{target_type}"


def dry_run(
    org_id: str, request: StartRequest, start: checks.KindStart = checks.SHARED_ONLY
) -> dict[str, Any]:
    """The §5.1 dry-run answer (200 body), the kind's rows (``start``) reported first. 404 when
    the org has no warehouse."""
    target = request.target
    with checks.Preflight.begin(org_id, request, process_scrubber(target.password)) as pf:
        entries = checks.report(pf, start)
        request = pf.request  # as the kind's rows refined it (an in-place restore's sibling)
        mode, reason = (
            checks.choose_copy_mode(pf)
            if start is checks.SHARED_ONLY
            else ("offline", "offline (a restore streams a backup: it has no online mode)")
        )
    direction = _direction(pf.source_kind, target.type)
    after_unblock = settings.DUCKGRES_RESHARD_ONLINE_BACKUP == "after_unblock"
    kind = online_kind(backup_after_unblock=after_unblock) if mode == "online" else RESHARD
    size = pf.catalog["database_size_bytes"]
    return {
        "dry_run": True,
        "direction": direction,
        "steps": list(kind.sequence(pf.source_kind, target.type)) if direction else [],
        "cancel_cutoff": (kind.cancel_cutoff(target.type).description if direction else None),
        "copy_mode": {
            "mode": mode,
            "reason": reason,
            "backup": (
                ("after_unblock" if after_unblock else "before_flip") if mode == "online" else None
            ),
        },
        "source": _source_json(pf.warehouse, pf.source_store),
        "target": _target_json(request, pf.cnpg, pf.external),
        "catalog": pf.catalog,
        "backup": {
            "part_size_bytes": (
                backup.part_size_for(size, int(settings.DUCKGRES_RESHARD_MAX_PARTS))
                if size is not None
                else None
            ),
            "mandatory": direction == "cnpg_to_external",
        },
        "preflight": entries,
    }


def _side_label(side: dict[str, Any]) -> str:
    kind = str(side.get("kind") or "<none>")
    if kind == StoreKind.CNPG:
        return f"cnpg {side.get('store') or '<none>'}"
    if kind == StoreKind.EXTERNAL:
        return f"external {side.get('endpoint') or '<none>'}"
    return kind


def describe(org_id: str, plan: dict[str, Any]) -> str:
    """The audit detail of a dry run: the move asked for and which checks failed (names only;
    the details may carry addresses the caller chose, never a password)."""
    entries = plan["preflight"]
    failed = [str(e["check"]) for e in entries if not e["ok"]]
    verdict = f"{len(entries) - len(failed)}/{len(entries)} checks ok"
    if failed:
        verdict += f", failed: {', '.join(failed)}"
    return (
        f"dry run org {org_id}: {_side_label(plan['source'])} → {_side_label(plan['target'])}: "
        f"{verdict}"
    )
