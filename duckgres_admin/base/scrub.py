"""The one scrubber (spec reshard §2.7): replaces every known secret value with ``***``.

:class:`Scrubber` itself lives in ``duckgres_cli.scrub`` (the command-line client masks with
the same rules and must not import Django); this module adds what only a control-plane process
knows: its shared secrets and the secrets it holds in memory.

It is applied at the one place each sink is written (op log, process log, stored ``error``,
API error bodies, the Gateway client's and the catalog store's messages), never by callers.
Besides the raw value it replaces the forms in which secrets leak through DSNs, query strings
and URLs: URL-encoded (``%2F``, and ``+`` for spaces), and the partly encoded forms of URLs --
urllib's default ``quote`` (``/`` kept) and Django's request paths and IRIs (``repr(request)``,
``get_full_path``) -- each of those URL-encoded again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from django.conf import settings

from duckgres_cli.scrub import MASK, MIN_LENGTH, Scrubber

__all__ = [
    "MASK",
    "MIN_LENGTH",
    "Scrubber",
    "process_scrubber",
    "register_held_secrets",
    "shared_secrets",
]

_held_sources: list[Callable[[], Iterable[str]]] = []


def shared_secrets() -> list[str]:
    """The three shared secrets of this process (spec §6) and their ``_PREVIOUS`` values of a
    rotation's overlap window."""
    return [
        s
        for s in (
            settings.DUCKGRES_INTERNAL_SECRET,
            settings.DUCKGRES_RUNNER_SECRET,
            settings.DUCKGRES_DATAPLANE_SECRET,
            settings.DUCKGRES_INTERNAL_SECRET_PREVIOUS,
            settings.DUCKGRES_RUNNER_SECRET_PREVIOUS,
            settings.DUCKGRES_DATAPLANE_SECRET_PREVIOUS,
        )
        if s
    ]


def register_held_secrets(source: Callable[[], Iterable[str]]) -> None:
    """Add a source of the secrets this process holds in memory (the reshard password stash,
    registered by ``reshard.start.operations``): every :func:`process_scrubber` masks what it
    returns at that moment. Registering the same source again is a no-op."""
    if source not in _held_sources:
        _held_sources.append(source)


def process_scrubber(*extra: str) -> Scrubber:
    """A scrubber of the shared secrets, every secret held in this process's memory (the
    password stash, empty outside the API) and ``extra`` values."""
    held = [secret for source in tuple(_held_sources) for secret in source()]
    return Scrubber(*shared_secrets(), *held, *extra)
