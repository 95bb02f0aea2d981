"""The one scrubber lives in the CLI's package (``duckgres_cli.scrub``, importable without
Django) and must still mask every form Django writes a secret in: its request paths
(``escape_uri_path``) and IRIs (``iri_to_uri``), each URL-encoded again (spec reshard §2.7)."""

from __future__ import annotations

from urllib.parse import quote, quote_plus

import pytest
from django.utils.encoding import escape_uri_path, iri_to_uri

from duckgres_admin.base.scrub import Scrubber as AdminScrubber
from duckgres_cli.scrub import Scrubber

SECRETS = [
    "plain-secret-0123456789",
    "p@ss/w0rd?&=+ #%~'()*!$,;:[]",
    "ünïcødé-pässwörd-€-日本",
    'quote"back\\slash`tick<>{}|^',
]


@pytest.mark.safeguard("reshard-140")
@pytest.mark.parametrize("secret", SECRETS)
def test_every_django_form_of_a_secret_is_masked(secret):
    scrubber = Scrubber(secret)
    assert AdminScrubber is Scrubber  # one scrubber, re-exported by the control plane's base
    for form in (secret, quote(secret), escape_uri_path(secret), iri_to_uri(secret)):
        for written in (form, quote(form, safe=""), quote_plus(form)):
            text = f"GET /api/v1/x?dsn={written}&next=1"
            assert written not in scrubber.scrub(text)
            assert scrubber.scrub(text) == "GET /api/v1/x?dsn=***&next=1"
