"""The scrubber (spec reshard §2.7): replaces every known secret value with ``***``.

It is applied at the one place each sink is written (op log, process log, stored ``error``,
API error bodies), never by callers. Besides the raw value it also replaces the URL-encoded
form, because secrets leak through DSNs and query strings in that shape.
"""

from __future__ import annotations

import threading
from urllib.parse import quote, quote_plus

from django.conf import settings

MASK = "***"


class Scrubber:
    """A thread-safe set of secret values to mask. Values shorter than 4 chars are ignored."""

    def __init__(self, *secrets: str) -> None:
        self._lock = threading.Lock()
        self._forms: set[str] = set()
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str | None) -> None:
        if not secret or len(secret) < 4:
            return
        with self._lock:
            self._forms.update({secret, quote(secret, safe=""), quote_plus(secret)})

    def scrub(self, text: str) -> str:
        with self._lock:
            forms = sorted(self._forms, key=len, reverse=True)
        for form in forms:
            if form in text:
                text = text.replace(form, MASK)
        return text


def shared_secrets() -> list[str]:
    """The three shared secrets of this process (spec §6)."""
    return [
        s
        for s in (
            settings.DUCKGRES_INTERNAL_SECRET,
            settings.DUCKGRES_RUNNER_SECRET,
            settings.DUCKGRES_DATAPLANE_SECRET,
        )
        if s
    ]


def process_scrubber(*extra: str) -> Scrubber:
    """A scrubber preloaded with the shared secrets plus ``extra`` values."""
    return Scrubber(*shared_secrets(), *extra)
