"""Secret references are a bounded capability (the "hostile inputs" issue, item 2).

A reference is accepted only inside the allowlist of its purpose (provisioner / tenant), the
control plane's own secrets never; dry runs are audited; endpoint and reference changes of a
store or a binding are audited old → new; store hosts never point at link-local or cloud
metadata addresses. Plus item 10's edge check: no store with ``sslmode=disable``.
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from collections.abc import Iterator
from typing import Any

import pytest

from duckgres_admin.lib import secretrefs
from duckgres_admin.models import AuditRecord, MetadataStore, ReshardOperation
from tests.fixtures.api import error
from tests.fixtures.rows import new_store, new_warehouse, unique
from tests.fixtures.settings_probe import start as start_process

STORE = {
    "kind": "cnpg",
    "host": "127.0.0.1",
    "port": 5434,
    "sslmode": "verify-full",
    "provisioner_user": "provisioner",
    "provisioner_password_ref": "env:DUCKGRES_TEST_PROVISIONER_PASSWORD",
}


class CountingServer:
    """A TCP listener standing in for a hostile "PostgreSQL server": it only counts who
    connects (anything that connects would be sent the startup packet, then a password)."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.connections += 1
            client.close()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.listener.close()


@pytest.fixture
def hostile_server() -> Iterator[CountingServer]:
    server = CountingServer()
    yield server
    server.close()


def _allow(settings: Any, purpose: str, raw: str) -> None:
    entries, problems = secretrefs.parse_allowlist("X", raw)
    assert not problems
    setattr(settings, secretrefs.ALLOW_SETTINGS[purpose], entries)


# --- the allowlist settings ---------------------------------------------------------------


@pytest.mark.safeguard("reshard-61")
def test_allowlist_entries_parse_strictly():
    entries, problems = secretrefs.parse_allowlist(
        "V", "k8s:tenants/acme-*, k8s:tenants/exact, k8s:shared/*, env:TENANT_*, env:ONE"
    )
    assert problems == []
    assert [str(e) for e in entries] == [
        "k8s:tenants/acme-*",
        "k8s:tenants/exact",
        "k8s:shared/*",
        "env:TENANT_*",
        "env:ONE",
    ]
    _, problems = secretrefs.parse_allowlist(
        "V",
        "env:*,k8s:Bad/x*,k8s:ns/a*b,env:DJANGO_SECRET_KEY,k8s:duckgres/duckgres-admin,"
        "env:PW_FILE,,k8s:ns/x#key,tenants/*",
    )
    assert problems == [
        "V: 'env:*' would allow every variable of the API process; list the variables "
        "(env:<NAME>) or a prefix of their own (env:<PREFIX>*)",
        *(
            f"V: {bad!r} is not an allowlist entry; write k8s:<namespace>/<secret>, "
            "k8s:<namespace>/<prefix>*, env:<VARIABLE> or env:<PREFIX>*, comma-separated"
            for bad in ("k8s:Bad/x*", "k8s:ns/a*b")
        ),
        "V: 'env:DJANGO_SECRET_KEY' is the control plane's own configuration, which is never "
        "allowed; remove the entry",
        "V: 'k8s:duckgres/duckgres-admin' is the control plane's own Secret, which is never "
        "allowed; remove the entry",
        "V: 'env:PW_FILE' is the control plane's own configuration, which is never allowed; "
        "remove the entry",
        "V: an entry is empty (remove the extra comma)",
        *(
            f"V: {bad!r} is not an allowlist entry; write k8s:<namespace>/<secret>, "
            "k8s:<namespace>/<prefix>*, env:<VARIABLE> or env:<PREFIX>*, comma-separated"
            for bad in ("k8s:ns/x#key", "tenants/*")
        ),
    ]


@pytest.mark.safeguard("reshard-138")
def test_an_entry_without_a_namespace_names_the_control_planes_own(monkeypatch):
    """The shipped ConfigMap spells no namespace: a kustomize overlay that moves the control
    plane moves its allowlists with it, through the pod's POD_NAMESPACE."""
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    entries, problems = secretrefs.parse_allowlist("V", "k8s:duckgres-store-*")
    assert problems == []
    assert [str(e) for e in entries] == ["k8s:ops/duckgres-store-*"]
    assert entries[0].matches(secretrefs.parse("k8s:ops/duckgres-store-a#password"))
    assert not entries[0].matches(secretrefs.parse("k8s:duckgres/duckgres-store-a#password"))
    # A runner pod lives in the runner namespace: its launcher names the control plane's.
    monkeypatch.setenv(secretrefs.CONTROL_NAMESPACE_VAR, "ops")
    monkeypatch.setenv("POD_NAMESPACE", "ops-runners")
    entries, _ = secretrefs.parse_allowlist("V", "k8s:duckgres-store-*")
    assert [str(e) for e in entries] == ["k8s:ops/duckgres-store-*"]
    monkeypatch.delenv(secretrefs.CONTROL_NAMESPACE_VAR)
    monkeypatch.setenv("POD_NAMESPACE", "ops")
    _, problems = secretrefs.parse_allowlist("V", "k8s:duckgres-admin")
    assert problems == [
        "V: 'k8s:duckgres-admin' is the control plane's own Secret, which is never allowed; "
        "remove the entry"
    ]
    monkeypatch.delenv("POD_NAMESPACE")
    _, problems = secretrefs.parse_allowlist("V", "k8s:duckgres-store-*")
    assert problems == [
        "V: 'k8s:duckgres-store-*' names no namespace, and this process has no POD_NAMESPACE to "
        "stand for it; write k8s:<namespace>/<secret>, k8s:<namespace>/<prefix>*, env:<VARIABLE> "
        "or env:<PREFIX>*, comma-separated"
    ]


@pytest.mark.safeguard("reshard-61")
def test_a_bad_allowlist_refuses_to_start_naming_the_variable():
    result = start_process({"DUCKGRES_SECRET_REF_ALLOW_TENANT": "env:*"})
    assert result.returncode != 0
    assert "DUCKGRES_SECRET_REF_ALLOW_TENANT: 'env:*' would allow every variable" in result.stderr
    result = start_process({"DUCKGRES_STORE_HOST_DENYLIST": "169.254.0.1/16"})
    assert result.returncode != 0
    assert "DUCKGRES_STORE_HOST_DENYLIST: '169.254.0.1/16' is not a network" in result.stderr


# --- the control plane's own secrets, whatever the allowlist says ---------------------------


@pytest.mark.safeguard("reshard-61")
@pytest.mark.parametrize(
    "ref",
    [
        "env:DJANGO_SECRET_KEY",
        "env:DUCKGRES_CONFIG_STORE",
        "env:DUCKGRES_INTERNAL_SECRET",
        "env:DUCKGRES_RUNNER_SECRET",
        "env:DUCKGRES_DATAPLANE_SECRET",
        "env:DUCKGRES_BROKER_URL",
        "env:AWS_SECRET_ACCESS_KEY",
        "env:DUCKGRES_TEST_PW_FILE",
        "k8s:duckgres/duckgres-admin#internal-secret",
        "k8s:any-namespace/duckgres-admin-trino#catalog-dsn",
        "k8s:duckgres/duckgres-reshard-op-7-login#config-store-dsn",  # a runner's own login
    ],
)
def test_own_secrets_are_never_resolved_or_allowed(settings, ref, monkeypatch):
    monkeypatch.setenv("DUCKGRES_TEST_PW_FILE", "/etc/passwd")
    everything = "env:DJANGO_*,env:DUCKGRES_*,env:AWS_*,k8s:duckgres/*,k8s:any-namespace/*"
    _allow(settings, "provisioner", everything)
    _allow(settings, "tenant", everything)
    for purpose in ("provisioner", "tenant"):
        with pytest.raises(secretrefs.SecretRefError, match="control plane's own"):
            secretrefs.check_allowed(ref, purpose)
    # The denial is in resolve itself (every process, runners included): no value comes back,
    # and a k8s: one never reaches the Kubernetes API (none is configured here).
    with pytest.raises(secretrefs.SecretRefError, match="control plane's own") as raised:
        secretrefs.resolve(ref)
    for value in (os.environ.get("DJANGO_SECRET_KEY", "-"), os.environ["DUCKGRES_CONFIG_STORE"]):
        assert value not in str(raised.value)
    assert secretrefs.env_variable(ref) is None  # the local launcher never passes it on


# --- the API edge ---------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-61")
def test_a_store_reference_outside_the_provisioner_allowlist_is_refused(clients):
    for ref in ("env:HOME", "k8s:kube-system/admin-token#token", "env:DJANGO_SECRET_KEY"):
        response = clients.internal.post(
            "/api/v1/metadata-stores",
            {**STORE, "name": unique("s"), "provisioner_password_ref": ref},
            format="json",
        )
        assert response.status_code == 400, (ref, response.content)
        message = error(response)
        assert message.startswith(f"invalid body: provisioner_password_ref: {ref} ") or (
            "control plane's own" in message
        ), message
    response = clients.internal.post(
        "/api/v1/metadata-stores",
        {**STORE, "name": unique("s"), "provisioner_password_ref": "env:HOME"},
        format="json",
    )
    assert error(response) == (
        "invalid body: provisioner_password_ref: env:HOME is not allowed for provisioner "
        "passwords: DUCKGRES_SECRET_REF_ALLOW_PROVISIONER allows env:DUCKGRES_TEST_*, "
        "env:PROV_PW, k8s:duckgres/shard-*; use a reference inside it, or have an operator add "
        "an entry such as env:HOME"
    )
    assert MetadataStore.objects.count() == 0


@pytest.mark.safeguard("reshard-61")
def test_purposes_are_separate(clients, settings):
    _allow(settings, "provisioner", "k8s:infra/prov-*")
    _allow(settings, "tenant", "k8s:tenants/*")
    response = clients.internal.post(
        "/api/v1/metadata-stores",
        {**STORE, "name": unique("s"), "provisioner_password_ref": "k8s:tenants/acme#pw"},
        format="json",
    )
    assert response.status_code == 400
    assert "is not allowed for provisioner passwords" in error(response)
    response = clients.internal.post(
        "/api/v1/metadata-stores",
        {**STORE, "name": "prov-ok", "provisioner_password_ref": "k8s:infra/prov-a#pw"},
        format="json",
    )
    assert response.status_code == 201, response.content
    binding = {
        "org_id": unique("org"),
        "metadata_store_kind": "cnpg",
        "metadata_store_name": "prov-ok",
        "metadata_store_database": "acme",
        "metadata_store_user": "acme",
        "metadata_store_password_ref": "k8s:infra/prov-a#pw",  # a provisioner's secret
    }
    response = clients.internal.post("/api/v1/warehouses", binding, format="json")
    assert response.status_code == 400
    assert error(response).startswith(
        "invalid body: metadata_store_password_ref: k8s:infra/prov-a#pw is not allowed for "
        "tenant passwords: DUCKGRES_SECRET_REF_ALLOW_TENANT allows k8s:tenants/*"
    )
    binding["metadata_store_password_ref"] = "k8s:tenants/acme#pw"
    assert clients.internal.post("/api/v1/warehouses", binding, format="json").status_code == 201


@pytest.mark.safeguard("reshard-61")
def test_a_start_target_reference_outside_the_tenant_allowlist_is_refused(
    clients, published, store_clusters, tenant_catalog
):
    catalog = tenant_catalog(store_clusters.source)
    source = new_store(store_clusters.source)
    warehouse = new_warehouse(store=source, catalog=catalog)
    body = {
        "target": {
            "type": "external",
            "endpoint": f"{catalog.cluster.host}:{catalog.cluster.port}",
            "user": catalog.role,
            "database": catalog.database,
            "password_secret_ref": "env:DUCKGRES_CONFIG_STORE",
            "password": "guess",
        }
    }
    response = clients.internal.post(
        f"/api/v1/warehouses/{warehouse.org_id}/reshards", body, format="json"
    )
    assert response.status_code == 400
    assert error(response).startswith(
        "target.password_secret_ref: secret env:DUCKGRES_CONFIG_STORE names the control "
        "plane's own configuration"
    )
    assert os.environ["DUCKGRES_CONFIG_STORE"] not in response.content.decode()
    assert ReshardOperation.objects.count() == 0


@pytest.mark.safeguard("reshard-61")
def test_a_dry_run_never_sends_a_disallowed_reference_and_is_audited(
    clients, published, store_clusters, tenant_catalog, hostile_server
):
    """A store row written before the allowlist existed (the API would refuse it now) names the
    Django key as its provisioner password and a listener of the caller's as its host: the dry
    run reports the refusal, nothing ever connects there, and the dry run is audited."""
    catalog = tenant_catalog(store_clusters.source)
    source = new_store(store_clusters.source)
    warehouse = new_warehouse(store=source, catalog=catalog)
    for ref in ("env:DJANGO_SECRET_KEY", "env:HOME"):
        hostile = new_store(
            name=unique("evil"),
            host="127.0.0.1",
            port=hostile_server.port,
            provisioner_password_ref=ref,
        )
        response = clients.internal.post(
            f"/api/v1/warehouses/{warehouse.org_id}/reshards",
            {"target": {"type": "cnpg", "cnpg_shard": hostile.name}, "dry_run": True},
            format="json",
        )
        assert response.status_code == 200, response.content
        probe = {e["check"]: e for e in response.json()["preflight"]}["target_probe"]
        assert probe["ok"] is False
        assert probe["detail"].startswith(
            f"target store {hostile.name}: provisioner_password_ref: "
        ), probe
        assert probe["detail"].endswith("(start would answer 400)")
        assert hostile_server.connections == 0
        audit = AuditRecord.objects.filter(action="reshard.dry_run").order_by("-id").first()
        assert audit is not None
        assert (audit.status, audit.org_id, audit.actor) == (
            200,
            warehouse.org_id,
            "internal-secret",
        )
        assert audit.detail.startswith(
            f"dry run org {warehouse.org_id}: cnpg {source.name} → cnpg {hostile.name}: "
        )
        assert "failed: target_probe" in audit.detail
    assert os.environ["DJANGO_SECRET_KEY"] not in response.content.decode()
    assert ReshardOperation.objects.count() == 0
    # A refused dry run (bad body) is audited as a dry run too.
    response = clients.internal.post(
        f"/api/v1/warehouses/{warehouse.org_id}/reshards",
        {"target": {"type": "cnpg", "nope": 1}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 400
    last = AuditRecord.objects.order_by("-id").first()
    assert last is not None
    assert (last.action, last.status) == ("reshard.dry_run", 400)
    response = clients.internal.post(  # refused before the view: still a dry run
        f"/api/v1/warehouses/{warehouse.org_id}/reshards",
        {"target": {"type": "cnpg", "cnpg_shard": "x\x00"}, "dry_run": True},
        format="json",
    )
    assert response.status_code == 400
    last = AuditRecord.objects.order_by("-id").first()
    assert last is not None
    assert (last.action, last.status) == ("reshard.dry_run", 400)


# --- old → new audit ---------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-61")
def test_endpoint_and_reference_changes_are_audited_old_to_new(clients):
    response = clients.internal.post(
        "/api/v1/metadata-stores", {**STORE, "name": "audited"}, format="json"
    )
    assert response.status_code == 201
    response = clients.internal.patch(
        "/api/v1/metadata-stores/audited",
        {"host": "127.0.0.2", "provisioner_password_ref": "env:PROV_PW", "port": 5434},
        format="json",
    )
    assert response.status_code == 200, response.content
    org = unique("org")
    binding = {
        "org_id": org,
        "metadata_store_kind": "cnpg",
        "metadata_store_name": "audited",
        "metadata_store_database": "acme",
        "metadata_store_user": "acme",
        "metadata_store_password_ref": "env:ACME_PW",
    }
    assert clients.internal.post("/api/v1/warehouses", binding, format="json").status_code == 201
    response = clients.internal.patch(
        f"/api/v1/warehouses/{org}",
        {"metadata_store_password_ref": "env:TENANT_PW", "data_bucket": "b"},
        format="json",
    )
    assert response.status_code == 200, response.content
    details = list(AuditRecord.objects.order_by("id").values_list("action", "detail"))
    assert details == [
        (
            "metadata_store.create",
            "metadata store audited (cnpg) created with host '127.0.0.1', port 5434, sslmode "
            "'verify-full', tls_policy 'verify-full', provisioner_user 'provisioner', "
            "provisioner_password_ref "
            "'env:DUCKGRES_TEST_PROVISIONER_PASSWORD'",
        ),
        (
            "metadata_store.update",
            "metadata store audited updated: host '127.0.0.1' → '127.0.0.2', "
            "provisioner_password_ref 'env:DUCKGRES_TEST_PROVISIONER_PASSWORD' → 'env:PROV_PW'",
        ),
        (
            "warehouse.create",
            f"warehouse {org} created with metadata_store_kind 'cnpg', metadata_store_name "
            "'audited', metadata_store_database 'acme', metadata_store_user 'acme', "
            "metadata_store_password_ref 'env:ACME_PW'",
        ),
        (
            "warehouse.update",
            "updated data_bucket, metadata_store_password_ref (metadata_store_password_ref "
            "'env:ACME_PW' → 'env:TENANT_PW')",
        ),
    ]


# --- store hosts ----------------------------------------------------------------------------


@pytest.mark.safeguard("reshard-61")
@pytest.mark.parametrize(
    ("key", "host", "network"),
    [
        ("host", "169.254.169.254", "169.254.0.0/16"),
        ("host", "169.254.10.1", "169.254.0.0/16"),
        ("host", "0.0.0.0", "0.0.0.0/32"),
        ("host", "::", "::/128"),
        ("host", "fd00:ec2::254", "fd00:ec2::254/128"),
        ("host", "::ffff:169.254.169.254", "169.254.0.0/16"),
        ("pooler_host", "fe80::1", "fe80::/10"),  # with a zone id: the syntax rule (reshard-125)
    ],
)
def test_denied_store_hosts_are_refused(clients, key, host, network):
    response = clients.internal.post(
        "/api/v1/metadata-stores", {**STORE, "name": unique("h"), key: host}, format="json"
    )
    assert response.status_code == 400, response.content
    assert error(response).startswith(f"invalid body: {key}: ")
    assert f"is in the denied network {network}: link-local, cloud metadata" in error(response)
    assert MetadataStore.objects.count() == 0


@pytest.mark.safeguard("reshard-61")
def test_names_are_resolved_and_every_address_is_checked(clients, settings):
    settings.DUCKGRES_STORE_HOST_DENYLIST = (
        *settings.DUCKGRES_STORE_HOST_DENYLIST,
        __import__("ipaddress").ip_network("127.0.0.0/8"),
    )
    response = clients.internal.post(
        "/api/v1/metadata-stores",
        {**STORE, "name": unique("h"), "host": "localhost"},
        format="json",
    )
    assert response.status_code == 400
    assert error(response).startswith(
        "invalid body: host: localhost resolves to 127.0.0.1, in the denied network 127.0.0.0/8"
    )
    # A name that does not resolve is refused: it could not be checked (reshard-125).
    response = clients.internal.post(
        "/api/v1/metadata-stores",
        {**STORE, "name": unique("h"), "host": "not-yet.invalid"},
        format="json",
    )
    assert response.status_code == 400, response.content
    assert error(response).startswith("invalid body: host: not-yet.invalid did not resolve")


@pytest.mark.safeguard("reshard-61")
def test_external_binding_and_target_hosts_are_checked(clients, published, cnpg_source):
    response = clients.internal.post(
        "/api/v1/warehouses",
        {
            "org_id": unique("org"),
            "metadata_store_kind": "external",
            "metadata_store_host": "169.254.169.254",
            "metadata_store_port": 5432,
            "metadata_store_database": "d",
            "metadata_store_user": "u",
            "metadata_store_password_ref": "env:ACME_PW",
        },
        format="json",
    )
    assert response.status_code == 400
    assert error(response).startswith("invalid body: metadata_store_host: 169.254.169.254 is in")
    response = clients.internal.post(
        cnpg_source.path,
        {
            "target": {
                "type": "external",
                "endpoint": "[fd00:ec2::254]:5432",
                "user": "u",
                "database": "d",
                "password_secret_ref": "env:ACME_PW",
                "password": "p",
            }
        },
        format="json",
    )
    assert response.status_code == 400
    assert error(response).startswith("target.endpoint: fd00:ec2::254 is in the denied network")
    assert ReshardOperation.objects.count() == 0


@pytest.mark.safeguard("reshard-61")
def test_a_denied_legacy_store_host_is_never_connected_at_submit(
    clients, published, cnpg_source, settings, hostile_server
):
    """A store row written before the denylist (or a name that later resolves into it): the
    start refuses it before connecting."""
    import ipaddress

    settings.DUCKGRES_STORE_HOST_DENYLIST = (ipaddress.ip_network("127.0.0.0/8"),)
    legacy = new_store(name=unique("legacy"), host="localhost", port=hostile_server.port)
    response = clients.internal.post(
        cnpg_source.path, {"target": {"type": "cnpg", "cnpg_shard": legacy.name}}, format="json"
    )
    assert response.status_code == 400
    assert "in the denied network 127.0.0.0/8" in error(response)
    assert hostile_server.connections == 0


# --- item 10's edge: no store without TLS ---------------------------------------------------------


@pytest.mark.safeguard("reshard-68")
@pytest.mark.parametrize("kind", ["cnpg", "external"])
@pytest.mark.parametrize("key", ["sslmode", "pooler_sslmode"])
def test_sslmode_disable_is_refused_for_every_store_kind(clients, kind, key):
    body: dict[str, Any] = {**STORE, "name": unique("tls"), "kind": kind, key: "disable"}
    if key == "pooler_sslmode":
        body["pooler_host"] = "127.0.0.1"
    response = clients.internal.post("/api/v1/metadata-stores", body, format="json")
    assert response.status_code == 400
    assert error(response) == (
        f"invalid body: {key}: disable is refused for every store (the provisioner password and "
        "the tenant catalogs would cross the network unencrypted); use require, verify-ca or "
        "verify-full"
    )
    ok = clients.internal.post(
        "/api/v1/metadata-stores", {**body, key: "verify-full"}, format="json"
    )
    assert ok.status_code == 201, ok.content
    response = clients.internal.patch(
        f"/api/v1/metadata-stores/{body['name']}", {key: "disable"}, format="json"
    )
    assert response.status_code == 400
    assert error(response).startswith(f"invalid body: {key}: disable is refused")
    assert MetadataStore.objects.get(name=body["name"]).sslmode == "verify-full"
