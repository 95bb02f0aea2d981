"""A failed CSRF check on the admin login names the setting that fixes it (issue 26 item 2: the
first look over plain HTTP at the Service name answered a bare 403)."""

from __future__ import annotations

import re
from typing import Any

import pytest
from django.test import Client


@pytest.fixture
def secure_cookies(settings: Any) -> None:
    settings.CSRF_COOKIE_SECURE = True
    settings.SESSION_COOKIE_SECURE = True
    settings.ALLOWED_HOSTS = ["duckgres-admin-api", "localhost"]


@pytest.mark.django_db
def test_plain_http_without_the_secure_cookie_names_the_fix(secure_cookies: None) -> None:
    browser = Client(enforce_csrf_checks=True, HTTP_HOST="duckgres-admin-api:8080")
    form = browser.get("/admin/login/")
    assert form.status_code == 200
    assert form.cookies["csrftoken"]["secure"]
    # A browser keeps a Secure cookie from a plain-HTTP page at this name, and never sends it.
    answer = Client(enforce_csrf_checks=True, HTTP_HOST="duckgres-admin-api:8080").post(
        "/admin/login/", {"username": "a", "password": "b"}
    )
    body = answer.content.decode()
    assert answer.status_code == 403
    assert "CSRF cookie not set" in body
    assert "plain HTTP at duckgres-admin-api:8080" in body
    assert "DUCKGRES_SECURE_COOKIES=false" in body
    assert "http://localhost:8080" in body


@pytest.mark.django_db
def test_an_untrusted_origin_names_the_trusted_origins_setting(secure_cookies: None) -> None:
    browser = Client(enforce_csrf_checks=True, HTTP_HOST="localhost:8080")
    form = browser.get("/admin/login/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.content.decode())
    assert token
    answer = browser.post(
        "/admin/login/",
        {"csrfmiddlewaretoken": token[1], "username": "a", "password": "b"},
        HTTP_ORIGIN="https://<b>admin</b>.example.test",
    )
    body = answer.content.decode()
    assert answer.status_code == 403
    assert "DUCKGRES_CSRF_TRUSTED_ORIGINS" in body
    assert "<b>admin</b>" not in body  # the request's own bytes are escaped
