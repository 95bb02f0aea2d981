"""The one scrubber (spec reshard §2.7): replaces every known secret value with ``***``.

It is applied at the one place each sink is written (op log, process log, stored ``error``,
API error bodies, the Gateway client's and the catalog store's messages), never by callers.
Besides the raw value it replaces the forms in which secrets leak through DSNs, query strings
and URLs: URL-encoded (``%2F``, and ``+`` for spaces), and the partly encoded forms of URLs --
urllib's default ``quote`` (``/`` kept) and Django's request paths and IRIs (``repr(request)``,
``get_full_path``) -- each of those URL-encoded again.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from urllib.parse import quote, quote_plus

from django.conf import settings
from django.utils.encoding import escape_uri_path, iri_to_uri

MASK = "***"
MIN_LENGTH = 4  # shorter values would mask ordinary text; they are not secrets we issue

_held_sources: list[Callable[[], Iterable[str]]] = []


def _forms(secret: str) -> set[str]:
    forms: set[str] = set()
    for form in (secret, quote(secret), escape_uri_path(secret), iri_to_uri(secret) or secret):
        forms.update({form, quote(form, safe=""), quote_plus(form)})
    return forms


class Scrubber:
    """A thread-safe set of secret values to mask. Values shorter than ``min_length`` chars are
    ignored (:data:`MIN_LENGTH` unless the sink's one secret is known to be safe to mask)."""

    def __init__(self, *secrets: str, min_length: int = MIN_LENGTH) -> None:
        self._lock = threading.Lock()
        self._min_length = min_length
        self._forms: set[str] = set()
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str | None) -> None:
        if not secret or len(secret) < self._min_length:
            return
        forms = _forms(secret)
        with self._lock:
            self._forms.update(forms)

    def scrub(self, text: str) -> str:
        with self._lock:
            forms = sorted(self._forms, key=len, reverse=True)
        for form in forms:
            if form in text:
                text = text.replace(form, MASK)
        return text


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
    registered by ``reshard.operations``): every :func:`process_scrubber` masks what it returns
    at that moment. Registering the same source again is a no-op."""
    if source not in _held_sources:
        _held_sources.append(source)


def process_scrubber(*extra: str) -> Scrubber:
    """A scrubber of the shared secrets, every secret held in this process's memory (the
    password stash, empty outside the API) and ``extra`` values."""
    held = [secret for source in tuple(_held_sources) for secret in source()]
    return Scrubber(*shared_secrets(), *held, *extra)
