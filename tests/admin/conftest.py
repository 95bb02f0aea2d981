"""The admin tests' fixtures: ``bucket``, a real S3 bucket this process's settings point at
(tests/fixtures/backups_listing.py)."""

from tests.fixtures.backups_listing import bucket

__all__ = ["bucket"]
