"""Strict JSON for the operator-supplied documents: the cell registry and the pool blueprint.

One decoder and one problem collector, shared by ``trino_pools.registry`` (spec trino-pools
§6.2) and ``trino_pools.blueprint`` (§6.3):

- **One document.** ``json.JSONDecoder().raw_decode`` on the text without leading whitespace,
  then a whitespace-only remainder check: a second document is refused.
- **No duplicate keys**, in any object at any depth (the first duplicate found is reported).
- **Unknown fields** are reported per key, sorted, with the allowed set (``Problems.keys``);
  a parser can word a key differently by overriding ``Problems.unknown_field``.
- **Integers are not booleans** (``is_int``).
- ``NaN``, ``Infinity`` and ``-Infinity`` decode as Python floats, as ``json`` does; the field
  checks of each parser refuse them where another type is expected.

Every problem is one sentence ``<prefix><path>: <problem>; <fix>``; the operator-facing texts
are asserted by the tests, so keep them byte for byte.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class StrictJSONError(ValueError):
    """The text is not exactly one JSON document without duplicate keys (a problem at ``$``)."""

    def __init__(self, problem: str, fix: str) -> None:
        self.path = "$"
        self.problem = problem
        self.fix = fix
        super().__init__(f"{self.path}: {problem}; {fix}")


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise _DuplicateKey(key)
        result[key] = value
    return result


def decode_document(text: str) -> Any:
    """Decode exactly one JSON document; raises ``StrictJSONError`` (path ``$``) otherwise."""
    decoder = json.JSONDecoder(object_pairs_hook=_no_duplicates)
    stripped = text.lstrip()
    try:
        document, end = decoder.raw_decode(stripped)
    except _DuplicateKey as exc:
        raise StrictJSONError(
            f'duplicate key "{exc.key}"', "keep exactly one occurrence of each key"
        ) from None
    except json.JSONDecodeError as exc:
        raise StrictJSONError(
            f"not valid JSON ({exc.msg} at line {exc.lineno} column {exc.colno})",
            "fix the JSON syntax",
        ) from None
    except RecursionError:  # deep nesting, well under any size limit
        raise StrictJSONError(
            "the JSON is nested too deeply to decode", "remove the excess nesting"
        ) from None
    if stripped[end:].strip():
        raise StrictJSONError("must contain one JSON document", "remove everything after the first")
    return document


def is_int(value: object) -> bool:
    """A JSON integer: an ``int`` that is not a ``bool``."""
    return isinstance(value, int) and not isinstance(value, bool)


class Problems:
    """Every problem found in one document, in order; ``prefix`` starts each sentence."""

    def __init__(self, source: str, *, prefix: str = "") -> None:
        self.source = source
        self.prefix = prefix
        self.problems: list[str] = []

    def fail(self, path: str, problem: str, fix: str) -> None:
        self.problems.append(f"{self.prefix}{path}: {problem}; {fix}")

    def unknown_field(self, path: str, key: str, allowed: frozenset[str]) -> None:
        self.fail(
            f"{path}.{key}",
            f'unknown field "{key}"',
            f"remove it (allowed fields: {', '.join(sorted(allowed))})",
        )

    def keys(self, obj: Mapping[str, Any], path: str, allowed: frozenset[str]) -> None:
        for key in sorted(set(obj) - allowed):
            self.unknown_field(path, key, allowed)
