"""``POST /warehouses/<org>/reshards`` (spec §5.1): every refusal creates nothing."""

from __future__ import annotations

import json
import secrets
from typing import Any

import pytest
from psycopg import sql

from duckgres_admin.models import AuditRecord, ReshardLogEntry, ReshardOperation
from reshard.kinds import checks
from reshard.start import operations, stash
from tests.fixtures.api import error
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique
from tests.fixtures.start import assert_nothing_created, external_target_body

# --- step 1: the body ----------------------------------------------------------------------


@pytest.mark.safeguard("reshard-51")
@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({}, "invalid body: target: required"),
        ({"target": {"type": "cnpg"}, "extra": 1}, "invalid body: extra: unknown field"),
        ({"target": {"type": "cnpg", "shard": "x"}}, "invalid body: target.shard: unknown field"),
        ({"target": "cnpg"}, "invalid body: target: must be a JSON object"),
        ({"target": {}}, "invalid body: target.type: required"),
        ({"target": {"type": 1}}, "invalid body: target.type: must be a string"),
        (
            {"target": {"type": "cnpg"}, "drain_timeout_seconds": 86401},
            "invalid body: drain_timeout_seconds: must be <= 86400",
        ),
        (
            {"target": {"type": "cnpg"}, "cutover_timeout_seconds": "1"},
            "invalid body: cutover_timeout_seconds: must be an integer",
        ),
        (
            {"target": {"type": "cnpg"}, "dry_run": "yes"},
            "invalid body: dry_run: must be a boolean",
        ),
    ],
)
def test_malformed_body(clients, published, body, message):
    response = clients.internal.post("/api/v1/warehouses/any/reshards", body, format="json")
    assert response.status_code == 400
    assert error(response) == message
    assert_nothing_created(published)


@pytest.mark.safeguard("reshard-51")
def test_invalid_body_never_echoes_the_password(clients, published):
    password = secrets.token_urlsafe(30)
    for target in (
        {"type": "external", "user": [password]},
        {"type": "external", "password": {"value": password}},
        {"type": "external", "endpoint": 5432, "password": password},
    ):
        response = clients.internal.post(
            "/api/v1/warehouses/any/reshards", {"target": target}, format="json"
        )
        assert response.status_code == 400
        assert error(response).startswith("invalid body: target.")
        assert password not in response.content.decode()
    rows = AuditRecord.objects.all()
    assert rows.count() == 3
    assert all(password not in r.detail for r in rows)
    assert_nothing_created(published)


def test_malformed_json(clients, published):
    response = clients.internal.post(
        "/api/v1/warehouses/any/reshards", "{nope", content_type="application/json"
    )
    assert response.status_code == 400
    assert error(response) == "invalid body: body: malformed JSON"
    assert_nothing_created(published)


# --- steps 2 and 3: warehouse and source ----------------------------------------------------


def test_unknown_org_is_404(clients, published):
    response = clients.internal.post(
        "/api/v1/warehouses/nobody/reshards", {"target": {"type": "cnpg"}}, format="json"
    )
    assert response.status_code == 404
    assert error(response) == "org has no managed warehouse"
    assert_nothing_created(published)


def test_warehouse_not_ready_is_409(clients, published):
    new_warehouse(org_id="busy", state="provisioning")
    response = clients.internal.post(
        "/api/v1/warehouses/busy/reshards", {"target": {"type": "cnpg"}}, format="json"
    )
    assert response.status_code == 409
    assert error(response) == (
        "warehouse must be in ready state to reshard (currently provisioning)"
    )
    assert_nothing_created(published)


def test_incomplete_identity_is_400(clients, published):
    new_warehouse(org_id="blank")
    response = clients.internal.post(
        "/api/v1/warehouses/blank/reshards", {"target": {"type": "cnpg"}}, format="json"
    )
    assert response.status_code == 400
    assert error(response).startswith("the org's metadata-store identity is incomplete")
    assert_nothing_created(published)


def test_binding_drift_is_400(clients, published):
    store = new_store(name="drifted", kind="external")
    new_warehouse(
        org_id="drift",
        store=store,
        metadata_store_kind="cnpg",
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    response = clients.internal.post(
        "/api/v1/warehouses/drift/reshards",
        {"target": {"type": "cnpg", "cnpg_shard": "x"}},
        format="json",
    )
    assert response.status_code == 400
    assert error(response).startswith(
        "metadata-store identity drift: the binding says cnpg store drifted but drifted is "
        "registered as external"
    )
    assert_nothing_created(published)


# --- step 4: cnpg targets -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ({"type": "cnpg", "cnpg_shard": "Bad_Name"}, "target.cnpg_shard must match"),
        ({"type": "cnpg", "cnpg_shard": "no-such-store"}, "target store no-such-store is not"),
        ({"type": "cnpg", "cnpg_shard": "{src}"}, "target shard equals the org's current shard"),
        (
            {"type": "cnpg", "cnpg_shard": "{tgt}", "database": "other"},
            "the tenant identity is kept for cnpg→cnpg",
        ),
        ({"type": "mystery"}, "target.type must be cnpg or external"),
    ],
)
def test_cnpg_target_refusals(clients, published, cnpg_source, target, message):
    target = {
        k: v.format(src=cnpg_source.source_store.name, tgt=cnpg_source.target_store.name)
        for k, v in target.items()
    }
    response = clients.internal.post(cnpg_source.path, {"target": target}, format="json")
    assert response.status_code == 400
    assert message in error(response)
    assert_nothing_created(published)


@pytest.mark.safeguard("reshard-14")
def test_stopped_target_is_503_destination_shard_unavailable(clients, published, cnpg_source):
    down = new_store(
        name=unique("down"),
        host="127.0.0.1",
        port=1,
        sslmode="require",
        provisioner_user="provisioner",
        provisioner_password_ref="env:DUCKGRES_TEST_PROVISIONER_PASSWORD",
    )
    response = clients.internal.post(
        cnpg_source.path, {"target": {"type": "cnpg", "cnpg_shard": down.name}}, format="json"
    )
    assert response.status_code == 503
    body = response.json()
    assert body["code"] == "destination_shard_unavailable"
    assert body["error"].startswith(
        f"destination shard {down.name} is not accepting PostgreSQL connections: "
    )
    assert_nothing_created(published)


@pytest.mark.safeguard("reshard-14")
def test_wrong_provisioner_password_is_503(clients, published, cnpg_source, monkeypatch):
    monkeypatch.setenv("DUCKGRES_TEST_WRONG_PROVISIONER_PW", "not-the-provisioner-password")
    bad = new_store(
        cnpg_source.clusters.target,
        name=unique("badpw"),
        provisioner_password_ref="env:DUCKGRES_TEST_WRONG_PROVISIONER_PW",
    )
    response = clients.internal.post(
        cnpg_source.path, {"target": {"type": "cnpg", "cnpg_shard": bad.name}}, format="json"
    )
    assert response.status_code == 503
    assert response.json()["code"] == "destination_shard_unavailable"
    assert "not-the-provisioner-password" not in response.content.decode()
    assert_nothing_created(published)


@pytest.mark.safeguard("reshard-46")
def test_target_that_is_the_source_server_under_an_alias_is_400(clients, published, cnpg_source):
    source = cnpg_source.clusters.source
    alias = new_store(source, name=unique("alias"), host="localhost")
    response = clients.internal.post(
        cnpg_source.path, {"target": {"type": "cnpg", "cnpg_shard": alias.name}}, format="json"
    )
    assert response.status_code == 400
    assert error(response) == "target is the same PostgreSQL database as the source"
    assert_nothing_created(published)


@pytest.mark.safeguard("reshard-44")
def test_cnpg_target_bound_to_another_warehouse_is_400(clients, published, cnpg_source):
    new_warehouse(
        org_id="neighbour",
        store=cnpg_source.target_store,
        metadata_store_database=cnpg_source.catalog.database,
        metadata_store_user="someone",
        metadata_store_password_ref="env:X",
    )
    response = clients.internal.post(
        cnpg_source.path,
        {"target": {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}},
        format="json",
    )
    assert response.status_code == 400
    assert error(response) == (
        f"target database {cnpg_source.catalog.database} on {cnpg_source.target_store.name} "
        "is the catalog of another warehouse (neighbour)"
    )
    assert_nothing_created(published)


def test_cnpg_target_database_owned_by_someone_else_is_400(clients, published, cnpg_source):
    target = cnpg_source.clusters.target
    db = sql.Identifier(cnpg_source.catalog.database)
    with target.superuser_conn() as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(db))
    try:
        response = clients.internal.post(
            cnpg_source.path,
            {"target": {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}},
            format="json",
        )
    finally:
        with target.superuser_conn() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(db))
    assert response.status_code == 400
    assert error(response) == (
        f"target database {cnpg_source.catalog.database} on store "
        f"{cnpg_source.target_store.name} already exists and is owned by postgres, not the "
        f"tenant role {cnpg_source.catalog.role} — refusing to adopt it"
    )
    assert_nothing_created(published)


@pytest.mark.safeguard("reshard-44")
def test_cnpg_to_cnpg_is_accepted(transactional_db, clients, published, cnpg_source):
    # A deleted warehouse's database on the target does not block (§4.18 check 2).
    new_warehouse(
        org_id=unique("gone"),
        state="deleted",
        store=cnpg_source.target_store,
        metadata_store_database=cnpg_source.catalog.database,
        metadata_store_user="someone",
        metadata_store_password_ref="env:X",
    )
    response = clients.admin.post(
        cnpg_source.path,
        {
            "target": {"type": "cnpg", "cnpg_shard": f" {cnpg_source.target_store.name} "},
            "drain_timeout_seconds": 0,
            "cutover_timeout_seconds": -5,
        },
        format="json",
    )
    assert response.status_code == 202, response.content
    body = response.json()
    op = ReshardOperation.objects.get()
    assert body["id"] == op.id
    assert body["state"] == "pending"
    assert body["launcher"] == "local"
    assert body["created_by"] == "admin@example.com"
    assert body["source_kind"] == "cnpg"
    assert body["from_shard"] == cnpg_source.source_store.name
    assert body["to_shard"] == cnpg_source.target_store.name
    assert body["target_user"] == cnpg_source.catalog.role
    assert body["target_database"] == cnpg_source.catalog.database
    assert body["drain_timeout_seconds"] == 1800
    assert body["cutover_timeout_seconds"] == 0
    assert body["password_url"] == ""
    assert body["created_at"].endswith("Z")
    assert body["started_at"] is None
    assert "password" not in body
    assert [(m["headers"]["task"], m["body"][0]) for m in published.messages] == [
        ("reshard.launch_runner", [op.id])
    ]
    assert stash.held_ids() == []
    line = ReshardLogEntry.objects.get(operation_id=op.id)
    assert line.message == (
        f"operation created by admin@example.com: org {cnpg_source.org}: cnpg "
        f"{cnpg_source.source_store.name} → cnpg {cnpg_source.target_store.name} (offline copy); "
        "runner launch "
        f"queued for duckgres-reshard-op-{op.id}"
    )
    audit = AuditRecord.objects.get(action="reshard.create")
    assert audit.status == 202
    assert audit.org_id == cnpg_source.org
    assert audit.detail == (
        f"reshard org {cnpg_source.org}: cnpg {cnpg_source.source_store.name} → cnpg "
        f"{cnpg_source.target_store.name} (offline copy)"
    )

    # Step 7: a second start while this one is active is 409 and creates nothing more.
    published.messages.clear()
    response = clients.internal.post(
        cnpg_source.path,
        {"target": {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}},
        format="json",
    )
    assert response.status_code == 409
    assert error(response) == "org already has an active reshard operation"
    assert ReshardOperation.objects.count() == 1
    assert published.messages == []


def test_external_to_cnpg_requires_a_resolvable_ref(clients, published, external_source):
    path = external_source.path
    store = external_source.target_store.name
    response = clients.internal.post(
        path, {"target": {"type": "cnpg", "cnpg_shard": store}}, format="json"
    )
    assert response.status_code == 400
    assert error(response) == "target.password_secret_ref is required for external→cnpg"
    response = clients.internal.post(
        path,
        {
            "target": {
                "type": "cnpg",
                "cnpg_shard": store,
                "password_secret_ref": "env:DUCKGRES_TEST_NOT_SET_ANYWHERE",
            }
        },
        format="json",
    )
    assert response.status_code == 400
    assert "env:DUCKGRES_TEST_NOT_SET_ANYWHERE" in error(response)
    assert_nothing_created(published)


def test_external_to_cnpg_is_accepted(transactional_db, clients, published, external_source):
    catalog = external_source.catalog
    response = clients.internal.post(
        external_source.path,
        {
            "target": {
                "type": "cnpg",
                "cnpg_shard": external_source.target_store.name,
                "password_secret_ref": catalog.password_ref,
            }
        },
        format="json",
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["source_kind"] == "external"
    assert body["source_endpoint"] == "127.0.0.1"
    assert body["source_port"] == 5433
    assert body["target_user"] == catalog.database  # defaults to the warehouse database_name
    assert body["target_database"] == catalog.database
    assert body["created_by"] == "internal-secret"
    assert len(published.messages) == 1


# --- step 5: external targets ---------------------------------------------------------------


@pytest.mark.safeguard("reshard-44")
@pytest.mark.parametrize("missing", ["endpoint", "user", "database", "password_secret_ref"])
def test_external_target_requires_every_field(clients, published, cnpg_source, missing):
    body = external_target_body(cnpg_source.catalog, **{missing: None})
    response = clients.internal.post(cnpg_source.path, body, format="json")
    assert response.status_code == 400
    assert error(response) == (
        "external target requires endpoint, user, database and password_secret_ref"
    )
    assert_nothing_created(published)


@pytest.mark.safeguard("reshard-8")
def test_external_target_password_checks(clients, published, cnpg_source, monkeypatch):
    catalog = cnpg_source.catalog
    monkeypatch.setenv("DUCKGRES_TEST_JSON_PW", json.dumps({"password": "p"}))
    monkeypatch.setenv("DUCKGRES_TEST_OTHER_PW", "something-else-entirely")
    cases = [
        ({"endpoint": "host:99999"}, "target.endpoint port must be 1..65535"),
        ({"endpoint": "a b"}, "target.endpoint must be host[:port]"),
        ({"sslmode": "disable"}, "target.sslmode must be one of require, verify-ca, verify-full"),
        ({"password": ""}, "target.password is required for external targets"),
        ({"password_secret_ref": "nope"}, "target.password_secret_ref must be a secret reference"),
        (
            {"password_secret_ref": "env:DUCKGRES_TEST_UNSET_VAR"},
            "cannot resolve target.password_secret_ref env:DUCKGRES_TEST_UNSET_VAR",
        ),
        (
            {"password_secret_ref": "env:DUCKGRES_TEST_JSON_PW"},
            "the secret value must be the raw password, not JSON",
        ),
        (
            {"password_secret_ref": "env:DUCKGRES_TEST_OTHER_PW"},
            "the password stored in env:DUCKGRES_TEST_OTHER_PW does not match target.password",
        ),
    ]
    for override, message in cases:
        response = clients.internal.post(
            cnpg_source.path, external_target_body(catalog, **override), format="json"
        )
        assert response.status_code == 400, override
        assert message in error(response), (override, error(response))
        assert catalog.password not in response.content.decode()
    assert_nothing_created(published)


def test_external_to_external_is_refused(clients, published, external_source):
    response = clients.internal.post(
        external_source.path, external_target_body(external_source.catalog), format="json"
    )
    assert response.status_code == 400
    assert error(response) == "external → external is not supported"
    assert_nothing_created(published)


@pytest.mark.safeguard("reshard-51")
def test_external_probe_failure_is_scrubbed(clients, published, cnpg_source, tenant_catalog):
    """A psycopg error naming the password (a database named after it) reaches the API as ***."""
    target = tenant_catalog(cnpg_source.clusters.target)
    body = external_target_body(target, database=target.password)
    response = clients.internal.post(cnpg_source.path, body, format="json")
    assert response.status_code == 400
    text = error(response)
    assert text.startswith(
        f"cannot connect to the external target 127.0.0.1:5434/*** as {target.role} with the "
        "provided password: "
    )
    assert target.password not in response.content.decode()
    assert_nothing_created(published)
    audit = AuditRecord.objects.get()
    assert target.password not in audit.detail


@pytest.mark.safeguard("reshard-44")
def test_external_target_bound_to_another_warehouse_is_400(
    clients, published, cnpg_source, tenant_catalog
):
    target = tenant_catalog(cnpg_source.clusters.target)
    new_warehouse(org_id="other-ext", catalog=target, metadata_store_kind="external")
    response = clients.internal.post(cnpg_source.path, external_target_body(target), format="json")
    assert response.status_code == 400
    assert error(response) == (
        f"target database {target.database} on 127.0.0.1:5434 is the catalog of another "
        "warehouse (other-ext)"
    )
    assert_nothing_created(published)


@pytest.mark.safeguard("reshard-37")
@pytest.mark.safeguard("reshard-7")
def test_cnpg_to_external_is_accepted_with_password_url_and_stash(
    transactional_db, clients, published, cnpg_source, tenant_catalog
):
    target = tenant_catalog(cnpg_source.clusters.target, with_tables=False)
    response = clients.internal.post(cnpg_source.path, external_target_body(target), format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    op = ReshardOperation.objects.get()
    assert body["target_kind"] == "external"
    assert (body["target_endpoint"], body["target_port"]) == ("127.0.0.1", 5434)
    assert body["target_sslmode"] == "verify-full"  # the default when none is given
    assert body["password_url"] == f"http://127.0.0.1:8080/api/v1/reshards/{op.id}/password"
    assert op.password_url == body["password_url"]
    assert stash.get(op.id) == target.password
    assert target.password not in response.content.decode()
    assert [m["body"][0] for m in published.messages] == [[op.id]]
    for message in published.messages:
        assert target.password not in json.dumps(message["body"], default=str)


def test_enqueue_failure_is_502_and_fails_the_op(
    transactional_db, clients, published, cnpg_source, tenant_catalog, monkeypatch
):
    target = tenant_catalog(cnpg_source.clusters.target, with_tables=False)

    def broken(op_id: int) -> None:
        raise ConnectionError(f"broker unreachable (password {target.password})")

    monkeypatch.setattr(operations, "_send_launch", broken)
    response = clients.internal.post(cnpg_source.path, external_target_body(target), format="json")
    assert response.status_code == 502
    assert error(response).startswith("could not enqueue the runner launch: broker unreachable")
    assert target.password not in response.content.decode()
    op = ReshardOperation.objects.get()
    assert op.state == "failed"
    assert op.finished_at is not None
    assert op.error == "could not enqueue the runner launch: broker unreachable (password ***)"
    assert stash.held_ids() == []
    line = ReshardLogEntry.objects.get(operation_id=op.id, level="error")
    assert line.message == op.error


def test_start_after_a_terminal_op_is_allowed(transactional_db, clients, cnpg_source):
    new_op(cnpg_source.warehouse, to_store=cnpg_source.target_store, state="failed")
    response = clients.internal.post(
        cnpg_source.path,
        {"target": {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}},
        format="json",
    )
    assert response.status_code == 202, response.content


def test_dry_run_is_audited_as_a_dry_run(clients, published, cnpg_source):
    """A dry run used to write no audit row (the "hostile inputs" issue, item 2): it is audited
    now, as reshard.dry_run, and still creates nothing."""
    response = clients.internal.post(
        cnpg_source.path,
        {"target": {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 200
    [audit] = AuditRecord.objects.all()
    assert (audit.action, audit.status, audit.org_id) == ("reshard.dry_run", 200, cnpg_source.org)
    assert audit.detail.startswith(
        f"dry run org {cnpg_source.org}: cnpg {cnpg_source.source_store.name} → cnpg "
        f"{cnpg_source.target_store.name}: "
    )
    assert_nothing_created(published)


def test_trino_enabled_is_409(clients, published):
    from duckgres_admin.models import WarehouseTrino

    warehouse = new_warehouse(org_id="trino-on")
    WarehouseTrino.objects.create(warehouse=warehouse, enabled=True)
    response = clients.internal.post(
        "/api/v1/warehouses/trino-on/reshards", {"target": {"type": "cnpg"}}, format="json"
    )
    assert response.status_code == 409
    assert response.json() == {
        "code": "trino_enabled",
        "error": "disable Trino for this warehouse before resharding (Trino catalogs do not "
        "take part in the drain yet)",
    }
    assert_nothing_created(published)


@pytest.mark.safeguard("reshard-51")
def test_psycopg_sees_the_password_only_as_its_own_argument(
    clients, published, cnpg_source, tenant_catalog, monkeypatch
):
    import psycopg

    target = tenant_catalog(cnpg_source.clusters.target, with_tables=False)
    real_connect = psycopg.connect
    calls: list[tuple[tuple[Any, ...], dict[str, Any]]] = []

    def recording_connect(*args: Any, **kwargs: Any) -> Any:
        calls.append((args, dict(kwargs)))
        return real_connect(*args, **kwargs)

    monkeypatch.setattr(psycopg, "connect", recording_connect)
    # A stale epoch-free shape: the start stops at the insert (an active op exists).
    new_op(cnpg_source.warehouse, to_store=cnpg_source.target_store)
    response = clients.internal.post(cnpg_source.path, external_target_body(target), format="json")
    assert response.status_code == 409
    assert calls
    with_password = [kw for _, kw in calls if kw.get("password") == target.password]
    assert with_password, "the external target probe must pass the password"
    for args, kwargs in calls:
        assert all(target.password not in str(a) for a in args)
        for key, value in kwargs.items():
            if key != "password":
                assert target.password not in str(value), key


def test_pod_launcher_image_failure_fails_the_op(
    clients, published, cnpg_source, settings, monkeypatch
):
    """Step 9: the image cannot be read (no own pod here) → op failed, 500, nothing enqueued."""
    real_validate = checks.validate_start

    def validate_then_switch(*args: Any, **kwargs: Any) -> Any:
        plan = real_validate(*args, **kwargs)
        settings.DUCKGRES_RESHARD_LAUNCHER = "pod"  # env: refs resolved above with local
        return plan

    monkeypatch.setattr(checks, "validate_start", validate_then_switch)
    settings.POD_NAME = ""
    response = clients.internal.post(
        cnpg_source.path,
        {"target": {"type": "cnpg", "cnpg_shard": cnpg_source.target_store.name}},
        format="json",
    )
    assert response.status_code == 500
    assert error(response).startswith("could not record the runner image: ")
    op = ReshardOperation.objects.get()
    assert (op.launcher, op.state, op.runner_image) == ("pod", "failed", "")
    assert op.error == error(response)
    assert published.messages == []


def test_no_advertise_address_fails_the_op(
    clients, published, cnpg_source, tenant_catalog, settings, monkeypatch
):
    """Step 8: no own address → op failed "control plane could not determine…", 500."""
    target = tenant_catalog(cnpg_source.clusters.target, with_tables=False)
    real_validate = checks.validate_start

    def validate_then_switch(*args: Any, **kwargs: Any) -> Any:
        plan = real_validate(*args, **kwargs)
        settings.DUCKGRES_RESHARD_LAUNCHER = "pod"
        return plan

    monkeypatch.setattr(checks, "validate_start", validate_then_switch)
    monkeypatch.setattr(stash, "_first_global_unicast", lambda: "")
    settings.DUCKGRES_ADVERTISE_ADDRESS = ""
    settings.POD_IP = ""
    response = clients.internal.post(cnpg_source.path, external_target_body(target), format="json")
    assert response.status_code == 500
    assert error(response).startswith("control plane could not determine its own address")
    op = ReshardOperation.objects.get()
    assert (op.state, op.password_url) == ("failed", "")
    assert op.error == error(response)
    assert stash.held_ids() == []
    assert published.messages == []
