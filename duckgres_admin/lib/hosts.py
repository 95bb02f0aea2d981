"""The one syntax rule for a metadata store's host (safeguard reshard-125).

A host the control plane stores or connects to — a store's ``host`` and ``pooler_host``, an
external binding's ``metadata_store_host``, an external target's endpoint host — is exactly one
of:

- a **DNS name**: dot-separated labels of 1..63 letters, digits and hyphens (RFC 1123: no label
  starts or ends with a hyphen), at most 253 characters in all, optionally one trailing dot
  (an absolute name); its last label is not all digits (``10.1``, ``2130706433`` or
  ``0x7f.1`` would be read by the resolver as an IPv4 address in a form no check expects);
- a **literal IPv4 address** in dotted-quad form, or a **literal IPv6 address** (without
  brackets and without a ``%`` zone id).

So nothing else slips past the denylist and the address pinning (``lib.pgadmin``): no comma
(libpq reads ``a,b`` as a list of hosts, each tried in turn), no ``/`` or leading ``@`` (libpq
reads those as a Unix-socket directory or abstract socket), no whitespace or control
character, no ``%`` zone id (a link-local address bound to an interface), no empty label, no
underscore, no non-ASCII (write an internationalised name as its ``xn--`` form).

:func:`syntax_refusal` is pure (no DNS); the API edges call it through
``reshard.engines.identity.host_refusal``, which then also resolves the name, and ``lib.pgadmin``
calls it before every connection.
"""

from __future__ import annotations

import ipaddress
import re

MAX_NAME = 253
MAX_LABEL = 63
_LABEL = re.compile(r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?")
_IPV4_QUAD = re.compile(r"\d{1,3}(?:\.\d{1,3}){3}")

FIX = (
    "write a DNS name (dot-separated labels of letters, digits and hyphens, at most 63 "
    f"characters each and {MAX_NAME} in all) or one literal IPv4 or IPv6 address"
)


def _shown(host: str) -> str:
    """``host`` as it may appear in a message: control characters escaped, length bounded."""
    text = host if len(host) <= 80 else host[:80] + "…"
    return repr(text) if any(not ch.isprintable() or ch.isspace() for ch in text) else text


def _problem(host: str) -> str | None:
    """What is wrong with ``host`` (None: it is a name or a literal address)."""
    if not host:
        return "it is empty"
    if "," in host:
        return "a comma makes it a list of hosts (libpq tries each in turn)"
    if "/" in host or host.startswith("@"):
        return "a '/' or a leading '@' makes it a Unix-socket directory"
    if any(ch.isspace() or not ch.isprintable() for ch in host):
        return "it contains whitespace or a control character"
    if "%" in host:
        return "a '%' zone id binds it to a network interface"
    if not host.isascii():
        return "it is not ASCII (write an internationalised name in its xn-- form)"
    if host.startswith("[") or host.endswith("]"):
        return "brackets belong only around an IPv6 address in host:port (write the address)"
    if ":" in host:
        try:
            ipaddress.IPv6Address(host)
        except ValueError:
            return "it contains ':' but is not an IPv6 address (give the port separately)"
        return None
    if _IPV4_QUAD.fullmatch(host):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            return "it is not a valid IPv4 address (each part 0..255, no leading zeros)"
        return None
    return _name_problem(host)


def _name_problem(host: str) -> str | None:
    name = host[:-1] if host.endswith(".") else host
    if len(name) > MAX_NAME:
        return f"it is longer than {MAX_NAME} characters"
    labels = name.split(".")
    for label in labels:
        if not label:
            return "it has an empty label (two dots in a row, or a leading dot)"
        if len(label) > MAX_LABEL:
            return f"the label {label[:20]}… is longer than {MAX_LABEL} characters"
        if not _LABEL.fullmatch(label):
            return (
                f"the label {label} has a character other than a letter, digit or hyphen, "
                "or starts or ends with a hyphen"
            )
    if labels[-1].isdigit():
        return "its last label is all digits (an IPv4 address is four dot-separated numbers)"
    return None


def syntax_refusal(field_name: str, host: str) -> str | None:
    """The message refusing ``host`` for ``field_name`` (None: it is a DNS name or a literal
    address). The message names the field, what is wrong and the fix."""
    problem = _problem(host)
    if problem is None:
        return None
    return f"{field_name}: {_shown(host)} is not a host: {problem}; {FIX}"
