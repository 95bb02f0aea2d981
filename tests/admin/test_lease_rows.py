"""Seeded leader-lease rows (expires_at = '-infinity') are readable through the ORM and admin."""

from datetime import UTC, datetime

import pytest
from django.contrib.auth import get_user_model

from duckgres_admin.models import Lease

pytestmark = pytest.mark.django_db


def test_seeded_lease_rows_load_through_the_orm():
    rows = {lease.name: lease for lease in Lease.objects.all()}
    assert set(rows) >= {"janitor", "trino"}
    assert rows["janitor"].expires_at == datetime.min.replace(tzinfo=UTC)


def test_finite_timestamps_still_load_normally():
    Lease.objects.filter(name="janitor").update(
        expires_at=datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)
    )
    assert Lease.objects.get(name="janitor").expires_at == datetime(2030, 1, 2, 3, 4, 5, tzinfo=UTC)


def test_the_admin_lease_list_renders(client):
    user = get_user_model().objects.create_superuser("root", "root@example.com", "pw-for-tests")
    client.force_login(user)
    response = client.get("/admin/duckgres_admin/lease/")
    assert response.status_code == 200
    assert b"janitor" in response.content
