"""What the API checks before it opens a connection or writes an address (safeguards: the host
denylist, the secret-reference allowlists): shared by the start's preflight, the warehouse and
metadata-store writes and the binding catalog check.

A reference is resolved for a caller only when its purpose's allowlist covers it (and it is not
one of the control plane's own secrets); a host is refused when it is, or resolves to, a denied
address (``DUCKGRES_STORE_HOST_DENYLIST``), right before every connection and where it is
written.
"""

from __future__ import annotations

import hmac
import re

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.lib import secretrefs
from duckgres_admin.models import MetadataStore
from reshard.engines import identity

PROBE_TIMEOUT_SECONDS = 8


def parse_endpoint(raw: str) -> tuple[str, int]:
    """``host[:port]`` (IPv6 as ``[addr]:port``); port defaults to 5432."""
    text = raw.strip()
    m = re.fullmatch(r"\[([0-9A-Fa-f:.]+)\](?::(\d{1,5}))?", text) or re.fullmatch(
        r"([A-Za-z0-9._-]+)(?::(\d{1,5}))?", text
    )
    if not m:
        raise ValueError("target.endpoint must be host[:port]")
    port = int(m.group(2)) if m.group(2) else 5432
    if not 1 <= port <= 65535:
        raise ValueError("target.endpoint port must be 1..65535")
    return m.group(1), port


def hostport(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def ref_allowed(ref: str, purpose: secretrefs.Purpose, what: str) -> None:
    """400 naming ``what`` unless ``ref`` is inside the ``purpose`` allowlist (and not one of
    the control plane's own secrets): a reference is resolved for a caller only then."""
    try:
        secretrefs.check_allowed(ref, purpose)
    except secretrefs.SecretRefError as exc:
        raise ServiceError(400, f"{what}: {exc}") from None


def resolve_ref(ref: str, what: str, purpose: secretrefs.Purpose = "tenant") -> str:
    """The value of an allowed reference; 400 naming ``what``, the reference and the cause."""
    ref_allowed(ref, purpose, what)
    try:
        return secretrefs.resolve(ref)
    except Exception as exc:  # noqa: BLE001 - resolution errors name the reference and cause
        raise ServiceError(400, f"cannot resolve {what} {ref}: {exc}") from None


def resolve_allowed(ref: str, purpose: secretrefs.Purpose) -> str:
    """Resolve ``ref`` for the API only when its purpose's allowlist covers it (raises)."""
    secretrefs.check_allowed(ref, purpose)
    return secretrefs.resolve(ref)


def check_host(field_name: str, host: str) -> None:
    """400 when ``host`` is (or resolves to) a denied address (``DUCKGRES_STORE_HOST_DENYLIST``);
    run right before every connection the API opens, and where a host is written."""
    refusal = identity.host_refusal(field_name, host)
    if refusal:
        raise ServiceError(400, refusal)


def vet_store(store: MetadataStore, what: str) -> None:
    """400 before anything is sent to ``store``: its provisioner reference outside the
    allowlist, or its host or pooler host denied (``what`` names it in the message)."""
    ref_allowed(store.provisioner_password_ref, "provisioner", f"{what}: provisioner_password_ref")
    check_host(f"{what}: host", store.host)
    if store.pooler_host:
        check_host(f"{what}: pooler_host", store.pooler_host)


def constant_time_equal(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())
