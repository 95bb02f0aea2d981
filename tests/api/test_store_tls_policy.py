"""verify-full unless explicitly allowed (safeguard reshard-122), at every API edge, against the
real store clusters (5433/5434, certificates of the test CA).

- A store with ``sslmode``/``pooler_sslmode`` ``require`` or ``verify-ca`` is refused without
  ``tls_policy = allow-weaker`` and a ``tls_policy_reason`` (API 400 naming the field and the
  fix; the database refuses such a row too); with both it is accepted and listed as such.
- An external endpoint (a start's external target, a warehouse's external binding) gets a
  weaker mode only when an ``external`` store registered for its ``host:port`` opts in; without
  it the start is refused before anything connects there.
- The dry run shows the sslmode really used (an empty one: verify-full, never ``require``) and
  who allowed a weaker one with which reason.
"""

from __future__ import annotations

from typing import Any

import pytest
from django.db import IntegrityError, transaction

from duckgres_admin.models import MetadataStore
from tests.fixtures.api import error
from tests.fixtures.rows import new_store, unique
from tests.fixtures.start import Setup, external_target_body
from tests.fixtures.store_tls import PgWireStub

pytestmark = pytest.mark.safeguard("reshard-122")

STORE = {
    "kind": "external",
    "host": "127.0.0.1",
    "port": 5434,
    "provisioner_user": "provisioner",
    "provisioner_password_ref": "env:DUCKGRES_TEST_PROVISIONER_PASSWORD",
}
REASON = "the vendor's certificate names no host (ticket OPS-17)"


def _post_store(clients: Any, **body: Any) -> Any:
    return clients.internal.post(
        "/api/v1/metadata-stores", {**STORE, "name": unique("tls"), **body}, format="json"
    )


@pytest.mark.parametrize("mode", ["require", "verify-ca"])
@pytest.mark.parametrize("key", ["sslmode", "pooler_sslmode"])
def test_a_weaker_store_sslmode_needs_the_explicit_opt_in(
    clients: Any, key: str, mode: str
) -> None:
    extra = {"pooler_host": "127.0.0.1", "pooler_port": 5434} if key == "pooler_sslmode" else {}
    refused = _post_store(clients, **extra, **{key: mode})
    assert refused.status_code == 400
    assert error(refused).startswith(f"invalid body: {key}: sslmode {mode} does not check")
    assert "set tls_policy allow-weaker and a tls_policy_reason on store" in error(refused)
    assert error(refused).endswith("or use sslmode verify-full")
    no_reason = _post_store(clients, **extra, **{key: mode}, tls_policy="allow-weaker")
    assert no_reason.status_code == 400
    assert error(no_reason).startswith(
        "invalid body: tls_policy_reason: required with tls_policy allow-weaker"
    )
    ok = _post_store(
        clients, **extra, **{key: mode}, tls_policy="allow-weaker", tls_policy_reason=REASON
    )
    assert ok.status_code == 201, ok.content
    body = ok.json()
    assert (body[key], body["tls_policy"], body["tls_policy_reason"]) == (
        mode,
        "allow-weaker",
        REASON,
    )
    # Taking the opt-in away while the weaker mode stays is refused the same way.
    back = clients.internal.patch(
        f"/api/v1/metadata-stores/{body['name']}", {"tls_policy": "verify-full"}, format="json"
    )
    assert back.status_code == 400
    assert "tls_policy allow-weaker" in error(back)
    assert MetadataStore.objects.get(name=body["name"]).tls_policy == "allow-weaker"


def test_verify_full_is_the_default_and_needs_no_opt_in(clients: Any) -> None:
    response = _post_store(clients)
    assert response.status_code == 201, response.content
    assert (response.json()["sslmode"], response.json()["tls_policy"]) == (
        "verify-full",
        "verify-full",
    )
    unknown = _post_store(clients, tls_policy="sometimes")
    assert unknown.status_code == 400
    assert error(unknown).startswith("invalid body: tls_policy: must be one of")


def test_the_database_refuses_a_weaker_store_without_the_opt_in(db: None) -> None:
    """Whatever writes the row (a shell, a future code path): the constraints hold."""
    for fields, constraint in (
        ({"sslmode": "require"}, "metadata_store_tls_weaker_opt_in"),
        ({"pooler_host": "p", "pooler_sslmode": "verify-ca"}, "metadata_store_tls_weaker_opt_in"),
        ({"sslmode": "require", "tls_policy": "allow-weaker"}, "metadata_store_tls_reason"),
    ):
        with pytest.raises(IntegrityError, match=constraint), transaction.atomic():
            MetadataStore.objects.create(
                name=unique("raw"), kind="external", host="h", port=5432, **fields
            )
    MetadataStore.objects.create(
        name=unique("raw"), kind="external", host="h", port=5432, sslmode="require",
        tls_policy="allow-weaker", tls_policy_reason=REASON,
    )  # fmt: skip


def test_an_external_target_with_require_is_refused_before_anything_connects(
    clients: Any, published: Any, cnpg_source: Setup, tenant_catalog: Any
) -> None:
    """No registered opt-in for the target's host:port: 400 naming target.sslmode and how to
    opt in; the endpoint (a listener here) never sees a connection."""
    ext = tenant_catalog(cnpg_source.clusters.target, with_tables=False)
    with PgWireStub() as listener:
        body = external_target_body(ext, endpoint=f"127.0.0.1:{listener.port}", sslmode="require")
        for dry_run in (False, True):
            response = clients.internal.post(
                cnpg_source.path, {**body, "dry_run": dry_run}, format="json"
            )
            if dry_run:
                entry = {e["check"]: e for e in response.json()["preflight"]}["target_valid"]
                assert not entry["ok"]
                text = entry["detail"]
            else:
                assert response.status_code == 400
                text = error(response)
            assert text.startswith("target.sslmode: sslmode require does not check")
            assert (
                f"register 127.0.0.1:{listener.port} as an external metadata store (kind "
                f"external, host 127.0.0.1, port {listener.port}) with tls_policy allow-weaker "
                "and a tls_policy_reason"
            ) in text
        assert listener.connections == 0
    assert published.messages == []


def test_with_a_registered_opt_in_the_dry_run_shows_the_weaker_mode_and_who_allowed_it(
    clients: Any, cnpg_source: Setup, tenant_catalog: Any, settings: Any
) -> None:
    ext = tenant_catalog(cnpg_source.clusters.target, with_tables=False)
    store = new_store(
        ext.cluster, name=unique("ext"), kind="external", sslmode="require",
        tls_policy="allow-weaker", tls_policy_reason=REASON,
    )  # fmt: skip
    response = clients.internal.post(
        cnpg_source.path, {**external_target_body(ext, sslmode="require"), "dry_run": True},
        format="json",
    )  # fmt: skip
    assert response.status_code == 200, response.content
    body = response.json()
    assert all(e["ok"] for e in body["preflight"]), body["preflight"]
    target = body["target"]
    assert target["sslmode"] == "require"
    assert target["tls"] == {
        "sslmode": "require",
        "configured_sslmode": "require",
        "weaker_than_verify_full": True,
        "weaker_allowed_explicitly": True,
        "weaker_allowed_by": f"store {store.name} (external) tls_policy allow-weaker: {REASON}",
        "channel_binding": "require",
        "require_auth": "scram-sha-256",
    }
    # The cnpg source: verify-full, no opt-in needed, none shown.
    assert body["source"]["sslmode"] == "verify-full"
    assert body["source"]["tls"]["weaker_allowed_by"] is None
    # A system trust store makes libpq verify-full whatever is configured: shown as used.
    settings.DUCKGRES_STORE_SSLROOTCERT = "system"
    shown = clients.internal.post(
        cnpg_source.path, {**external_target_body(ext, sslmode="require"), "dry_run": True},
        format="json",
    ).json()["target"]  # fmt: skip
    assert (shown["sslmode"], shown["tls"]["configured_sslmode"]) == ("verify-full", "require")
    assert shown["tls"]["weaker_than_verify_full"] is False


def test_the_dry_run_shows_verify_full_for_an_external_binding_without_an_sslmode(
    clients: Any, external_source: Setup
) -> None:
    """It used to say "require" while the connections used verify-full (issue item 8)."""
    external_source.warehouse.metadata_store_sslmode = ""
    external_source.warehouse.save(update_fields=["metadata_store_sslmode"])
    body = clients.internal.post(
        external_source.path,
        {"target": {"type": "cnpg", "cnpg_shard": external_source.target_store.name,
                    "password_secret_ref": external_source.catalog.password_ref},
         "dry_run": True},
        format="json",
    ).json()  # fmt: skip
    assert body["source"]["sslmode"] == "verify-full"
    assert body["source"]["tls"]["configured_sslmode"] == ""
    assert body["source"]["tls"]["sslmode"] == "verify-full"


def test_a_legacy_external_binding_with_require_is_refused_at_start(
    clients: Any, published: Any, external_source: Setup
) -> None:
    """A binding written before the opt-in existed: the start refuses it (source_binding) and
    says how to fix it; with the opt-in registered the same start passes that check."""
    wh = external_source.warehouse
    wh.metadata_store_sslmode = "require"
    wh.save(update_fields=["metadata_store_sslmode"])
    start = {
        "target": {"type": "cnpg", "cnpg_shard": external_source.target_store.name,
                   "password_secret_ref": external_source.catalog.password_ref},
    }  # fmt: skip
    response = clients.internal.post(external_source.path, start, format="json")
    assert response.status_code == 400
    assert error(response).startswith("metadata_store_sslmode: sslmode require does not check")
    assert published.messages == []
    new_store(
        external_source.catalog.cluster, name=unique("ext"), kind="external", sslmode="require",
        tls_policy="allow-weaker", tls_policy_reason=REASON,
    )  # fmt: skip
    body = clients.internal.post(external_source.path, {**start, "dry_run": True}, format="json")
    entries = {e["check"]: e for e in body.json()["preflight"]}
    assert entries["source_binding"]["ok"], entries["source_binding"]
    assert body.json()["source"]["tls"]["weaker_allowed_explicitly"] is True


def test_an_external_binding_write_needs_the_opt_in(clients: Any, store_clusters: Any) -> None:
    cluster = store_clusters.source
    binding = {
        "org_id": unique("org"),
        "metadata_store_kind": "external",
        "metadata_store_host": cluster.host,
        "metadata_store_port": cluster.port,
        "metadata_store_sslmode": "verify-ca",
        "metadata_store_database": "nope",
        "metadata_store_user": "nope",
        "metadata_store_password_ref": "env:ACME_PW",
    }
    response = clients.internal.post("/api/v1/warehouses", binding, format="json")
    assert response.status_code == 400
    assert error(response).startswith(
        "invalid body: metadata_store_sslmode: sslmode verify-ca does not check the server's "
        "host name"
    )
    assert f"register {cluster.host}:{cluster.port} as an external metadata store" in error(
        response
    )
    new_store(
        cluster, name=unique("ext"), kind="external", sslmode="verify-ca",
        tls_policy="allow-weaker", tls_policy_reason=REASON,
    )  # fmt: skip
    response = clients.internal.post("/api/v1/warehouses", binding, format="json")
    assert response.status_code == 201, response.content
    assert response.json()["metadata_store_sslmode"] == "verify-ca"
