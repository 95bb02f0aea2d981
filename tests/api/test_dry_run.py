"""The start API's dry run (spec §5.1, safeguard 53) and the pg_dump client refusal (§6)."""

from __future__ import annotations

import stat
from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.models import AuditRecord, ReshardLogEntry, ReshardOperation
from reshard.engines import clients as pgclients
from reshard.operation import sequences
from reshard.start import stash
from tests.fixtures.api import error
from tests.fixtures.rows import new_op, new_store, unique
from tests.fixtures.start import Setup, external_target_body

MIB = 1 << 20


def assert_nothing(published: Any) -> None:
    assert ReshardOperation.objects.count() == 0
    assert stash.held_ids() == []
    # A dry run is audited (it resolves secrets and contacts stores for its caller; reshard-61),
    # as a dry run: never a reshard.create.
    assert {a.action for a in AuditRecord.objects.all()} <= {"reshard.dry_run"}
    assert ReshardLogEntry.objects.count() == 0
    assert published.messages == []


def by_check(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {e["check"]: e for e in body["preflight"]}


def dry(clients: Any, setup: Setup, target: dict[str, Any]) -> Any:
    return clients.internal.post(setup.path, {"target": target, "dry_run": True}, format="json")


@pytest.mark.safeguard("reshard-53")
def test_valid_cnpg_to_cnpg_dry_run_plans_and_creates_nothing(clients, published, cnpg_source):
    response = dry(
        clients, cnpg_source, {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert set(body) == {
        "dry_run",
        "direction",
        "steps",
        "cancel_cutoff",
        "source",
        "target",
        "catalog",
        "backup",
        "preflight",
        "copy_mode",
    }
    assert body["copy_mode"] == {
        "mode": "offline",
        "reason": "offline (DUCKGRES_RESHARD_COPY_MODE)",
        "backup": None,
    }
    assert body["dry_run"] is True
    assert body["direction"] == "cnpg_to_cnpg"
    assert body["steps"] == list(sequences.CNPG_TO_CNPG)
    assert body["cancel_cutoff"] == (
        "a reshard to a cnpg store can be cancelled until the target login is ready in the "
        "cutover (before copying)"
    )
    store = cnpg_source.source_store
    assert body["source"] == {
        "kind": "cnpg",
        "store": store.name,
        "sslmode": store.sslmode,  # what the connections use (reshard-122)
        "tls": {
            "sslmode": store.sslmode,
            "configured_sslmode": store.sslmode,
            "weaker_than_verify_full": store.sslmode != "verify-full",
            "weaker_allowed_explicitly": store.sslmode != "verify-full",
            "weaker_allowed_by": (
                None
                if store.sslmode == "verify-full"
                else f"store {store.name} (cnpg) tls_policy allow-weaker: {store.tls_policy_reason}"
            ),
            "channel_binding": "require",
            "require_auth": "scram-sha-256",
        },
        "database": cnpg_source.catalog.database,
        "user": cnpg_source.catalog.role,
        "password_secret_ref": cnpg_source.catalog.password_ref,
    }
    assert body["target"]["kind"] == "cnpg"
    assert body["target"]["store"] == cnpg_source.target_store.name
    catalog = body["catalog"]
    assert catalog["database_size_bytes"] > 0
    assert catalog["ducklake_tables"] == len(
        [t for t in cnpg_source.catalog.tables if t.startswith("ducklake_")]
    )
    assert catalog["rows_estimate"] is not None
    assert body["backup"] == {"part_size_bytes": 16 * MIB, "mandatory": False}
    checks = [e["check"] for e in body["preflight"]]
    assert checks == [
        "warehouse_ready",
        "trino_disabled",
        "source_binding",
        "target_valid",
        "target_probe",
        "not_source_database",
        "not_other_warehouse",
        "target_database_owner",
        "target_database_empty",
        "no_active_operation",
        "source_catalog",
        "pg_dump_client",
    ]
    assert all(e["ok"] for e in body["preflight"]), body["preflight"]
    assert cnpg_source.catalog.password not in response.content.decode()
    assert_nothing(published)


@pytest.mark.safeguard("reshard-53")
def test_valid_cnpg_to_external_dry_run(clients, published, cnpg_source, tenant_catalog):
    ext = tenant_catalog(cnpg_source.clusters.target, with_tables=False)
    response = clients.internal.post(
        cnpg_source.path, {**external_target_body(ext), "dry_run": True}, format="json"
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["direction"] == "cnpg_to_external"
    assert body["steps"] == list(sequences.CNPG_TO_EXTERNAL)
    assert body["backup"]["mandatory"] is True
    assert body["target"] == {
        "kind": "external",
        "endpoint": f"{ext.cluster.host}:{ext.cluster.port}",
        "database": ext.database,
        "user": ext.role,
        "sslmode": "verify-full",  # empty means verify-full (safeguard reshard-68)
        "tls": {
            "sslmode": "verify-full",
            "configured_sslmode": "verify-full",
            "weaker_than_verify_full": False,
            "weaker_allowed_explicitly": False,
            "weaker_allowed_by": None,
            "channel_binding": "require",
            "require_auth": "scram-sha-256",
        },
        "password_secret_ref": ext.password_ref,
    }
    checks = by_check(body)
    assert "target_password" in checks
    assert "target_database_owner" not in checks
    assert all(e["ok"] for e in body["preflight"]), body["preflight"]
    assert ext.password not in response.content.decode()
    assert_nothing(published)


@pytest.mark.safeguard("reshard-53")
def test_stopped_target_and_unresolvable_reference(clients, published, cnpg_source):
    """cnpg→external at a closed port with a reference that does not resolve: both entries
    fail with the start's messages; the other checks still run; nothing is created."""
    target = {
        "type": "external",
        "endpoint": "127.0.0.1:1",
        "user": "acme",
        "database": "acme",
        "password_secret_ref": "env:DUCKGRES_TEST_NO_SUCH_VARIABLE",
        "password": "s3cret-typed-by-the-operator",
    }
    response = dry(clients, cnpg_source, target)
    assert response.status_code == 200, response.content
    checks = by_check(response.json())
    assert checks["target_valid"]["ok"] is True
    assert checks["target_password"]["ok"] is False
    assert checks["target_password"]["detail"].startswith(
        "cannot resolve target.password_secret_ref env:DUCKGRES_TEST_NO_SUCH_VARIABLE"
    )
    assert "(start would answer 400)" in checks["target_password"]["detail"]
    assert checks["target_probe"]["ok"] is False
    assert checks["target_probe"]["detail"].startswith(
        "cannot connect to the external target 127.0.0.1:1/acme as acme with the provided "
        "password: "
    )
    assert checks["not_source_database"] == {
        "check": "not_source_database",
        "ok": False,
        "detail": "not run: the target is not reachable",
    }
    # Independent of the failures above.
    for name in ("warehouse_ready", "source_binding", "not_other_warehouse", "source_catalog"):
        assert checks[name]["ok"] is True, checks[name]
    assert "s3cret-typed-by-the-operator" not in response.content.decode()
    assert_nothing(published)

    # The start itself answers with the first of those messages.
    start = clients.internal.post(cnpg_source.path, {"target": target}, format="json")
    assert start.status_code == 400
    assert checks["target_password"]["detail"].startswith(error(start))


@pytest.mark.safeguard("reshard-53")
def test_stopped_cnpg_target_and_unresolvable_reference(clients, published, external_source):
    """external→cnpg: a store at a closed port (503 message) and an unresolvable tenant ref."""
    down = new_store(name=unique("down"), host="127.0.0.1", port=1)
    response = dry(
        clients,
        external_source,
        {
            "type": "cnpg",
            "cnpg_shard": down.name,
            "password_secret_ref": "env:DUCKGRES_TEST_NO_SUCH_VARIABLE",
        },
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["direction"] == "external_to_cnpg"
    assert body["steps"] == list(sequences.EXTERNAL_TO_CNPG)
    checks = by_check(body)
    assert checks["target_password"]["ok"] is False
    assert "cannot resolve target.password_secret_ref" in checks["target_password"]["detail"]
    assert checks["target_probe"]["ok"] is False
    assert checks["target_probe"]["detail"].startswith(
        f"destination shard {down.name} is not accepting PostgreSQL connections: "
    )
    assert checks["target_probe"]["detail"].endswith(
        "(start would answer 503 destination_shard_unavailable)"
    )
    assert checks["target_database_owner"]["detail"] == "not run: the target is not reachable"
    assert checks["source_catalog"]["ok"] is True
    assert_nothing(published)


def test_every_failing_check_reported(clients, published, cnpg_source):
    """Not ready + an active op + an unknown target type: each entry says why."""
    from duckgres_admin.models import Warehouse

    new_op(cnpg_source.warehouse, to_store=cnpg_source.target_store, state="running")
    Warehouse.objects.filter(org_id=cnpg_source.org).update(state="provisioning")
    response = dry(clients, cnpg_source, {"type": "mystery"})
    assert response.status_code == 200
    body = response.json()
    checks = by_check(body)
    assert checks["warehouse_ready"]["detail"].startswith(
        "warehouse must be in ready state to reshard (currently provisioning)"
    )
    assert checks["no_active_operation"]["detail"].startswith(
        "org already has an active reshard operation"
    )
    assert checks["target_valid"]["detail"].startswith("target.type must be cnpg or external")
    assert checks["target_probe"]["detail"] == "not run: the target is not valid"
    assert body["direction"] is None
    assert body["steps"] == []
    assert ReshardOperation.objects.count() == 1  # only the one made above
    assert list(AuditRecord.objects.values_list("action", flat=True)) == ["reshard.dry_run"]


def test_dry_run_malformed_body_and_missing_warehouse_answer_as_a_start(clients, published):
    response = clients.internal.post(
        "/api/v1/warehouses/nobody/reshards",
        {"target": {"type": "cnpg"}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 404
    assert error(response) == "org has no managed warehouse"
    response = clients.internal.post(
        "/api/v1/warehouses/nobody/reshards",
        {"target": {"type": "cnpg"}, "dry_run": "yes"},
        format="json",
    )
    assert response.status_code == 400
    assert error(response) == "invalid body: dry_run: must be a boolean"
    assert ReshardOperation.objects.count() == 0


@pytest.mark.safeguard("reshard-53")
def test_dry_run_on_other_routes_is_400(clients, published, cnpg_source):
    op = new_op(cnpg_source.warehouse, to_store=cnpg_source.target_store)
    expected = "invalid body: dry_run: accepted only on POST /api/v1/warehouses/<org>/reshards"
    calls = [
        ("post", f"/api/v1/reshards/{op.id}/cancel", {"dry_run": True}),
        ("post", "/api/v1/warehouses", {"org_id": unique("org"), "dry_run": True}),
        ("patch", f"/api/v1/warehouses/{cnpg_source.org}", {"dry_run": True}),
        ("post", "/api/v1/metadata-stores", {"name": unique("s"), "dry_run": True}),
        ("patch", f"/api/v1/metadata-stores/{cnpg_source.target_store.name}", {"dry_run": True}),
    ]
    for method, path, body in calls:
        response = getattr(clients.internal, method)(path, body, format="json")
        assert response.status_code == 400, (path, response.content)
        assert error(response) == expected, path
    response = clients.dataplane.post(
        f"/api/v1/warehouses/{cnpg_source.org}/leases",
        {"holder": "h", "purpose": "query", "dry_run": True},
        format="json",
    )
    assert response.status_code == 400
    assert error(response) == expected
    op.refresh_from_db()
    assert op.state == "pending"
    assert not op.cancel_requested


def _fake_bin_dir(tmp_path: Path, version: str) -> str:
    bin_dir = tmp_path / f"pg{version}" / "bin"
    bin_dir.mkdir(parents=True)
    for tool in ("pg_dump", "pg_restore"):
        script = bin_dir / tool
        script.write_text(f"#!/bin/sh\necho '{tool} (PostgreSQL) {version}'\n")
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(bin_dir)


@pytest.fixture
def old_clients_only(settings, tmp_path):
    settings.DUCKGRES_PG_BIN_DIRS = _fake_bin_dir(tmp_path, "14.0")
    pgclients.clear_cache()
    yield
    pgclients.clear_cache()


def test_no_pg_dump_for_the_source_major_refuses_the_start(
    clients, published, cnpg_source, old_clients_only
):
    with cnpg_source.clusters.source.superuser_conn() as conn:
        row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
    major = int(str(row[0])) // 10000
    target = {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}
    response = clients.internal.post(cnpg_source.path, {"target": target}, format="json")
    assert response.status_code == 400
    assert error(response) == f"no pg_dump for PostgreSQL {major} (have: 14)"
    assert ReshardOperation.objects.count() == 0
    assert stash.held_ids() == []
    assert published.messages == []

    AuditRecord.objects.all().delete()
    response = dry(clients, cnpg_source, target)
    assert response.status_code == 200
    checks = by_check(response.json())
    assert checks["pg_dump_client"] == {
        "check": "pg_dump_client",
        "ok": False,
        "detail": f"no pg_dump for PostgreSQL {major} (have: 14) (start would answer 400)",
    }
    assert_nothing(published)


def test_pg_dump_client_not_run_when_the_source_is_unreadable(clients, published, cnpg_source):
    from duckgres_admin.models import MetadataStore

    MetadataStore.objects.filter(name=cnpg_source.source_store.name).update(port=1)
    response = dry(
        clients, cnpg_source, {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}
    )
    assert response.status_code == 200
    body = response.json()
    checks = by_check(body)
    assert checks["source_catalog"]["ok"] is False
    assert checks["source_catalog"]["detail"].startswith("source catalog not reachable: ")
    assert checks["pg_dump_client"]["detail"] == (
        "not run: the source server version could not be read"
    )
    assert body["catalog"] == {
        "database_size_bytes": None,
        "ducklake_tables": None,
        "rows_estimate": None,
    }
    assert body["backup"]["part_size_bytes"] is None


def test_refused_dry_run_is_audited_as_a_dry_run(clients, published):
    """Dry runs used to be audited never, refused or not (the "hostile inputs" issue, item 2,
    changed that): a refused one is a reshard.dry_run row with the refusal."""
    response = clients.internal.post(
        "/api/v1/warehouses/nobody/reshards",
        {"target": {"type": "cnpg", "bogus": 1}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 400
    response = clients.internal.post(
        "/api/v1/warehouses/nobody/reshards",
        {"target": {"type": "cnpg"}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 404
    audits = list(AuditRecord.objects.order_by("id").values_list("action", "status", "detail"))
    assert audits == [
        ("reshard.dry_run", 400, "invalid body: target.bogus: unknown field"),
        ("reshard.dry_run", 404, "org has no managed warehouse"),
    ]


@pytest.mark.safeguard("reshard-53")
def test_valid_external_to_cnpg_dry_run(clients, published, external_source):
    s = external_source
    response = dry(
        clients,
        s,
        {
            "type": "cnpg",
            "cnpg_shard": s.target_store.name,
            "password_secret_ref": s.catalog.password_ref,
        },
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["direction"] == "external_to_cnpg"
    assert body["source"]["kind"] == "external"
    assert body["source"]["endpoint"] == f"{s.catalog.cluster.host}:{s.catalog.cluster.port}"
    assert body["target"]["user"] == s.warehouse.database_name
    assert body["catalog"]["ducklake_tables"] > 0
    assert [e["check"] for e in body["preflight"]][3:6] == [
        "target_valid",
        "target_password",
        "target_probe",
    ]
    assert all(e["ok"] for e in body["preflight"]), body["preflight"]
    assert_nothing(published)


@pytest.mark.safeguard("reshard-53")
def test_dry_run_agrees_with_the_start(transactional_db, clients, published, cnpg_source):
    """All ok → the start is accepted; then the dry run reports the active op with the very
    message the next start answers."""
    target = {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}
    assert all(e["ok"] for e in dry(clients, cnpg_source, target).json()["preflight"])
    assert ReshardOperation.objects.count() == 0
    start = clients.internal.post(cnpg_source.path, {"target": target}, format="json")
    assert start.status_code == 202, start.content
    checks = by_check(dry(clients, cnpg_source, target).json())
    failed = [name for name, entry in checks.items() if not entry["ok"]]
    assert failed == ["no_active_operation"]
    again = clients.internal.post(cnpg_source.path, {"target": target}, format="json")
    assert again.status_code == 409
    assert checks["no_active_operation"]["detail"].startswith(error(again))
    assert ReshardOperation.objects.count() == 1
