"""Tenant catalogs of the shared Trino pools: naming, rendering, hashing and principals (spec
trino-pools §4.9, §4.11 "Bindings"). Pure functions: no database, no network.

Invariants:

1. **Names are a pure function of ``database_name``.** ``org_`` + the name lowercased with every
   character outside ``[a-z0-9_]`` replaced by ``_`` (one ``_`` per character, so a non-ASCII
   character never becomes several); longer than 63 bytes → its first 54 bytes + ``_`` + the
   first 8 hex of SHA-256 over the *original* ``database_name`` (UTF-8 bytes). The sanitised
   name is pure ASCII, so its bytes and characters coincide and the result is exactly 63 bytes.
   Two orgs may still map to one name (``acme-wh``, ``acme_wh``): uniqueness per pool is
   enforced by the claim in ``trino_pools.reconcile``, never here.
2. **The definition is deterministic.** ``render_definition`` renders the same document for the
   same warehouse binding and settings (no timestamps, no random values, no dict order
   dependence: ``canonical`` sorts keys). It never holds a secret: the metadata-store password
   is referenced by a file path under ``DUCKGRES_TRINO_TENANT_SECRET_MOUNT_PATH``.
3. **The payload hash covers the whole definition** (``payload_hash`` = SHA-256 of the canonical
   JSON), so any binding change (a finished reshard, a new bucket or region) changes it and the
   next reconcile republishes.
4. **One principal function.** ``tenant_principals`` is the only source of a tenant's
   principals (the root login = ``database_name``), sorted and de-duplicated, so the Gateway's
   tenant gate and any future password projection can never disagree.

Decision where the specification is silent: the password file of a catalog is
``<mount>/<catalog name>/metadata-store-password`` (the chart mounts one directory per catalog).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol

from duckgres_admin.models.trino import WarehouseTrino
from duckgres_admin.models.warehouses import Warehouse
from trino_pools.config import TrinoSettings

CATALOG_PREFIX = "org_"
MAX_CATALOG_NAME_BYTES = 63
_KEEP_BYTES = 54
_HASH_HEX = 8
_ALLOWED = re.compile(r"[a-z0-9_]")
DEFINITION_FORMAT = 1
PASSWORD_FILE_NAME = "metadata-store-password"
BACKENDS = ("ducklake", "hoglake")


class DefinitionError(ValueError):
    """The warehouse cannot be rendered into a catalog (a sentence naming what is missing)."""


def _lower_char(ch: str) -> str:
    # Per character, like Go's rune-wise ToLower: U+0130 lowercases to two code points in
    # Python ("i" + combining dot) but to "i" in Go's simple case mapping; keep the first.
    lowered = ch.lower()
    return lowered[0] if lowered else ch


def catalog_name(database_name: str) -> str:
    """The catalog name of a warehouse in its owning pool (§4.9)."""
    sanitized = CATALOG_PREFIX + "".join(
        low if _ALLOWED.fullmatch(low := _lower_char(ch)) else "_" for ch in database_name
    )
    encoded = sanitized.encode("utf-8")
    if len(encoded) <= MAX_CATALOG_NAME_BYTES:
        return sanitized
    digest = hashlib.sha256(database_name.encode("utf-8")).hexdigest()[:_HASH_HEX]
    return encoded[:_KEEP_BYTES].decode("ascii") + "_" + digest


def canonical(document: Any) -> str:
    """Canonical JSON: sorted keys, no whitespace (the same formula as ``effects.canonical``)."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"))


def payload_hash(definition: Mapping[str, Any] | None) -> str:
    """SHA-256 hex of the canonical JSON of ``definition`` (``None`` = a removal)."""
    return hashlib.sha256(canonical(definition).encode("utf-8")).hexdigest()


REMOVED_HASH = payload_hash(None)


def _binding(warehouse: Warehouse) -> dict[str, Any]:
    """The metadata-store endpoint tenants use (the pooler for cnpg stores), never a password."""
    kind = warehouse.metadata_store_kind
    if kind == "cnpg":
        store = warehouse.metadata_store
        if store is None:
            raise DefinitionError(f"warehouse {warehouse.org_id} has no metadata store")
        host, port, sslmode = store.tenant_host, store.tenant_port, store.tenant_sslmode
    elif kind == "external":
        host = warehouse.metadata_store_host
        port = warehouse.metadata_store_port or 0
        sslmode = warehouse.metadata_store_sslmode or "require"
    else:
        raise DefinitionError(f"warehouse {warehouse.org_id} has no metadata-store binding")
    if not host or not port or not warehouse.metadata_store_database:
        raise DefinitionError(
            f"warehouse {warehouse.org_id} has an incomplete metadata-store binding"
        )
    if not warehouse.metadata_store_user:
        raise DefinitionError(f"warehouse {warehouse.org_id} has no metadata-store user")
    return {
        "host": host,
        "port": int(port),
        "database": warehouse.metadata_store_database,
        "user": warehouse.metadata_store_user,
        "sslmode": sslmode,
    }


def password_file(settings: TrinoSettings, name: str) -> str:
    mount = settings.tenant_secret_mount_path.rstrip("/") or "/"
    return f"{mount}/{name}/{PASSWORD_FILE_NAME}"


def render_definition(
    warehouse: Warehouse, trino_row: WarehouseTrino, settings: TrinoSettings
) -> dict[str, Any]:
    """The deterministic catalog document of ``warehouse`` (§4.9); raises ``DefinitionError``.

    ``{"format", "catalog", "org_id", "connector", "properties"}``: ``connector`` is the backend
    (``ducklake`` or ``hoglake``) and ``properties`` a flat map of strings, as Trino catalog
    properties are.
    """
    if not warehouse.database_name:
        raise DefinitionError(f"warehouse {warehouse.org_id} has no database_name")
    backend = trino_row.backend or "ducklake"
    if backend not in BACKENDS:
        raise DefinitionError(f"unknown Trino backend {backend!r} (expected ducklake or hoglake)")
    if not warehouse.data_bucket:
        raise DefinitionError(f"warehouse {warehouse.org_id} has no data bucket")
    region = warehouse.data_region or settings.aws_region
    if not region:
        raise DefinitionError(
            f"warehouse {warehouse.org_id} has no data region and DUCKGRES_TRINO_AWS_REGION "
            "is not set"
        )
    name = catalog_name(warehouse.database_name)
    binding = _binding(warehouse)
    properties: dict[str, str] = {
        "metadata.host": binding["host"],
        "metadata.port": str(binding["port"]),
        "metadata.database": binding["database"],
        "metadata.user": binding["user"],
        "metadata.sslmode": binding["sslmode"],
        "metadata.password-file": password_file(settings, name),
        "data.bucket": warehouse.data_bucket,
        "data.path": f"s3://{warehouse.data_bucket}/",
        "s3.region": region,
        "s3.max-connections": str(settings.s3_max_connections),
        "fs.cache.enabled": "true" if settings.filesystem_cache_enabled else "false",
    }
    if warehouse.data_role_arn:
        properties["s3.iam-role"] = warehouse.data_role_arn
    if backend == "hoglake":
        if not settings.hoglake_uri or not settings.hoglake_data_path:
            raise DefinitionError(
                "backend hoglake requires DUCKGRES_TRINO_MANAGED_HOGLAKE_URI and "
                "DUCKGRES_TRINO_HOGLAKE_DATA_PATH"
            )
        properties.update(
            {
                "hoglake.uri": settings.hoglake_uri,
                "hoglake.data-path": settings.hoglake_data_path,
                "hoglake.namespace": settings.hoglake_namespace,
            }
        )
    return {
        "format": DEFINITION_FORMAT,
        "catalog": name,
        "org_id": warehouse.org_id,
        "connector": backend,
        "properties": properties,
    }


class HasDatabaseName(Protocol):
    """What ``tenant_principals`` reads of a warehouse (a row or a light projection of one)."""

    @property
    def database_name(self) -> str: ...


def tenant_principals(warehouse: HasDatabaseName) -> list[str]:
    """The tenant's principals: the root login (``database_name``); sorted, de-duplicated."""
    candidates: Iterable[str] = (warehouse.database_name,)
    return sorted({p for p in candidates if p})


def binding_revision(principals: Iterable[str]) -> str:
    """First 32 hex of SHA-256 over each principal followed by a NUL byte (§4.11)."""
    digest = hashlib.sha256()
    for principal in principals:
        digest.update(principal.encode("utf-8"))
        digest.update(b"\x00")
    return digest.hexdigest()[:32]


__all__ = [
    "BACKENDS",
    "REMOVED_HASH",
    "DefinitionError",
    "binding_revision",
    "canonical",
    "catalog_name",
    "password_file",
    "payload_hash",
    "render_definition",
    "tenant_principals",
]
