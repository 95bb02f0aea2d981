"""``host:port`` patterns of operator settings (``DUCKGRES_SECRET_REF_ENDPOINTS``,
``DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT``; docs/configuration.md).

A pattern is ``<host>:<port>``: ``host`` a name or address (``[v6]`` in brackets), or
``*.<domain>`` (every name under that domain, never the domain itself nor an address); ``port``
a number or ``*`` (any). Host names compare case-insensitively and without a trailing dot. A
bare ``*`` host (every server) is refused: a pattern must name where a secret may go.
Invariant: parsing is strict — every malformed item is an error naming the variable and the
item, never silently dropped.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_PORT = r"(?P<port>\*|[0-9]{1,5})"
_V6_RE = re.compile(rf"^\[(?P<host>[0-9A-Fa-f:.]+)\]:{_PORT}$")
_HOST_RE = re.compile(rf"^(?P<host>(\*\.)?[A-Za-z0-9_]([A-Za-z0-9_.-]*[A-Za-z0-9_])?\.?):{_PORT}$")
FORMS = "write <host>:<port>, [<ipv6>]:<port> or *.<domain>:<port> (port * = any)"


def normalize_host(host: str) -> str:
    """The form hosts are compared in: no brackets, no trailing dot, lowercase."""
    return host.strip().strip("[]").rstrip(".").lower()


@dataclass(frozen=True)
class EndpointPattern:
    host: str  # normalized; "*.<domain>" for a domain wildcard
    port: int | None  # None: any port

    def matches(self, host: str, port: int) -> bool:
        if self.port is not None and self.port != port:
            return False
        name = normalize_host(host)
        if self.host.startswith("*."):
            return name.endswith(self.host[1:])
        return name == self.host

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{'*' if self.port is None else self.port}"


def parse_pattern(item: str) -> EndpointPattern | str:
    """One pattern, or the reason it is not one."""
    text = item.strip()
    m = _V6_RE.match(text) or _HOST_RE.match(text)
    if not m:
        if text.startswith("*:") or text == "*":
            return "a bare * host would name every server; name the host or *.<domain>"
        return FORMS
    port_text = m["port"]
    port = None if port_text == "*" else int(port_text)
    if port is not None and not 1 <= port <= 65535:
        return f"port {port} is out of range (1-65535)"
    return EndpointPattern(normalize_host(m["host"]), port)


def parse_patterns(variable: str, raw: str, *, separator: str = ",") -> tuple[
    tuple[EndpointPattern, ...], list[str]
]:  # fmt: skip
    """``separator``-separated patterns; returns them and one error per bad item."""
    patterns: list[EndpointPattern] = []
    errors: list[str] = []
    if not raw.strip():
        return (), errors
    for item in raw.split(separator):
        if not item.strip():
            errors.append(f"{variable}: an endpoint is empty (remove the extra {separator!r})")
            continue
        parsed = parse_pattern(item)
        if isinstance(parsed, str):
            errors.append(f"{variable}: {item.strip()!r} is not an endpoint: {parsed}")
            continue
        patterns.append(parsed)
    return tuple(patterns), errors


def hostport(host: str, port: int) -> str:
    """``host:port`` for messages (an IPv6 address in brackets)."""
    bare = host.strip("[]")
    return f"[{bare}]:{port}" if ":" in bare else f"{bare}:{port}"
