"""One syntax rule for every host the API accepts (safeguard reshard-125).

A store's ``host``/``pooler_host``, an external binding's ``metadata_store_host`` and an
external target's endpoint host are each a DNS name or one literal address: a comma list, a
socket directory, a zone id, whitespace or an empty label is refused with a 400 naming the
field, and so is a name that does not resolve. The seam (``lib.pgadmin``) refuses the same
hosts before anything is resolved or sent.
"""

from __future__ import annotations

import pytest

from duckgres_admin.lib import hosts, pgadmin
from duckgres_admin.models import MetadataStore, ReshardOperation, Warehouse
from tests.fixtures.api import error
from tests.fixtures.rows import unique

pytestmark = pytest.mark.safeguard("reshard-125")

STORE = {
    "kind": "cnpg",
    "host": "127.0.0.1",
    "port": 5434,
    "sslmode": "verify-full",
    "provisioner_user": "provisioner",
    "provisioner_password_ref": "env:DUCKGRES_TEST_PROVISIONER_PASSWORD",
}

BAD = [
    ("127.0.0.1,169.254.169.254", "a comma makes it a list of hosts"),
    ("/var/run/postgresql", "Unix-socket directory"),
    ("@abstract", "Unix-socket directory"),
    ("pg .example", "whitespace or a control character"),
    ("localhost ", "whitespace or a control character"),
    ("fe80::1%eth0", "zone id"),
    ("pg..example", "empty label"),
    (".pg.example", "empty label"),
    ("pg_1.example", "other than a letter, digit or hyphen"),
    ("-pg.example", "starts or ends with a hyphen"),
    ("a" * 64 + ".example", "longer than 63 characters"),
    (("a" * 60 + ".") * 5 + "com", "longer than 253 characters"),
    ("2130706433", "last label is all digits"),
    ("0x7f.0.0.1", "last label is all digits"),
    ("127.0.0.01", "not a valid IPv4 address"),
    ("[::1]", "brackets"),
    ("pg.example:5432", "not an IPv6 address"),
]


@pytest.mark.parametrize(("host", "why"), BAD)
@pytest.mark.parametrize("key", ["host", "pooler_host"])
def test_store_hosts_must_be_a_name_or_one_address(clients, key, host, why):
    body = {**STORE, "name": unique("s"), key: host}
    if key == "pooler_host":
        body["pooler_port"] = 6432
    response = clients.internal.post("/api/v1/metadata-stores", body, format="json")
    assert response.status_code == 400, response.content
    message = error(response)
    assert message.startswith(f"invalid body: {key}: "), message
    assert why in message
    assert "write a DNS name" in message
    assert "literal IPv4 or IPv6 address" in message
    assert not MetadataStore.objects.filter(name=body["name"]).exists()


def test_a_store_patch_is_held_to_the_same_rule(clients):
    name = unique("s")
    response = clients.internal.post(
        "/api/v1/metadata-stores", {**STORE, "name": name}, format="json"
    )
    assert response.status_code == 201, response.content
    response = clients.admin.patch(
        f"/api/v1/metadata-stores/{name}", {"host": "127.0.0.1,10.0.0.1"}, format="json"
    )
    assert response.status_code == 400
    assert error(response).startswith("invalid body: host: 127.0.0.1,10.0.0.1 is not a host")
    assert MetadataStore.objects.get(name=name).host == "127.0.0.1"


def test_names_and_literal_addresses_are_accepted(clients):
    for host in ("localhost", "localhost.", "127.0.0.1", "::1"):
        response = clients.internal.post(
            "/api/v1/metadata-stores", {**STORE, "name": unique("s"), "host": host}, format="json"
        )
        assert response.status_code == 201, (host, response.content)


def test_a_name_that_does_not_resolve_is_refused_naming_the_field(clients):
    body = {**STORE, "name": unique("s"), "host": "no-such-store.invalid"}
    response = clients.internal.post("/api/v1/metadata-stores", body, format="json")
    assert response.status_code == 400
    assert error(response).startswith("invalid body: host: no-such-store.invalid did not resolve (")
    assert "give a name this control plane resolves" in error(response)


@pytest.mark.parametrize(
    ("host", "why"),
    [
        ("127.0.0.1,127.0.0.2", "a comma makes it a list of hosts"),
        ("/tmp", "Unix-socket directory"),
        ("meta..example", "empty label"),
        ("no-such-binding.invalid", "did not resolve"),
    ],
)
def test_external_binding_hosts_follow_the_rule(clients, host, why):
    org = unique("org")
    response = clients.internal.post(
        "/api/v1/warehouses",
        {
            "org_id": org,
            "metadata_store_kind": "external",
            "metadata_store_host": host,
            "metadata_store_port": 5432,
            "metadata_store_database": "d",
            "metadata_store_user": "u",
            "metadata_store_password_ref": "env:ACME_PW",
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    assert error(response).startswith("invalid body: metadata_store_host: "), error(response)
    assert why in error(response)
    assert not Warehouse.objects.filter(org_id=org).exists()


@pytest.mark.parametrize(
    ("endpoint", "message"),
    [
        ("meta..example:5432", "target.endpoint: meta..example is not a host: it has an empty"),
        ("no-such-target.invalid:5432", "target.endpoint: no-such-target.invalid did not resolve"),
        ("127.0.0.1,127.0.0.2:5432", "target.endpoint must be host[:port]"),
    ],
)
def test_external_target_hosts_follow_the_rule(clients, published, cnpg_source, endpoint, message):
    response = clients.internal.post(
        cnpg_source.path,
        {
            "target": {
                "type": "external",
                "endpoint": endpoint,
                "user": "u",
                "database": "d",
                "password_secret_ref": "env:ACME_PW",
                "password": "p",
            }
        },
        format="json",
    )
    assert response.status_code == 400, response.content
    assert error(response).startswith(message), error(response)
    assert ReshardOperation.objects.count() == 0


@pytest.mark.parametrize("host", ["127.0.0.1,127.0.0.2", "/var/run/postgresql", "fe80::1%lo"])
def test_the_connection_seam_refuses_the_same_hosts_before_sending_anything(host):
    assert hosts.syntax_refusal("host", host) is not None
    with pytest.raises(pgadmin.InvalidStoreHost, match="is not a host"):
        pgadmin.pinned_host(host, 5432)
    with pytest.raises(pgadmin.InvalidStoreHost):
        pgadmin.connect(
            pgadmin.Endpoint(host, 5432, "require"), dbname="postgres", user="u", password=None
        )
