"""Trino environment validation (spec trino-pools §4.1 steps 1-6, §6.1).

``load(environ)`` is a pure function of the environment mapping and local files (the registry,
the DSN and token files, the in-cluster service-account token): it opens no database or network
connection, so ``AppConfig.ready()`` can run it in every process, ``migrate`` included.

Order, as the specification demands:

1. retired variables set to a non-empty value are fatal, naming the variable (never its value)
   and the migration step; older retired names only warn; so are unsupported variables
   (``DUCKGRES_TRINO_MANAGED_GATEWAY_USERNAME``: the Gateway protocol has no user name);
2. every boolean is parsed before any dependency check, so an unparsable flag is reported as a
   parse error naming the variable and the value, never as "X requires Y=true";
3. wiring, the registry, per-pool requirements, the operator/writer/Gateway chain and the
   default cell. Every problem found is reported in one ``ImproperlyConfigured``.

Secrets (the Gateway token, the catalog DSN) are read only to validate them; they are never
kept on ``TrinoSettings`` and never appear in a message.
"""

from __future__ import annotations

import logging
import os
import re
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured
from psycopg.conninfo import conninfo_to_dict

from trino_pools.registry import Cell, RegistryError, load_registry

_log = logging.getLogger("duckgres.trino.config")

RETIRED_VARIABLES: dict[str, str] = {
    "DUCKGRES_TRINO_COORDINATOR_URL": (
        "declare the cell in DUCKGRES_TRINO_CELLS_FILE as a shared-pool cell with its "
        "client_url, then remove the variable"
    ),
    "DUCKGRES_TRINO_COORDINATOR_SERVER_NAME": (
        "put the Gateway TLS name in DUCKGRES_TRINO_MANAGED_GATEWAY_SERVER_NAME, then remove "
        "the variable"
    ),
    "DUCKGRES_TRINO_CELL_ID": (
        "cell ids come from the registry id; use DUCKGRES_TRINO_DEFAULT_CELL for default "
        "placement; remove the variable"
    ),
    "DUCKGRES_TRINO_NAMESPACE": (
        "set the cell's namespace in the registry, then remove the variable"
    ),
    "DUCKGRES_TRINO_REGISTRY_ONLY": "the registry is the only mode; remove the variable",
}
# Variables this control plane never reads; set to a non-empty value they are fatal, so an
# operator who sets one is told it does nothing instead of believing it took effect.
UNSUPPORTED_VARIABLES: dict[str, str] = {
    "DUCKGRES_TRINO_MANAGED_GATEWAY_USERNAME": (
        "the Gateway pooled-member protocol v1 has no user name: the shared-pool client "
        "authenticates with the admin token of DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE alone "
        "(docs/gateway-protocol.md §1); remove the variable"
    ),
}
OLDER_RETIRED_VARIABLES = (
    "DUCKGRES_TRINO_PROVISIONER_ENABLED",
    "DUCKGRES_TRINO_ADMIN_PASSWORD",
    "DUCKGRES_TRINO_ADMIN_PASSWORD_HASH",
    "DUCKGRES_TRINO_BUNDLE_BEARER_TOKEN",
    "DUCKGRES_TRINO_IAM_ACCOUNT_ID",
    "TRINO_MULTICELL_ENABLED",
    "TRINO_SHARED_CATALOGS_ENABLED",
)

BOOLEAN_VARIABLES = (
    "DUCKGRES_TRINO_POOL_ENABLED",
    "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED",
    "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED",
    "DUCKGRES_TRINO_POOL_CATALOG_BOOTSTRAP",
    "DUCKGRES_TRINO_POOL_NODE_DISRUPTION_ENABLED",
    "DUCKGRES_TRINO_FILESYSTEM_CACHE_ENABLED",
)
# Go's strconv.ParseBool, which the reference implementation uses: exactly these spellings.
_TRUE = ("1", "t", "T", "TRUE", "true", "True")
_FALSE = ("0", "f", "F", "FALSE", "false", "False")
ACCEPTED_BOOLEANS = ", ".join(_TRUE + _FALSE)

POOL_FLAGS = (
    "DUCKGRES_TRINO_POOL_ENABLED",
    "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED",
    "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED",
)

SCHEMA_RE = re.compile(r"^[a-z_][a-z0-9_]{0,62}$")
DNS_SUBDOMAIN_RE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DIGEST_PINNED_RE = re.compile(r"^\S+@sha256:[0-9a-f]{64}$")
MAX_DSN_FILE_BYTES = 8192
MAX_TOKEN_FILE_BYTES = 4096
MIN_TOKEN_LENGTH = 32
DEFAULT_METRICS_PORT = 9109
DEFAULT_S3_MAX_CONNECTIONS = 50
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
_SHARED_SECRETS = (
    "DUCKGRES_INTERNAL_SECRET",
    "DUCKGRES_RUNNER_SECRET",
    "DUCKGRES_DATAPLANE_SECRET",
)


@dataclass(frozen=True)
class TrinoSettings:
    """The validated Trino configuration of this process (no secret values)."""

    wired: bool = False
    cells_file: str = ""
    cells: tuple[Cell, ...] = ()
    default_cell: str = ""
    pool_enabled: bool = False
    operator_enabled: bool = False
    catalog_writer_enabled: bool = False
    catalog_bootstrap: bool = False
    node_disruption_enabled: bool = False
    filesystem_cache_enabled: bool = False
    catalog_dsn_file: str = ""
    catalog_schema: str = ""
    gateway_url: str = ""
    gateway_server_name: str = ""
    rollout_token_file: str = ""
    config_configmap_prefix: str = ""
    config_namespace: str = ""
    config_registry_key: str = "cells.json"
    publisher_image: str = ""
    aws_region: str = ""
    tenant_secret_mount_path: str = "/etc/trino/tenant-secrets"
    s3_max_connections: int = DEFAULT_S3_MAX_CONNECTIONS
    hoglake_uri: str = ""
    hoglake_data_path: str = ""
    hoglake_namespace: str = "main"
    service_auth_secret_file: str = ""
    metrics_port: int = DEFAULT_METRICS_PORT
    pod_name: str = ""
    warnings: tuple[str, ...] = field(default=())

    @property
    def stored_ids(self) -> frozenset[str]:
        return frozenset(cell.stored_id for cell in self.cells)

    @property
    def default_stored_id(self) -> str:
        return f"registered:{self.default_cell}" if self.default_cell else ""

    def cell(self, public_id: str) -> Cell | None:
        return next((c for c in self.cells if c.id == public_id), None)

    def cell_by_stored_id(self, stored_id: str) -> Cell | None:
        return next((c for c in self.cells if c.stored_id == stored_id), None)

    def operator_pools(self) -> tuple[Cell, ...]:
        """Pools whose operator runs in this deployment (exports ``configured``, §7)."""
        return self.cells if self.operator_enabled else ()

    def configmap_name(self, cell: Cell) -> str:
        return f"{self.config_configmap_prefix}-{cell.id}"


class _Reader:
    def __init__(self, environ: Mapping[str, str]) -> None:
        self.environ = environ
        self.errors: list[str] = []
        self.warnings: list[str] = []

    def text(self, name: str, default: str = "") -> str:
        value = self.environ.get(name, "")
        return value.strip() if value.strip() else default

    def boolean(self, name: str) -> bool:
        value = self.environ.get(name, "")
        if value == "":
            return False
        if value in _TRUE:
            return True
        if value in _FALSE:
            return False
        self.errors.append(
            f"{name}: cannot parse {value!r} as a boolean (accepted: {ACCEPTED_BOOLEANS})"
        )
        return False

    def read_file(self, variable: str, path: str, limit: int) -> str | None:
        """Read a small secret-bearing file; errors name the variable and path, never content."""
        try:
            with open(path, "rb") as handle:
                data = handle.read(limit + 1)
        except OSError as exc:
            self.errors.append(f"{variable}: cannot read {path!r} ({exc.strerror})")
            return None
        if len(data) > limit:
            self.errors.append(f"{variable}: {path!r} is larger than {limit} bytes")
            return None
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError:
            self.errors.append(f"{variable}: {path!r} is not UTF-8 text")
            return None
        return text[:-1] if text.endswith("\n") else text


def _check_gateway_url(reader: _Reader, variable: str, url: str) -> None:
    fix = "use an https origin such as https://gateway.example.com[:port]"
    try:
        parts = urlsplit(url)
        _ = parts.port
    except ValueError:
        reader.errors.append(f"{variable} has an invalid port; {fix}")
        return
    if parts.scheme != "https":
        reader.errors.append(f"{variable} must use https; {fix}")
    elif not parts.hostname:
        reader.errors.append(f"{variable} has no host; {fix}")
    elif "@" in parts.netloc:
        # Never echo a URL that carries credentials.
        reader.errors.append(f"{variable} must not carry credentials; {fix}")
    elif parts.path not in ("", "/") or "?" in url or "#" in url:
        reader.errors.append(f"{variable} must be an origin (no path, query or fragment); {fix}")


def _check_token_file(reader: _Reader, path: str) -> None:
    variable = "DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE"
    token = reader.read_file(variable, path, MAX_TOKEN_FILE_BYTES)
    if token is None:
        return
    if len(token) < MIN_TOKEN_LENGTH:
        reader.errors.append(
            f"{variable}: the Gateway admin token in {path!r} is shorter than "
            f"{MIN_TOKEN_LENGTH} characters"
        )
    elif any(ord(ch) < 32 or ord(ch) == 127 for ch in token):
        reader.errors.append(
            f"{variable}: the Gateway admin token in {path!r} contains control characters"
        )


def _check_dsn_file(reader: _Reader, path: str, schema: str) -> None:
    variable = "DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE"
    dsn = reader.read_file(variable, path, MAX_DSN_FILE_BYTES)
    if dsn is None:
        return
    dsn = dsn.strip()
    if not dsn.startswith(("postgres://", "postgresql://")):
        reader.errors.append(f"{variable}: {path!r} must hold a postgres:// or postgresql:// URL")
        return
    try:
        params = conninfo_to_dict(dsn)
    except Exception:  # noqa: BLE001 - psycopg's message may echo the DSN (it holds a password)
        reader.errors.append(f"{variable}: {path!r} does not hold a valid PostgreSQL URL")
        return
    options = str(params.get("options") or "")
    pinned = re.search(r"search_path\s*=\s*([^\s]+)", options)
    if pinned and schema and pinned.group(1).strip("'\"") != schema:
        reader.errors.append(
            f"{variable}: the DSN pins another search_path; remove it from the DSN "
            f"(DUCKGRES_TRINO_POOL_CATALOG_SCHEMA={schema} is pinned by the writer)"
        )


def _shared_secret(environ: Mapping[str, str], name: str) -> str | None:
    """A shared secret's value, given directly or as ``<NAME>_FILE`` (for comparison only)."""
    if environ.get(name):
        return environ[name]
    path = environ.get(f"{name}_FILE")
    if not path:
        return None
    try:
        with open(path, encoding="utf-8") as handle:
            content = handle.read()
    except OSError:
        return None  # the general settings report an unreadable secret file
    return content[:-1] if content.endswith("\n") else content


# Set to "none" in a process that holds no Kubernetes identity by design (beat: no token, no
# rights): the client check below then does not apply to it, and it never builds a client.
KUBE_ACCESS_VAR = "DUCKGRES_KUBE_ACCESS"


def _kube_client_loadable(environ: Mapping[str, str], service_account_token: str) -> bool:
    """The same inputs ``duckgres_admin.lib.k8s.api_client`` uses, checked without a call; a
    process declared without Kubernetes access (``DUCKGRES_KUBE_ACCESS=none``) needs none."""
    if environ.get(KUBE_ACCESS_VAR, "").strip() == "none":
        return True
    if environ.get("DUCKGRES_KUBE_API_URL", "").strip():
        return True
    return bool(
        environ.get("KUBERNETES_SERVICE_HOST") and environ.get("KUBERNETES_SERVICE_PORT")
    ) and os.path.isfile(service_account_token)


def _check_retired(reader: _Reader) -> None:
    """Report retired variables (current names are errors, older names only warnings) and
    unsupported ones (errors)."""
    for name, step in RETIRED_VARIABLES.items():
        if reader.environ.get(name, "") != "":
            reader.errors.append(f"{name} is retired and must not be set: {step}")
    for name, why in UNSUPPORTED_VARIABLES.items():
        if reader.environ.get(name, "") != "":
            reader.errors.append(f"{name} is not supported and must not be set: {why}")
    for name in OLDER_RETIRED_VARIABLES:
        if reader.environ.get(name, "") != "":
            reader.warnings.append(f"{name} is retired and ignored; remove it")


def _parse_flags(reader: _Reader) -> dict[str, bool]:
    """Parse every boolean variable; any problem so far is fatal before a dependency check."""
    flags = {name: reader.boolean(name) for name in BOOLEAN_VARIABLES}
    if reader.errors:
        _raise(reader.errors)
    return flags


def _metrics_port(reader: _Reader) -> int:
    """The metrics port; a value that is not a port number is reported."""
    raw_port = reader.text("DUCKGRES_TRINO_METRICS_PORT")
    if not raw_port:
        return DEFAULT_METRICS_PORT
    if raw_port.isdigit() and int(raw_port) <= 65535:
        return int(raw_port)
    reader.errors.append(
        f"DUCKGRES_TRINO_METRICS_PORT: {raw_port!r} is not a port number (0..65535)"
    )
    return DEFAULT_METRICS_PORT


def _s3_max_connections(reader: _Reader) -> int:
    """The S3 connection cap; blank, invalid or negative -> the default (spec §6.1)."""
    raw_s3 = reader.text("DUCKGRES_TRINO_S3_MAX_CONNECTIONS")
    return int(raw_s3) if raw_s3.isdigit() else DEFAULT_S3_MAX_CONNECTIONS


def _publisher_image(reader: _Reader) -> str:
    """The publisher image; one that is not digest-pinned is reported."""
    publisher_image = reader.text("DUCKGRES_TRINO_POOL_PUBLISHER_IMAGE")
    if publisher_image and not DIGEST_PINNED_RE.match(publisher_image):
        reader.errors.append(
            f"DUCKGRES_TRINO_POOL_PUBLISHER_IMAGE={publisher_image!r} is not digest-pinned; "
            "use <image>@sha256:<64 hex>"
        )
    return publisher_image


def _hoglake(reader: _Reader) -> dict[str, str]:
    """The managed Hoglake variables; URI and data path are required once any is set."""
    hoglake = {
        name: reader.text(name)
        for name in (
            "DUCKGRES_TRINO_MANAGED_HOGLAKE_URI",
            "DUCKGRES_TRINO_HOGLAKE_DATA_PATH",
            "DUCKGRES_TRINO_HOGLAKE_NAMESPACE",
        )
    }
    if any(hoglake.values()):
        for name in ("DUCKGRES_TRINO_MANAGED_HOGLAKE_URI", "DUCKGRES_TRINO_HOGLAKE_DATA_PATH"):
            if not hoglake[name]:
                reader.errors.append(f"{name} is required when any managed Hoglake variable is set")
    return hoglake


def _service_auth_file(reader: _Reader) -> str:
    """The service-auth secret file; its secret must be long enough and unlike shared ones."""
    variable = "DUCKGRES_TRINO_SERVICE_AUTH_SECRET_FILE"
    service_auth_file = reader.text(variable)
    if not service_auth_file:
        return service_auth_file
    token = reader.read_file(variable, service_auth_file, MAX_TOKEN_FILE_BYTES)
    if token is None:
        return service_auth_file
    if len(token) < MIN_TOKEN_LENGTH:
        reader.errors.append(
            f"{variable}: the secret is shorter than {MIN_TOKEN_LENGTH} characters"
        )
    for other in _SHARED_SECRETS:
        if token and token == _shared_secret(reader.environ, other):
            reader.errors.append(f"{variable} must differ from {other}")
    return service_auth_file


def _gateway_url(reader: _Reader) -> tuple[str, str]:
    """The Gateway URL and the variable it comes from (the pool variable wins)."""
    pool_url = reader.text("DUCKGRES_TRINO_POOL_GATEWAY_URL")
    if pool_url:
        return pool_url, "DUCKGRES_TRINO_POOL_GATEWAY_URL"
    return reader.text("DUCKGRES_TRINO_MANAGED_GATEWAY_URL"), "DUCKGRES_TRINO_MANAGED_GATEWAY_URL"


def _warn_unwired(reader: _Reader, flags: Mapping[str, bool]) -> None:
    """Warn about pool flags set to true while Trino is not wired."""
    for name in POOL_FLAGS:
        if flags[name]:
            reader.warnings.append(
                f"{name} is true but Trino is not wired (neither DUCKGRES_TRINO_CELLS_FILE "
                "nor DUCKGRES_TRINO_DEFAULT_CELL is set): Trino stays off"
            )


def _check_configmap_names(reader: _Reader, prefix: str, cells: tuple[Cell, ...]) -> None:
    """Check the ConfigMap prefix is set and yields a DNS-1123 name for every pool."""
    if not prefix:
        reader.errors.append(
            "DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP is required when a Trino pool is "
            "configured: set the name prefix of each pool's ConfigMap (<prefix>-<pool>)"
        )
        return
    for cell in cells:
        name = f"{prefix}-{cell.id}"
        if len(name) > 253 or not DNS_SUBDOMAIN_RE.match(name):
            reader.errors.append(
                f"DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP={prefix!r}: the ConfigMap name "
                f"{name!r} of pool {cell.id!r} is not a DNS-1123 subdomain "
                "(lowercase letters, digits, '-' and '.', at most 253 characters)"
            )
            return


def _wired_pools(
    reader: _Reader,
    flags: Mapping[str, bool],
    *,
    cells_file: str,
    default_cell: str,
    prefix: str,
    service_account_token: str,
) -> tuple[Cell, ...]:
    """The registered pools, each checked (§4.1 steps 3-5); none while Trino is not wired."""
    if not (cells_file or default_cell):
        _warn_unwired(reader, flags)
        return ()
    if not cells_file:
        reader.errors.append("DUCKGRES_TRINO_CELLS_FILE is required for Trino provisioning")
        return ()
    cells: tuple[Cell, ...] = ()
    try:
        cells = load_registry(cells_file)
    except RegistryError as exc:
        reader.errors.extend(exc.problems)
    for cell in cells:
        if not flags["DUCKGRES_TRINO_POOL_ENABLED"]:
            reader.errors.append(
                f"DUCKGRES_TRINO_CELLS_FILE: cell {cell.id!r} declares shared-pool mode but "
                "DUCKGRES_TRINO_POOL_ENABLED is not enabled; set it to true or remove the cell"
            )
    if cells:
        _check_configmap_names(reader, prefix, cells)
        if not _kube_client_loadable(reader.environ, service_account_token):
            reader.errors.append(
                "no Kubernetes client configuration for the Trino pools: set "
                "DUCKGRES_KUBE_API_URL or run in a pod with a service-account token"
            )
    return cells


def _check_operator_chain(
    reader: _Reader, flags: Mapping[str, bool], gateway_url: str, gateway_var: str, token_file: str
) -> None:
    """Check the operator's writer and Gateway requirements and the Gateway's token file."""
    operator = flags["DUCKGRES_TRINO_POOL_OPERATOR_ENABLED"]
    if operator and not flags["DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED"]:
        reader.errors.append(
            "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED requires "
            "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED=true"
        )
    if operator and not gateway_url:
        reader.errors.append(
            "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED requires DUCKGRES_TRINO_POOL_GATEWAY_URL "
            "(or DUCKGRES_TRINO_MANAGED_GATEWAY_URL)"
        )
    if not gateway_url:
        return
    _check_gateway_url(reader, gateway_var, gateway_url)
    if not token_file:
        reader.errors.append(
            f"{gateway_var} requires DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE "
            "(the Gateway admin token file)"
        )
    else:
        _check_token_file(reader, token_file)


def _check_writer(reader: _Reader, schema: str, dsn_file: str) -> None:
    """Check the catalog writer's schema name and DSN file."""
    if not schema:
        reader.errors.append(
            "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED requires DUCKGRES_TRINO_POOL_CATALOG_SCHEMA"
        )
    elif not SCHEMA_RE.match(schema):
        reader.errors.append(
            f"DUCKGRES_TRINO_POOL_CATALOG_SCHEMA={schema!r} is not a valid schema name "
            "(^[a-z_][a-z0-9_]{0,62}$)"
        )
    if not dsn_file:
        reader.errors.append(
            "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED requires "
            "DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE"
        )
    else:
        _check_dsn_file(reader, dsn_file, schema if SCHEMA_RE.match(schema) else "")


def _check_default_cell(
    reader: _Reader,
    flags: Mapping[str, bool],
    default_cell: str,
    cells_file: str,
    cells: tuple[Cell, ...],
) -> None:
    """Check the default cell's flags and that it names an admitting registered cell (§6.1)."""
    for name in POOL_FLAGS:
        if not flags[name]:
            reader.errors.append(f"DUCKGRES_TRINO_DEFAULT_CELL requires {name}=true")
    if not (cells_file and cells):
        return
    chosen = next((c for c in cells if c.id == default_cell), None)
    if chosen is None:
        reader.errors.append(
            f"DUCKGRES_TRINO_DEFAULT_CELL={default_cell!r} does not name a "
            f"registered cell (registered: {', '.join(c.id for c in cells)})"
        )
    elif not chosen.pool.tenant_admission:
        reader.errors.append(
            f"DUCKGRES_TRINO_DEFAULT_CELL={default_cell!r} requires a registered "
            "shared-pool cell with tenant_admission enabled"
        )


def load(
    environ: Mapping[str, str], *, service_account_token: str = SERVICE_ACCOUNT_TOKEN
) -> TrinoSettings:
    """Validate the Trino environment; raises ``ImproperlyConfigured`` listing every problem."""
    reader = _Reader(environ)
    # 1. Retired variables.  2. Booleans, before any dependency check.
    _check_retired(reader)
    flags = _parse_flags(reader)
    pool_enabled = flags["DUCKGRES_TRINO_POOL_ENABLED"]
    metrics_port = _metrics_port(reader)
    s3_max = _s3_max_connections(reader)
    publisher_image = _publisher_image(reader)
    hoglake = _hoglake(reader)
    service_auth_file = _service_auth_file(reader)
    gateway_url, gateway_var = _gateway_url(reader)
    token_file = reader.text("DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE")
    dsn_file = reader.text("DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE")
    schema = reader.text("DUCKGRES_TRINO_POOL_CATALOG_SCHEMA")
    default_cell = reader.text("DUCKGRES_TRINO_DEFAULT_CELL")
    cells_file = reader.text("DUCKGRES_TRINO_CELLS_FILE")
    prefix = reader.text("DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP")

    # 3. Wiring; 4. registry, then per pool.
    wired = bool(cells_file or default_cell)
    cells = _wired_pools(
        reader,
        flags,
        cells_file=cells_file,
        default_cell=default_cell,
        prefix=prefix,
        service_account_token=service_account_token,
    )

    # 6. Operator, writer, Gateway (checked whenever Trino is wired), then the default cell.
    if wired:
        _check_operator_chain(reader, flags, gateway_url, gateway_var, token_file)
        if flags["DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED"]:
            _check_writer(reader, schema, dsn_file)
        if default_cell:
            _check_default_cell(reader, flags, default_cell, cells_file, cells)

    if reader.errors:
        _raise(reader.errors)
    return TrinoSettings(
        wired=wired,
        cells_file=cells_file,
        cells=cells,
        default_cell=default_cell,
        pool_enabled=pool_enabled,
        operator_enabled=flags["DUCKGRES_TRINO_POOL_OPERATOR_ENABLED"] and wired,
        catalog_writer_enabled=flags["DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED"] and wired,
        catalog_bootstrap=flags["DUCKGRES_TRINO_POOL_CATALOG_BOOTSTRAP"],
        node_disruption_enabled=flags["DUCKGRES_TRINO_POOL_NODE_DISRUPTION_ENABLED"],
        filesystem_cache_enabled=flags["DUCKGRES_TRINO_FILESYSTEM_CACHE_ENABLED"],
        catalog_dsn_file=dsn_file,
        catalog_schema=schema,
        gateway_url=gateway_url,
        gateway_server_name=reader.text("DUCKGRES_TRINO_MANAGED_GATEWAY_SERVER_NAME"),
        rollout_token_file=token_file,
        config_configmap_prefix=prefix,
        config_namespace=reader.text("DUCKGRES_TRINO_POOL_CONFIG_NAMESPACE"),
        config_registry_key=reader.text("DUCKGRES_TRINO_POOL_CONFIG_REGISTRY_KEY", "cells.json"),
        publisher_image=publisher_image,
        aws_region=reader.text("DUCKGRES_TRINO_AWS_REGION"),
        tenant_secret_mount_path=reader.text(
            "DUCKGRES_TRINO_TENANT_SECRET_MOUNT_PATH", "/etc/trino/tenant-secrets"
        ),
        s3_max_connections=s3_max,
        hoglake_uri=hoglake["DUCKGRES_TRINO_MANAGED_HOGLAKE_URI"],
        hoglake_data_path=hoglake["DUCKGRES_TRINO_HOGLAKE_DATA_PATH"],
        hoglake_namespace=hoglake["DUCKGRES_TRINO_HOGLAKE_NAMESPACE"] or "main",
        service_auth_secret_file=service_auth_file,
        metrics_port=metrics_port,
        pod_name=reader.text("POD_NAME"),
        warnings=tuple(reader.warnings),
    )


def _raise(errors: list[str]) -> None:
    listing = "\n  - ".join(errors)
    raise ImproperlyConfigured(f"invalid Trino configuration:\n  - {listing}")


_current: TrinoSettings | None = None
_current_lock = threading.Lock()


def validate_process(environ: Mapping[str, str] | None = None) -> TrinoSettings:
    """Validate this process's environment once (``AppConfig.ready()``) and remember it.

    Warnings (older retired names, flags set while Trino is not wired) are logged once.
    """
    global _current
    loaded = load(os.environ if environ is None else environ)
    with _current_lock:
        first = _current is None
        _current = loaded
    if first:
        for warning in loaded.warnings:
            _log.warning(warning)
    return loaded


def current() -> TrinoSettings:
    """The settings validated at process start (validated now if ``ready()`` has not run)."""
    with _current_lock:
        loaded = _current
    return loaded if loaded is not None else validate_process()


def install_for_tests(settings: TrinoSettings | None) -> None:
    """Replace the process settings (tests only; ``None`` re-reads the environment next time)."""
    global _current
    with _current_lock:
        _current = settings
