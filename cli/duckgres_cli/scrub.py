"""The one scrubber (spec reshard §2.7): replaces every known secret value with ``***``.

The control plane applies it at the one place each sink is written (op log, process log, stored
``error``, API error bodies, the Gateway client's and the catalog store's messages) through
``duckgres_admin.base.scrub``; the ``duckgres`` client applies it to every message it prints.
It lives here, in the client package, because the client must import neither Django nor Celery
and still mask exactly what the server side masks.

Besides the raw value it replaces the forms in which secrets leak through DSNs, query strings
and URLs: URL-encoded (``%2F``, and ``+`` for spaces), and the partly encoded forms of URLs --
urllib's default ``quote`` (``/`` kept) and Django's request paths and IRIs (``repr(request)``,
``get_full_path``; the safe sets below are Django's ``escape_uri_path`` and ``iri_to_uri``) --
each of those URL-encoded again.
"""

from __future__ import annotations

import threading
from urllib.parse import quote, quote_plus

MASK = "***"
MIN_LENGTH = 4  # shorter values would mask ordinary text; they are not secrets we issue

_URI_PATH_SAFE = "/:@&+$,-_.!~*'()"  # django.utils.encoding.escape_uri_path
_IRI_SAFE = "/#%[]=:;$&()+,!?*@'~"  # django.utils.encoding.iri_to_uri


def _forms(secret: str) -> set[str]:
    forms: set[str] = set()
    for form in (secret, quote(secret), quote(secret, _URI_PATH_SAFE), quote(secret, _IRI_SAFE)):
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
