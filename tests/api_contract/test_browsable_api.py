"""The browsable API for staff (issue 6 item 3), and a regression test for the fuzzer's find: a
NUL in an unknown body key was echoed into the audit detail and broke its INSERT (a 500)."""

from __future__ import annotations

import pytest
from django.conf import settings
from django.contrib.auth import get_user_model

from duckgres_admin.models import Operator

pytestmark = pytest.mark.django_db


def _staff(client, role: str = "viewer"):
    user = get_user_model().objects.create_user(
        f"api-{role}", f"api-{role}@example.com", "pw-for-tests", is_staff=True
    )
    Operator.objects.create(email=user.email, role=role)
    client.force_login(user)
    return user


def test_staff_browse_the_api_in_html(client):
    _staff(client)
    response = client.get("/api/v1/reshards", HTTP_ACCEPT="text/html")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/html")
    assert b"Django REST framework" in response.content
    assert b"operations" in response.content


def test_the_browsable_api_gives_nothing_without_a_login(client):
    response = client.get("/api/v1/warehouses", HTTP_ACCEPT="text/html")
    assert response.status_code == 401


def test_a_viewer_cannot_mutate_through_the_browsable_api(client):
    _staff(client, "viewer")
    response = client.post("/api/v1/reshards/1/cancel", HTTP_ACCEPT="application/json")
    assert response.status_code == 403
    assert response.json() == {"error": "admin role required"}


def test_a_nul_in_a_body_key_is_a_400_not_a_500(client):
    client.raise_request_exception = False
    response = client.post(
        "/api/v1/metadata-stores",
        data='{"a\\u0000b": 1}',
        content_type="application/json",
        HTTP_X_DUCKGRES_INTERNAL_SECRET=settings.DUCKGRES_INTERNAL_SECRET,
    )
    assert response.status_code == 400
