"""Catalog naming, rendering, hashing and principals (spec trino-pools §4.9, §4.11; safeguard
43's unit names)."""

from __future__ import annotations

import hashlib
import json
from dataclasses import replace
from typing import Any

import pytest

from duckgres_admin.models import MetadataStore, Warehouse, WarehouseTrino
from trino_pools.catalogs import (
    REMOVED_HASH,
    DefinitionError,
    binding_revision,
    canonical,
    catalog_name,
    payload_hash,
    render_definition,
    tenant_principals,
)
from trino_pools.config import TrinoSettings


@pytest.mark.safeguard("trino-43")
@pytest.mark.parametrize(
    ("database_name", "expected"),
    [
        ("Acme-WH", "org_acme_wh"),
        ("acme_wh", "org_acme_wh"),
        ("acme.wh 2", "org_acme_wh_2"),
        ("ÄCME-wh", "org__cme_wh"),  # one "_" per character, never per byte
        ("日本", "org___"),
        ("KELVIN\u212a", "org_kelvink"),  # KELVIN SIGN lowercases to ASCII k
        ("\u0130stanbul", "org_istanbul"),  # rune-wise lowering, as Go's simple case mapping
        ("", "org_"),
    ],
)
def test_catalog_names(database_name, expected):
    assert catalog_name(database_name) == expected


@pytest.mark.safeguard("trino-43")
def test_long_names_are_cut_to_63_bytes_with_a_hash_of_the_original():
    original = "Tenant-" + "x" * 93
    assert len(original) == 100
    name = catalog_name(original)
    digest = hashlib.sha256(original.encode()).hexdigest()[:8]
    assert len(name.encode()) == 63
    assert name == ("org_tenant_" + "x" * 43) + "_" + digest
    # The hash is of the original, so names that sanitise alike still differ when long.
    assert catalog_name(original.replace("-", "_")) != name
    # Exactly 63 bytes sanitised: kept as is.
    assert catalog_name("a" * 59) == "org_" + "a" * 59


@pytest.mark.safeguard("trino-43")
def test_long_non_ascii_names_count_bytes_and_hash_the_utf8_original():
    original = "ü" * 100  # 200 UTF-8 bytes
    name = catalog_name(original)
    assert len(name.encode()) == 63
    assert name == "org_" + "_" * 50 + "_" + hashlib.sha256(original.encode()).hexdigest()[:8]


def test_principals_and_binding_revision():
    wh = Warehouse(org_id="o1", database_name="acme")
    assert tenant_principals(wh) == ["acme"]
    assert tenant_principals(Warehouse(org_id="o2", database_name="")) == []
    expected = hashlib.sha256(b"acme\x00").hexdigest()[:32]
    assert binding_revision(["acme"]) == expected
    assert binding_revision(["a", "b"]) == hashlib.sha256(b"a\x00b\x00").hexdigest()[:32]
    assert binding_revision(["ab"]) != binding_revision(["a", "b"])
    assert len(binding_revision([])) == 32


def _settings(**overrides: Any) -> TrinoSettings:
    return replace(TrinoSettings(), **{"aws_region": "eu-central-1", **overrides})


def _external(**overrides: Any) -> Warehouse:
    fields = {
        "org_id": "acme-org",
        "database_name": "Acme-WH",
        "state": "ready",
        "metadata_store_kind": "external",
        "metadata_store_host": "meta.example.internal",
        "metadata_store_port": 6432,
        "metadata_store_sslmode": "verify-full",
        "metadata_store_database": "acme",
        "metadata_store_user": "acme_owner",
        "metadata_store_password_ref": "k8s:tenants/acme#password",
        "data_bucket": "acme-data",
        "data_region": "",
    }
    fields.update(overrides)
    return Warehouse(**fields)


def test_definition_is_deterministic_and_carries_no_secret():
    wh = _external()
    row = WarehouseTrino(warehouse=wh, backend="ducklake")
    settings = _settings(s3_max_connections=77, filesystem_cache_enabled=True)
    first = render_definition(wh, row, settings)
    second = render_definition(_external(), WarehouseTrino(backend="ducklake"), settings)
    assert canonical(first) == canonical(second)
    assert payload_hash(first) == payload_hash(second)
    assert (
        payload_hash(first)
        == hashlib.sha256(
            json.dumps(first, sort_keys=True, separators=(",", ":")).encode()
        ).hexdigest()
    )
    assert first["catalog"] == "org_acme_wh"
    assert first["connector"] == "ducklake"
    props = first["properties"]
    assert props["metadata.host"] == "meta.example.internal"
    assert props["metadata.port"] == "6432"
    assert props["metadata.password-file"] == (
        "/etc/trino/tenant-secrets/org_acme_wh/metadata-store-password"
    )
    assert props["s3.region"] == "eu-central-1"  # DUCKGRES_TRINO_AWS_REGION fallback
    assert props["s3.max-connections"] == "77"
    assert props["fs.cache.enabled"] == "true"
    text = canonical(first)
    assert "k8s:tenants" not in text
    assert not [k for k in props if k.endswith((".password", "password-ref"))]
    assert payload_hash(None) == REMOVED_HASH


def test_every_binding_field_changes_the_hash():
    settings = _settings()
    base = payload_hash(
        render_definition(_external(), WarehouseTrino(backend="ducklake"), settings)
    )
    for change in (
        {"metadata_store_host": "meta-2.example.internal"},
        {"metadata_store_port": 5433},
        {"metadata_store_database": "acme2"},
        {"metadata_store_user": "other"},
        {"data_bucket": "other-bucket"},
        {"data_region": "us-west-2"},
    ):
        other = render_definition(_external(**change), WarehouseTrino(backend="ducklake"), settings)
        assert payload_hash(other) != base, change
    hog = render_definition(
        _external(),
        WarehouseTrino(backend="hoglake"),
        _settings(hoglake_uri="https://hog.example", hoglake_data_path="s3://hog/"),
    )
    assert hog["connector"] == "hoglake"
    assert payload_hash(hog) != base
    # Region precedence: the warehouse's own region wins over the fallback.
    own = render_definition(
        _external(data_region="ap-south-1"), WarehouseTrino(backend="ducklake"), settings
    )
    assert own["properties"]["s3.region"] == "ap-south-1"


def test_cnpg_binding_uses_the_tenant_endpoint():
    store = MetadataStore(
        name="shard-1",
        kind="cnpg",
        host="shard-1-rw",
        port=5432,
        sslmode="require",
        pooler_host="shard-1-pooler",
        pooler_port=6432,
    )
    wh = _external(metadata_store_kind="cnpg", metadata_store_host="", metadata_store_port=None)
    wh.metadata_store = store
    props = render_definition(wh, WarehouseTrino(backend="ducklake"), _settings())["properties"]
    assert (props["metadata.host"], props["metadata.port"]) == ("shard-1-pooler", "6432")


@pytest.mark.parametrize(
    ("warehouse", "backend", "settings", "message"),
    [
        (_external(database_name=""), "ducklake", _settings(), "has no database_name"),
        (_external(data_bucket=""), "ducklake", _settings(), "has no data bucket"),
        (_external(), "ducklake", _settings(aws_region=""), "DUCKGRES_TRINO_AWS_REGION"),
        (_external(metadata_store_kind=""), "ducklake", _settings(), "no metadata-store binding"),
        (_external(), "hoglake", _settings(), "DUCKGRES_TRINO_MANAGED_HOGLAKE_URI"),
    ],
)
def test_unrenderable_warehouses_are_named(warehouse, backend, settings, message):
    with pytest.raises(DefinitionError) as info:
        render_definition(warehouse, WarehouseTrino(backend=backend), settings)
    assert message in str(info.value)
