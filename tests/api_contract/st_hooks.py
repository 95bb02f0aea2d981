"""Schemathesis hooks for the contract run (loaded through ``SCHEMATHESIS_HOOKS``).

Integer path ids (``op_id``, ``lease_id``, ``drain_id``) are routed by Django's ``<int:…>``
converter: a non-integer or negative id never matches an API route (spec §5.2), so Django's own
HTML 404 answers, outside the API and its schema. Such ids are not generated; every other
negative case (bodies, query strings, headers) is.
"""

from __future__ import annotations

from typing import Any

import schemathesis

INT_IDS = ("op_id", "lease_id", "drain_id")


def _routable(value: Any) -> bool:
    if isinstance(value, bool):
        return False
    if isinstance(value, int):
        return value >= 0
    return isinstance(value, str) and value.isascii() and value.isdigit()


@schemathesis.hook
def filter_path_parameters(context: Any, path_parameters: dict[str, Any] | None) -> bool:
    if not path_parameters:
        return True
    return all(_routable(path_parameters[key]) for key in INT_IDS if key in path_parameters)


@schemathesis.check
def api_content_type(ctx: Any, response: Any, case: Any) -> bool | None:
    """``content_type_conformance`` for every response that reached the API. The coverage phase
    also sends ids like ``null,null`` that no API route matches (the hook above cannot filter
    that phase); Django's HTML 404 for those is outside the schema by design."""
    from schemathesis.specs.openapi.checks import content_type_conformance

    params = case.path_parameters or {}
    unroutable = any(not _routable(params[key]) for key in INT_IDS if key in params)
    if response.status_code == 404 and unroutable:
        return None
    return content_type_conformance(ctx, response, case)
