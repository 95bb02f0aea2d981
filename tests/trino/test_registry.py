"""The strict registry file (spec trino-pools §6.2, safeguards 1 and 2)."""

from __future__ import annotations

import json

import pytest

from tests.trino.helpers import cell, registry, with_pool, write
from trino_pools.registry import RegistryError, load_registry, parse_registry

SRC = "DUCKGRES_TRINO_CELLS_FILE '/etc/cells.json'"


def problems(text: str) -> list[str]:
    with pytest.raises(RegistryError) as info:
        parse_registry(text, SRC)
    assert str(info.value).startswith(f"invalid Trino registry {SRC}:")
    return info.value.problems


@pytest.mark.safeguard("trino-2")
def test_a_registry_alone_yields_the_stored_id():
    (parsed,) = parse_registry(registry(cell()), SRC)
    assert parsed.stored_id == "registered:pool-a"
    assert parsed.id == "pool-a"
    assert parsed.namespace == "trino-pool-a"
    assert parsed.routing_group == "rg-pool-a"
    assert parsed.port == 443
    assert parsed.endpoint_key == "pool-a.trino.example.com:443"
    assert parsed.pool.min_serving == 2
    assert parsed.pool.tenant_admission is True


def test_pool_defaults_and_trimmed_mode():
    doc = with_pool(
        cell(mode="  shared-pool "),
        desired_instances=None,
        min_serving=None,
        max_surge=None,
        max_repair=None,
        tenant_admission=None,
    )
    (parsed,) = parse_registry(registry(doc), SRC)
    pool = parsed.pool
    assert (pool.desired_instances, pool.min_serving, pool.max_surge, pool.max_repair) == (
        3,
        3,
        1,
        1,
    )
    assert pool.tenant_admission is False


def test_sixteen_cells_are_accepted_and_the_placeholder_resolves():
    cells = [cell(f"pool-{i}") for i in range(16)]
    cells[0]["client_url"] = "https://{org}.Pool-0.Trino.example.com.:8443/"
    parsed = parse_registry(registry(*cells), SRC)
    assert len(parsed) == 16
    assert parsed[0].endpoint_key == "{org}.pool-0.trino.example.com:8443"
    assert parsed[0].resolved_client_url("acme") == "https://acme.Pool-0.Trino.example.com.:8443/"


@pytest.mark.safeguard("trino-1")
@pytest.mark.parametrize(
    ("field", "expected"),
    [
        ("backends", '$.cells[0].backends: unknown field "backends" (retired blue/green'),
        ("catalog_management", '$.cells[0].catalog_management: unknown field "catalog_management"'),
        ("tls_server_name", '$.cells[0].tls_server_name: unknown field "tls_server_name"'),
        ("running", '$.cells[0].running: unknown field "running"'),
        ("routing_active", '$.cells[0].routing_active: unknown field "routing_active"'),
        ("internal_secret_name", "$.cells[0].internal_secret_name: unknown field"),
    ],
)
def test_retired_blue_green_fields_are_rejected_by_name(field, expected):
    overrides: dict[str, object] = {field: ["x"]}
    found = problems(registry(cell("pool-a", **overrides)))
    assert len(found) == 1
    assert found[0].startswith(f"{SRC}: {expected}")
    assert "remove it" in found[0]


def test_unknown_fields_are_rejected_at_every_level():
    assert problems(json.dumps({"cells": [cell()], "version": 2})) == [
        f'{SRC}: $.version: unknown field "version"; remove it (allowed fields: cells)'
    ]
    (found,) = problems(registry(cell(colour="blue")))
    assert found.startswith(f'{SRC}: $.cells[0].colour: unknown field "colour"; remove it')
    (found,) = problems(registry(with_pool(cell(), replicas=3)))
    assert found.startswith(f'{SRC}: $.cells[0].pool.replicas: unknown field "replicas"')


@pytest.mark.safeguard("trino-1")
@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        (
            registry(cell(mode="legacy")),
            '$.cells[0].mode: trino supports shared-pool cells only (got "legacy"); '
            'set "mode": "shared-pool"',
        ),
        (
            registry(cell(mode=None)),
            "$.cells[0].mode: trino supports shared-pool cells only (got null)",
        ),
        (registry(cell("legacy")), '$.cells[0].id: "legacy" is not a valid cell id'),
        (json.dumps({"cells": []}), "$.cells: the registry must declare at least one cell"),
        (
            registry(*[cell(f"p{i}") for i in range(17)]),
            "$.cells: the registry declares 17 cells; at most 16 cells are supported",
        ),
        (
            registry(cell("pool-a"), cell("pool-a", namespace="ns-b", routing_group="rg-b")),
            "$.cells[1].id: duplicate id 'pool-a' (also $.cells[0]); give every cell its own id",
        ),
        (
            registry(cell("pool-a"), cell("pool-b", namespace="trino-pool-a")),
            "$.cells[1].namespace: duplicate namespace 'trino-pool-a' (also $.cells[0])",
        ),
        (
            registry(cell("pool-a"), cell("pool-b", routing_group="rg-pool-a")),
            "$.cells[1].routing_group: duplicate routing group 'rg-pool-a' (also $.cells[0])",
        ),
        (
            registry(cell()) + "\n" + registry(cell()),
            "$: must contain one JSON document; remove everything after the first",
        ),
        (registry(cell()) + " []", "$: must contain one JSON document"),
    ],
)
def test_structural_mistakes(doc, expected):
    found = problems(doc)
    assert any(p.startswith(f"{SRC}: {expected}") for p in found), found


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        ({"id": "Pool_A"}, "$.cells[0].id: 'Pool_A' is not a DNS-1123 label"),
        ({"id": "a" * 64}, "$.cells[0].id: '" + "a" * 64 + "' is not a DNS-1123 label"),
        ({"id": None}, "$.cells[0].id: id is required"),
        ({"id": 7}, "$.cells[0].id: id must be a string"),
        ({"namespace": None}, "$.cells[0].namespace: namespace is required"),
        ({"namespace": "-bad"}, "$.cells[0].namespace: '-bad' is not a DNS-1123 label"),
        ({"routing_group": ""}, "$.cells[0].routing_group: routing_group is required"),
        ({"routing_group": "rg.x"}, "$.cells[0].routing_group: 'rg.x' is not a DNS-1123 label"),
        ({"pool": None}, "$.cells[0].pool: the pool block is required"),
        ({"pool": []}, "$.cells[0].pool: pool must be an object"),
        ({"client_url": None}, "$.cells[0].client_url: client_url is required"),
        (
            {"client_url": "http://a.example.com"},
            "$.cells[0].client_url: client_url must use https",
        ),
        ({"client_url": "https://u:p@a.example.com"}, "client_url must not carry credentials"),
        ({"client_url": "https://a.example.com?"}, "client_url has a query (even a bare '?'"),
        ({"client_url": "https://a.example.com/?x=1"}, "client_url has a query"),
        ({"client_url": "https://a.example.com#frag"}, "client_url has a fragment"),
        ({"client_url": "https://a.example.com/v1"}, "client_url must not have a path"),
        ({"client_url": "https://a.example.com:0"}, "client_url port 0 is out of range"),
        ({"client_url": "https://a.example.com:70000"}, "client_url has an invalid port"),
        ({"client_url": "https://"}, "client_url has no host"),
        (
            {"client_url": "https://pool.{org}.example.com"},
            "the host placeholder {org} may only be the leading host label",
        ),
        (
            {"client_url": "https://{org}.{org}.example.com"},
            "the host placeholder {org} may only be the leading host label",
        ),
        (
            {"client_url": "https://{tenant}.example.com"},
            "client_url contains an unknown placeholder",
        ),
    ],
)
def test_cell_field_mistakes(overrides, expected):
    found = problems(registry(cell(**overrides)))
    assert any(expected in p for p in found), found
    assert all(p.startswith(f"{SRC}: $.cells[0]") for p in found), found


@pytest.mark.parametrize(
    ("pool", "expected"),
    [
        (
            {"desired_instances": 0},
            "$.cells[0].pool.desired_instances: desired_instances is 0; set it >= 1",
        ),
        ({"desired_instances": "3"}, 'desired_instances must be an integer (got "3")'),
        ({"desired_instances": True}, "desired_instances must be an integer (got true)"),
        ({"desired_instances": 2.5}, "desired_instances must be an integer (got 2.5)"),
        (
            {"min_serving": 0},
            "$.cells[0].pool.min_serving: min_serving is 0; set it between 1 and 3",
        ),
        ({"min_serving": 4}, "min_serving is 4; set it between 1 and 3"),
        ({"max_surge": -1}, "$.cells[0].pool.max_surge: max_surge is -1; set it >= 0"),
        ({"max_repair": -1}, "$.cells[0].pool.max_repair: max_repair is -1; set it >= 0"),
        ({"blueprint_file": ""}, "$.cells[0].pool.blueprint_file: blueprint_file is required"),
        ({"blueprint_file": None}, "$.cells[0].pool.blueprint_file: blueprint_file is required"),
        ({"coordinator_service_port": None}, "coordinator_service_port is required"),
        (
            {"coordinator_service_port": 0},
            "coordinator_service_port is 0; set it between 1 and 65535",
        ),
        ({"coordinator_service_port": 65536}, "coordinator_service_port is 65536"),
        (
            {"node_environment": ""},
            "$.cells[0].pool.node_environment: node_environment is required",
        ),
        ({"node_environment": "e" * 129}, "node_environment is longer than 128 characters"),
        ({"tenant_admission": "true"}, 'tenant_admission must be true or false (got "true")'),
    ],
)
def test_pool_block_mistakes(pool, expected):
    found = problems(registry(with_pool(cell(), **pool)))
    assert any(expected in p for p in found), found


@pytest.mark.parametrize(
    ("doc", "expected"),
    [
        ("", "$: not valid JSON (Expecting value at line 1 column 1)"),
        ("{", "$: not valid JSON"),
        ("[]", '$: the registry must be an object {"cells": [...]}'),
        ('{"cells": {}}', "$.cells: cells must be a list"),
        ('{"cells": [1]}', "$.cells[0]: each cell must be an object"),
        ('{"cells": [], "cells": []}', '$: duplicate key "cells"'),
    ],
)
def test_document_mistakes(doc, expected):
    found = problems(doc)
    assert any(p.startswith(f"{SRC}: {expected}") for p in found), found


def test_every_mistake_is_reported_in_one_pass():
    doc = registry(cell(mode="legacy", colour="x"), with_pool(cell("pool-b"), max_surge=-1))
    found = problems(doc)
    assert len(found) == 3, found


def test_load_names_the_variable_and_the_path(tmp_path):
    path = write(tmp_path, "cells.json", registry(cell(backends=[])))
    with pytest.raises(RegistryError) as info:
        load_registry(path)
    assert f"DUCKGRES_TRINO_CELLS_FILE {path!r}: $.cells[0].backends" in str(info.value)
    missing = str(tmp_path / "nope.json")
    with pytest.raises(RegistryError) as info:
        load_registry(missing)
    assert f"DUCKGRES_TRINO_CELLS_FILE {missing!r}: cannot read the file" in str(info.value)
    assert load_registry(write(tmp_path, "ok.json", registry(cell())))[0].id == "pool-a"
