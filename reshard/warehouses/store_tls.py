"""Explicit opt-ins for an sslmode weaker than ``verify-full`` (safeguard reshard-122), as the
API edges check them and the dry run shows them (docs/configuration.md "Metadata-store TLS").

Invariants:

- **verify-full unless opted in.** ``require`` and ``verify-ca`` are accepted only where the
  endpoint's opt-in exists; otherwise the edge answers 400 naming the field and the fix, before
  anything connects there.
- **Where the opt-in lives.** A registered store: its own ``tls_policy = allow-weaker`` with a
  ``tls_policy_reason`` (the database refuses a store row without it). An external endpoint (a
  warehouse's external binding, a start's external target, the source of an external reshard):
  the store registered for that ``host:port`` — normally an ``external`` store row — with
  ``tls_policy = allow-weaker`` (``models.stores.weaker_tls_store``). One opt-in per server, in
  one audited place, whatever refers to it.
- **What is shown is what is used.** :func:`summary` is ``lib.pgadmin.tls_summary``: the
  effective sslmode (an empty one is verify-full, a ``system`` CA makes every mode verify-full),
  the configured one, and who allowed a weaker one with which reason.
"""

from __future__ import annotations

from typing import Any

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.lib import pgadmin
from duckgres_admin.lib.pgadmin import Endpoint
from duckgres_admin.models.stores import MetadataStore, TlsPolicy, weaker_tls_store


def opt_in_label(store: MetadataStore) -> str:
    """``store <name>: <reason>`` (what the dry run and messages name as the opt-in)."""
    return f"store {store.name} ({store.kind}) tls_policy allow-weaker: {store.tls_policy_reason}"


def store_values_refusal(values: dict[str, Any], *, written: frozenset[str] | None) -> str | None:
    """A store write (merged ``values``; ``written`` the fields this request writes, None: a
    create): the body error when a weaker sslmode lacks the opt-in or the opt-in its reason.
    Judged whenever the request writes an sslmode or the policy (never for an unrelated edit)."""
    keys = ("sslmode", "pooler_sslmode", "tls_policy", "tls_policy_reason")
    if written is not None and not written & set(keys):
        return None
    policy = str(values.get("tls_policy") or TlsPolicy.VERIFY_FULL)
    if policy not in TlsPolicy.values:
        return f"tls_policy: must be one of {', '.join(TlsPolicy.values)}"
    allowed = policy == TlsPolicy.ALLOW_WEAKER
    if allowed and not str(values.get("tls_policy_reason") or "").strip():
        return (
            "tls_policy_reason: required with tls_policy allow-weaker (say why this server "
            "cannot be verified with verify-full, e.g. the certificate names no host)"
        )
    name = str(values.get("name") or "<this store>")
    for key in ("sslmode", "pooler_sslmode"):
        problem = pgadmin.weaker_sslmode_refusal(
            str(values.get(key) or ""),
            field=key,
            allowed=allowed,
            fix=pgadmin.store_opt_in_fix(name),
        )
        if problem:
            return problem
    return None


def endpoint_opt_in(host: str, port: int) -> MetadataStore | None:
    """The registered store that allows a weaker sslmode for ``host:port``, or None."""
    return weaker_tls_store(host, port) if host else None


def endpoint_refusal(field: str, host: str, port: int, sslmode: str) -> str | None:
    """The message refusing a weaker ``sslmode`` of an external endpoint without an opt-in."""
    mode = sslmode or pgadmin.DEFAULT_SSLMODE
    if mode not in pgadmin.WEAKER_SSLMODES:
        return None
    return pgadmin.weaker_sslmode_refusal(
        mode,
        field=field,
        allowed=endpoint_opt_in(host, port) is not None,
        fix=pgadmin.external_opt_in_fix(host, port),
    )


def require_endpoint_opt_in(field: str, host: str, port: int, sslmode: str) -> None:
    """400 :class:`ServiceError` from :func:`endpoint_refusal` (nothing connected yet)."""
    problem = endpoint_refusal(field, host, port, sslmode)
    if problem:
        raise ServiceError(400, problem)


def summary(
    host: str, port: int, sslmode: str, *, store: MetadataStore | None = None
) -> dict[str, object]:
    """What a connection to ``host:port`` uses and why (the dry run's ``tls``). ``store``: the
    registered store the endpoint belongs to (its own policy is the opt-in); else the store
    registered for the endpoint, if any."""
    endpoint = Endpoint(host, port, sslmode)
    mode = sslmode or pgadmin.DEFAULT_SSLMODE
    by = ""
    if mode in pgadmin.WEAKER_SSLMODES:
        owner = store if store is not None and store.allows_weaker_tls else None
        owner = owner or (endpoint_opt_in(host, port) if host else None)
        by = opt_in_label(owner) if owner is not None else ""
    return pgadmin.tls_summary(endpoint, weaker_allowed_by=by)
