"""The admin tests' fixtures: ``viewer_client`` and ``admin_client``, logged-in staff
(tests/fixtures/admin.py), and ``bucket``, a real S3 bucket this process's settings point at
(tests/fixtures/backups_listing.py)."""

from tests.fixtures.admin import admin_client, viewer_client
from tests.fixtures.backups_listing import bucket

__all__ = ["admin_client", "bucket", "viewer_client"]
