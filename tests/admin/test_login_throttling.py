"""Admin login throttling (issue 25 item 4): django-axes as configured in
``duckgres_admin/settings.py`` (docs/configuration.md "Admin login throttling").

``DUCKGRES_ADMIN_LOGIN_FAILURE_LIMIT`` failed logins for one username lock it out, even with the
right password, until ``DUCKGRES_ADMIN_LOGIN_COOLOFF_SECONDS`` after the failure that set the
lock; an attempt during the lock is refused and does not extend it; a success clears the count;
other usernames are not affected. The cool-off is shortened here through the setting, the
password hasher made cheap (the lock does not depend on it): the sleeps are real.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from axes.models import AccessAttempt  # type: ignore[import-untyped]
from django.test import Client

from tests.fixtures.admin import staff_user
from tests.fixtures.api import clients
from tests.fixtures.settings_probe import settings_printed

__all__ = ["clients"]  # the API's identities (tests/fixtures/api.py), a fixture

LOGIN = "/admin/login/?next=/admin/"
PASSWORD = "pw-for-tests"  # tests/fixtures/admin.py
WRONG = "guess-7f3a9c"
COOLOFF_SECONDS = 8.0
LOCKED = b"Account locked: too many login attempts. Please try again later."


def login(username: str, password: str) -> Any:
    """One login on a fresh client (no session carried over)."""
    return Client().post(LOGIN, {"username": username, "password": password, "next": "/admin/"})


def logged_in(response: Any) -> bool:
    return bool(response.status_code == 302 and response["Location"] == "/admin/")


@pytest.fixture
def quick(settings: Any) -> Any:
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    settings.AXES_COOLOFF_TIME = COOLOFF_SECONDS / 3600
    return settings


@pytest.mark.safeguard("reshard-118")
@pytest.mark.django_db
def test_failed_logins_lock_the_username_out_for_the_cooloff(quick: Any):
    limit = quick.AXES_FAILURE_LIMIT
    assert limit == quick.DUCKGRES_ADMIN_LOGIN_FAILURE_LIMIT == 5
    user = staff_user(superuser=True).username
    other = staff_user(superuser=True).username
    # Under the limit nothing is locked, and a success clears the count.
    for _ in range(limit - 1):
        assert login(user, WRONG).status_code == 200  # the form again, with its error
    assert logged_in(login(user, PASSWORD))
    for _ in range(limit - 1):
        assert login(user, WRONG).status_code == 200
    before = time.monotonic()
    assert login(user, WRONG).status_code == 429  # the limit-th failure sets the lock
    after = time.monotonic()
    # Locked: the right password is refused (429) without being checked.
    locked = login(user, PASSWORD)
    assert locked.status_code == 429
    assert locked.content == LOCKED
    # What is recorded names the username, never the password tried.
    [row] = AccessAttempt.objects.filter(username=user)
    assert row.failures_since_start == limit
    assert WRONG not in row.post_data
    assert "password=" in row.post_data
    # Per username: another account logs in meanwhile.
    assert logged_in(login(other, PASSWORD))
    # Still locked shortly before the cool-off ends; this attempt does not extend the lock.
    time.sleep(max(after + 1.0 - time.monotonic(), 0))
    assert time.monotonic() < before + COOLOFF_SECONDS - 1, "the test machine is too slow"
    assert login(user, PASSWORD).status_code == 429
    # One cool-off after the failure that set the lock (not after the later attempts), it ends.
    time.sleep(max(after + COOLOFF_SECONDS + 0.5 - time.monotonic(), 0))
    assert logged_in(login(user, PASSWORD))


@pytest.mark.safeguard("reshard-118")
@pytest.mark.django_db
def test_the_api_is_not_throttled_by_admin_lockouts(quick: Any, clients: Any):
    """Only the admin site's login is counted: the API authenticates by its own means."""
    user = staff_user("admin").username
    for _ in range(quick.AXES_FAILURE_LIMIT):
        login(user, "wrong")
    assert login(user, PASSWORD).status_code == 429
    assert clients.internal.get("/api/v1/warehouses").status_code == 200


@pytest.mark.safeguard("reshard-118")
def test_the_limit_and_the_cooloff_come_from_the_environment():
    names = ("AXES_FAILURE_LIMIT", "AXES_COOLOFF_TIME", "AXES_LOCKOUT_PARAMETERS")
    result = settings_printed({}, *names)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(" ", 2) == ["5", "0.25", "['username']\n"]
    env = {"DUCKGRES_ADMIN_LOGIN_FAILURE_LIMIT": "3", "DUCKGRES_ADMIN_LOGIN_COOLOFF_SECONDS": "90"}
    result = settings_printed(env, *names)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split(" ", 2) == ["3", "0.025", "['username']\n"]
    result = settings_printed({"DUCKGRES_ADMIN_LOGIN_FAILURE_LIMIT": "0"}, "DEBUG")
    assert result.returncode != 0
    assert "DUCKGRES_ADMIN_LOGIN_FAILURE_LIMIT='0' must be >= 1" in result.stderr
