"""The API tests' fixtures (tests/fixtures/api.py, tests/fixtures/start.py): the API's identities
(``clients``), the Celery publish capture and the stash cleanup (both autouse here), the Trino
configuration, and the reshard start's sources (``cnpg_source``, ``external_source``)."""

from tests.fixtures.api import _clean_stash, clients, published, trino
from tests.fixtures.backups_listing import bucket
from tests.fixtures.start import cnpg_source, external_source

__all__ = [
    "_clean_stash",
    "bucket",
    "clients",
    "cnpg_source",
    "external_source",
    "published",
    "trino",
]
