"""What every API route module shares: the OpenAPI answer shapes of the schema and the cursor
paging of the list routes (limit, one row more to know whether a next page exists).
"""

from __future__ import annotations

from typing import Any

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter
from rest_framework.request import Request

from duckgres_admin.api import validation as v

OBJ = OpenApiTypes.OBJECT


ERRORS = {400: OBJ, 401: OBJ, 403: OBJ, 404: OBJ, 409: OBJ}


# Requests with a body: DRF's JSON parser answers 415 to any other Content-Type, and a body
# over DUCKGRES_API_MAX_BODY_BYTES is 413.
BODY_ERRORS = {**ERRORS, 413: OBJ, 415: OBJ}


# Reads: 400 for a NUL in a query parameter or a bad page cursor.
READ_ERRORS = {400: OBJ, 401: OBJ, 403: OBJ}


# Lists (docs/api.md "Pagination"): ?limit= (1..500, default 100) and a keyset cursor.
PAGE_DEFAULT = 100


PAGE_MAX = 500


LIMIT_PARAM = OpenApiParameter("limit", int, required=False)


def page_limit(request: Request) -> int:
    return v.query_int(request.query_params.get("limit"), PAGE_DEFAULT, minimum=1, maximum=PAGE_MAX)


def page_of(rows: list[Any], limit: int) -> tuple[list[Any], bool]:
    """The first ``limit`` of ``limit + 1`` rows read, and whether there are more."""
    return rows[:limit], len(rows) > limit


def bearer_credential(header: str) -> str:
    """The credential of ``Authorization: Bearer <credential>`` ('' for anything else)."""
    scheme, _, value = header.strip().partition(" ")
    return value.strip() if scheme.lower() == "bearer" else ""
