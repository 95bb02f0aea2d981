"""The strict Trino cell registry (spec trino-pools §6.2): ``{"cells":[…]}``, one JSON document.

Every level is checked against an explicit key set (unknown and retired fields are rejected,
so a registry still carrying the blue/green topology can never load), duplicate keys inside an
object are rejected, and a second document after the first is rejected (``strictjson``, shared
with the blueprint). Errors name the file,
the JSON path of the offending value and the fix, and collect every problem found in one pass.

Decisions where the specification is silent (also written down in ``docs/trino.md``):

- The host placeholder of ``client_url`` is ``{org}``; it may only be the leading host label
  (``https://{org}.pool-a.example.com``). It is resolved with the sample org ``sample-org``.
- Pool integers default to the config-store defaults of §2.3 (``desired_instances`` 3,
  ``min_serving`` 3, ``max_surge`` 1, ``max_repair`` 1); ``blueprint_file``,
  ``coordinator_service_port`` and ``node_environment`` are required.
- The file may be at most 1 MiB.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from trino_pools import strictjson

STORED_PREFIX = "registered:"
HOST_PLACEHOLDER = "{org}"
SAMPLE_ORG = "sample-org"
MAX_CELLS = 16
MAX_FILE_BYTES = 1024 * 1024
DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")

CELL_FIELDS = frozenset({"id", "mode", "namespace", "routing_group", "client_url", "pool"})
POOL_FIELDS = frozenset(
    {
        "desired_instances",
        "min_serving",
        "max_surge",
        "max_repair",
        "blueprint_file",
        "coordinator_service_port",
        "node_environment",
        "tenant_admission",
    }
)
# Fields of the retired blue/green registry: named as retired in the error, not "misspelled".
RETIRED_FIELDS = frozenset(
    {
        "backends",
        "catalog_management",
        "tls_server_name",
        "running",
        "routing_active",
        "internal_secret_name",
    }
)


@dataclass(frozen=True)
class PoolSpec:
    desired_instances: int
    min_serving: int
    max_surge: int
    max_repair: int
    blueprint_file: str
    coordinator_service_port: int
    node_environment: str
    tenant_admission: bool


@dataclass(frozen=True)
class Cell:
    """One registry entry, resolved (spec §6.2 "Result per cell")."""

    id: str
    namespace: str
    routing_group: str
    client_url: str
    host: str
    port: int
    pool: PoolSpec

    @property
    def stored_id(self) -> str:
        return f"{STORED_PREFIX}{self.id}"

    @property
    def endpoint_key(self) -> str:
        return f"{self.host}:{self.port}"

    def resolved_client_url(self, org_id: str) -> str:
        return self.client_url.replace(HOST_PLACEHOLDER, org_id, 1)


class RegistryError(ValueError):
    """The registry cannot be used; ``problems`` are complete sentences, one per mistake."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = problems
        listing = "\n  - ".join(problems)
        super().__init__(f"invalid Trino registry {source}:\n  - {listing}")


class _Checker(strictjson.Problems):
    """Every problem starts with the source; a retired field is named as retired."""

    def __init__(self, source: str) -> None:
        super().__init__(source, prefix=f"{source}: ")

    def unknown_field(self, path: str, key: str, allowed: frozenset[str]) -> None:
        if key in RETIRED_FIELDS:
            self.fail(
                f"{path}.{key}",
                f'unknown field "{key}" (retired blue/green registry field)',
                "remove it: Trino supports shared-pool cells only",
            )
        else:
            super().unknown_field(path, key, allowed)

    def label(self, obj: dict[str, Any], path: str, key: str) -> str | None:
        value = obj.get(key)
        where = f"{path}.{key}"
        if value is None or value == "":
            self.fail(where, f"{key} is required", "set it to a DNS-1123 label such as pool-a")
            return None
        if not isinstance(value, str):
            self.fail(where, f"{key} must be a string", "set it to a DNS-1123 label")
            return None
        if len(value) > 63 or not DNS_LABEL.match(value):
            self.fail(
                where,
                f"{value!r} is not a DNS-1123 label",
                "use at most 63 lowercase letters, digits and '-', starting and ending "
                "with a letter or digit",
            )
            return None
        return value

    def integer(
        self,
        obj: dict[str, Any],
        path: str,
        key: str,
        *,
        default: int | None,
        minimum: int,
        maximum: int | None = None,
    ) -> int | None:
        where = f"{path}.{key}"
        if key not in obj:
            if default is None:
                self.fail(where, f"{key} is required", "set it to an integer")
            return default
        value = obj[key]
        if not strictjson.is_int(value):
            self.fail(where, f"{key} must be an integer (got {json.dumps(value)})", "fix its value")
            return None
        if value < minimum or (maximum is not None and value > maximum):
            bounds = f">= {minimum}" if maximum is None else f"between {minimum} and {maximum}"
            self.fail(where, f"{key} is {value}", f"set it {bounds}")
            return None
        return int(value)

    def text(
        self, obj: dict[str, Any], path: str, key: str, *, max_len: int | None = None
    ) -> str | None:
        where = f"{path}.{key}"
        value = obj.get(key)
        if not isinstance(value, str) or not value.strip():
            self.fail(where, f"{key} is required and must be a non-empty string", "set it")
            return None
        if max_len is not None and len(value) > max_len:
            self.fail(where, f"{key} is longer than {max_len} characters", "shorten it")
            return None
        return value


def _check_client_url(check: _Checker, path: str, value: object) -> tuple[str, int] | None:
    """Validate ``client_url``; returns (lowercased host without trailing dot, port)."""
    fix = "use https://host[:port] with no credentials, path, query or fragment"
    if not isinstance(value, str) or not value:
        check.fail(path, "client_url is required", fix)
        return None
    url = value.strip()
    rest = url[len("https://") :] if url.startswith("https://") else None
    if HOST_PLACEHOLDER in url and (
        rest is None or not rest.startswith(HOST_PLACEHOLDER + ".") or url.count("{org}") != 1
    ):
        check.fail(
            path,
            f"the host placeholder {HOST_PLACEHOLDER} may only be the leading host label",
            "write https://{org}.<domain>[:port]",
        )
        return None
    resolved = url.replace(HOST_PLACEHOLDER, SAMPLE_ORG, 1)
    if "{" in resolved or "}" in resolved:
        check.fail(path, "client_url contains an unknown placeholder", fix)
        return None
    if "?" in resolved:
        check.fail(path, "client_url has a query (even a bare '?' is refused)", fix)
        return None
    if "#" in resolved:
        check.fail(path, "client_url has a fragment", fix)
        return None
    try:
        parts = urlsplit(resolved)
        port = parts.port
    except ValueError:
        check.fail(path, "client_url has an invalid port", "use a port between 1 and 65535")
        return None
    if parts.scheme != "https":
        check.fail(path, "client_url must use https", fix)
        return None
    if "@" in parts.netloc:
        check.fail(path, "client_url must not carry credentials", fix)
        return None
    if not parts.hostname:
        check.fail(path, "client_url has no host", fix)
        return None
    if parts.path not in ("", "/"):
        check.fail(path, "client_url must not have a path", fix)
        return None
    if port is not None and not 1 <= port <= 65535:
        check.fail(path, f"client_url port {port} is out of range", "use 1..65535")
        return None
    # The endpoint key is taken from the template host (placeholder kept), lowercased.
    host = (urlsplit(url).hostname or "").rstrip(".")
    return host.lower(), port or 443


def _check_pool(check: _Checker, path: str, raw: object) -> PoolSpec | None:
    if raw is None:
        check.fail(path, "the pool block is required", "add a pool object (see docs/trino.md)")
        return None
    if not isinstance(raw, dict):
        check.fail(path, "pool must be an object", "write it as a JSON object")
        return None
    check.keys(raw, path, POOL_FIELDS)
    desired = check.integer(raw, path, "desired_instances", default=3, minimum=1)
    min_serving = check.integer(
        raw, path, "min_serving", default=3, minimum=1, maximum=desired if desired else None
    )
    surge = check.integer(raw, path, "max_surge", default=1, minimum=0)
    repair = check.integer(raw, path, "max_repair", default=1, minimum=0)
    blueprint = check.text(raw, path, "blueprint_file")
    port = check.integer(
        raw, path, "coordinator_service_port", default=None, minimum=1, maximum=65535
    )
    node_env = check.text(raw, path, "node_environment", max_len=128)
    admission = raw.get("tenant_admission", False)
    if not isinstance(admission, bool):
        check.fail(
            f"{path}.tenant_admission",
            f"tenant_admission must be true or false (got {json.dumps(admission)})",
            "use a JSON boolean",
        )
        admission = False
    if (
        desired is None
        or min_serving is None
        or surge is None
        or repair is None
        or blueprint is None
        or port is None
        or node_env is None
    ):
        return None
    return PoolSpec(
        desired_instances=desired,
        min_serving=min_serving,
        max_surge=surge,
        max_repair=repair,
        blueprint_file=blueprint,
        coordinator_service_port=port,
        node_environment=node_env,
        tenant_admission=admission,
    )


def _check_cell(check: _Checker, path: str, raw: object) -> Cell | None:
    if not isinstance(raw, dict):
        check.fail(path, "each cell must be an object", "write the cell as a JSON object")
        return None
    check.keys(raw, path, CELL_FIELDS)
    mode = raw.get("mode")
    if not isinstance(mode, str) or mode.strip() != "shared-pool":
        check.fail(
            f"{path}.mode",
            f"trino supports shared-pool cells only (got {json.dumps(mode)})",
            'set "mode": "shared-pool"',
        )
    cell_id = check.label(raw, path, "id")
    if cell_id == "legacy":
        check.fail(f"{path}.id", '"legacy" is not a valid cell id', "choose another id")
        cell_id = None
    namespace = check.label(raw, path, "namespace")
    routing_group = check.label(raw, path, "routing_group")
    endpoint = _check_client_url(check, f"{path}.client_url", raw.get("client_url"))
    pool = _check_pool(check, f"{path}.pool", raw.get("pool"))
    if cell_id is None or namespace is None or routing_group is None:
        return None
    if endpoint is None or pool is None or check.problems:
        return None
    return Cell(
        id=cell_id,
        namespace=namespace,
        routing_group=routing_group,
        client_url=str(raw["client_url"]).strip(),
        host=endpoint[0],
        port=endpoint[1],
        pool=pool,
    )


def parse_registry(text: str, source: str) -> tuple[Cell, ...]:
    """Parse and validate a registry document; ``source`` names it in every error."""
    check = _Checker(source)
    try:
        document = strictjson.decode_document(text)
    except strictjson.StrictJSONError as exc:
        check.fail(exc.path, exc.problem, exc.fix)
        raise RegistryError(source, check.problems) from None
    if not isinstance(document, dict):
        check.fail("$", 'the registry must be an object {"cells": [...]}', "wrap the cells list")
        raise RegistryError(source, check.problems)
    check.keys(document, "$", frozenset({"cells"}))
    cells_raw = document.get("cells")
    if not isinstance(cells_raw, list):
        check.fail("$.cells", "cells must be a list", 'write "cells": [ {...}, ... ]')
        raise RegistryError(source, check.problems)
    if not cells_raw:
        check.fail("$.cells", "the registry must declare at least one cell", "add a cell")
    if len(cells_raw) > MAX_CELLS:
        check.fail(
            "$.cells",
            f"the registry declares {len(cells_raw)} cells; at most 16 cells are supported",
            "remove cells",
        )
    cells: list[Cell] = []
    for index, raw in enumerate(cells_raw):
        cell = _check_cell(check, f"$.cells[{index}]", raw)
        if cell is not None:
            cells.append(cell)
    for attribute, what in (
        ("id", "id"),
        ("namespace", "namespace"),
        ("routing_group", "routing group"),
    ):
        seen: dict[str, int] = {}
        for index, raw in enumerate(cells_raw):
            value = raw.get(attribute) if isinstance(raw, dict) else None
            if not isinstance(value, str) or not value:
                continue
            if value in seen:
                check.fail(
                    f"$.cells[{index}].{attribute}",
                    f"duplicate {what} {value!r} (also $.cells[{seen[value]}])",
                    f"give every cell its own {what}",
                )
            else:
                seen[value] = index
    if check.problems:
        raise RegistryError(source, check.problems)
    return tuple(cells)


def load_registry(path: str, *, variable: str = "DUCKGRES_TRINO_CELLS_FILE") -> tuple[Cell, ...]:
    """Read and parse the registry file named by ``variable``."""
    source = f"{variable} {path!r}"
    try:
        with open(path, "rb") as handle:
            data = handle.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise RegistryError(
            source, [f"{source}: cannot read the file ({exc.strerror}); fix the path"]
        ) from None
    if len(data) > MAX_FILE_BYTES:
        raise RegistryError(source, [f"{source}: larger than 1 MiB; shrink the registry"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise RegistryError(source, [f"{source}: not UTF-8 text; re-encode it"]) from None
    return parse_registry(text, source)
