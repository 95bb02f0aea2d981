"""Strict JSON body parsing: unknown keys rejected, ``invalid body: <field>: <rule>``.

Messages name the field and the rule and never echo the value (a bad field may hold a
password, spec reshard §1.11 and safeguard 51).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

from duckgres_admin.base.errors import ServiceError

_MISSING = object()


def body_error(path: str, rule: str) -> ServiceError:
    return ServiceError(400, f"invalid body: {path}: {rule}")


def join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def as_object(data: Any, path: str = "body") -> dict[str, Any]:
    if not isinstance(data, Mapping):
        raise body_error(path, "must be a JSON object")
    return dict(data)


def reject_unknown(obj: Mapping[str, Any], allowed: Iterable[str], path: str = "") -> None:
    allowed_set = set(allowed)
    for key in obj:
        if key not in allowed_set:
            if key == "dry_run":
                raise body_error(
                    "dry_run", "accepted only on POST /api/v1/warehouses/<org>/reshards"
                )
            # The key itself is named (it is not a value), truncated to keep errors bounded.
            raise body_error(join(path, str(key)[:64]), "unknown field")


def string(
    obj: Mapping[str, Any],
    key: str,
    path: str = "",
    *,
    default: str = "",
    required: bool = False,
    max_length: int | None = None,
    choices: Iterable[str] | None = None,
    strip: bool = False,
) -> str:
    value = obj.get(key, _MISSING)
    if value is _MISSING or value is None:
        if required:
            raise body_error(join(path, key), "required")
        return default
    if not isinstance(value, str):
        raise body_error(join(path, key), "must be a string")
    if strip:
        value = value.strip()
    if required and not value:
        raise body_error(join(path, key), "must not be empty")
    if max_length is not None and len(value) > max_length:
        raise body_error(join(path, key), f"must be at most {max_length} characters")
    if choices is not None:
        options = list(choices)
        if value not in options:
            raise body_error(join(path, key), f"must be one of {', '.join(options)}")
    return value


def integer(
    obj: Mapping[str, Any],
    key: str,
    path: str = "",
    *,
    default: int | None = None,
    minimum: int | None = None,
    maximum: int | None = None,
    nullable: bool = False,
) -> int | None:
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        return default
    if value is None:
        if nullable:
            return None
        raise body_error(join(path, key), "must be an integer")
    if isinstance(value, bool) or not isinstance(value, int):
        raise body_error(join(path, key), "must be an integer")
    if minimum is not None and value < minimum:
        raise body_error(join(path, key), f"must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise body_error(join(path, key), f"must be <= {maximum}")
    return value


def boolean(
    obj: Mapping[str, Any],
    key: str,
    path: str = "",
    *,
    default: bool | None = None,
    nullable: bool = False,
) -> bool | None:
    value = obj.get(key, _MISSING)
    if value is _MISSING:
        return default
    if value is None and nullable:
        return None
    if not isinstance(value, bool):
        raise body_error(join(path, key), "must be a boolean")
    return value


def query_int(raw: str | None, default: int, *, minimum: int, maximum: int) -> int:
    """A lenient query parameter: unparsable or out of range → ``default``."""
    try:
        value = int(raw) if raw is not None else default
    except ValueError:
        return default
    return value if minimum <= value <= maximum else default


def query_cursor_id(raw: str | None, name: str) -> int | None:
    """A page cursor that is an id: absent → None; anything but a positive integer → 400
    (a cursor silently reset to the first page would make a client loop)."""
    if raw is None or raw == "":
        return None
    if not re.fullmatch(r"[0-9]{1,18}", raw) or int(raw) < 1:
        raise ServiceError(
            400, f"invalid query: {name}: must be a positive integer (the cursor of a page)"
        )
    return int(raw)
