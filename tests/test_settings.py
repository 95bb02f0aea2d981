"""Strict configuration parsing (spec reshard §6): every bad value refuses to start, naming
the variable; secret-bearing variables are named without their values."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.settings_probe import _env, start
from tests.testenv import TEST_ENV

ROOT = Path(__file__).resolve().parent.parent


def test_the_test_environment_starts():
    result = start({})
    assert result.returncode == 0, result.stderr
    assert "configured" in result.stdout


def test_a_boolean_that_does_not_parse_names_variable_and_value():
    result = start({"DUCKGRES_DEBUG": "ture"})
    assert result.returncode != 0
    assert "DUCKGRES_DEBUG='ture' is not a boolean" in result.stderr


def test_a_short_secret_is_refused_without_echoing_it():
    short = "s" * 31
    result = start({"DUCKGRES_INTERNAL_SECRET": short})
    assert result.returncode != 0
    assert "DUCKGRES_INTERNAL_SECRET must be at least 32 characters" in result.stderr
    assert short not in result.stderr


def test_equal_secrets_are_refused_naming_both_variables():
    same = "x" * 40
    result = start({"DUCKGRES_INTERNAL_SECRET": same, "DUCKGRES_DATAPLANE_SECRET": same})
    assert result.returncode != 0
    assert "DUCKGRES_INTERNAL_SECRET and DUCKGRES_DATAPLANE_SECRET are equal" in result.stderr
    assert same not in result.stderr


def test_secrets_may_come_from_files(tmp_path):
    secret_file = tmp_path / "internal"
    secret_file.write_text("f" * 40 + "\n")
    result = start(
        {"DUCKGRES_INTERNAL_SECRET": None, "DUCKGRES_INTERNAL_SECRET_FILE": str(secret_file)}
    )
    assert result.returncode == 0, result.stderr


def test_a_secret_given_both_ways_is_refused(tmp_path):
    secret_file = tmp_path / "internal"
    secret_file.write_text("f" * 40)
    result = start({"DUCKGRES_INTERNAL_SECRET_FILE": str(secret_file)})
    assert result.returncode != 0
    assert (
        "DUCKGRES_INTERNAL_SECRET and DUCKGRES_INTERNAL_SECRET_FILE are both set" in result.stderr
    )


def test_an_unreadable_secret_file_names_the_variable(tmp_path):
    result = start(
        {"DUCKGRES_INTERNAL_SECRET": None, "DUCKGRES_INTERNAL_SECRET_FILE": str(tmp_path / "nope")}
    )
    assert result.returncode != 0
    assert "DUCKGRES_INTERNAL_SECRET_FILE: cannot read" in result.stderr


def test_a_bad_config_store_dsn_is_not_echoed():
    dsn = "host=db password=hunter2-very-secret port"
    result = start({"DUCKGRES_CONFIG_STORE": dsn})
    assert result.returncode != 0
    assert "DUCKGRES_CONFIG_STORE is not a valid PostgreSQL DSN" in result.stderr
    assert "hunter2-very-secret" not in result.stderr


def test_a_config_store_port_that_is_not_a_number_is_refused():
    dsn = "postgresql://admin:hunter2-very-secret@db:notaport/x"
    result = start({"DUCKGRES_CONFIG_STORE": dsn})
    assert result.returncode != 0
    assert "DUCKGRES_CONFIG_STORE has a port that is not a number" in result.stderr
    assert "hunter2-very-secret" not in result.stderr


def test_no_broker_means_no_start_never_eager_celery():
    result = start({"DUCKGRES_BROKER_URL": None})
    assert result.returncode != 0
    assert "DUCKGRES_BROKER_URL is required" in result.stderr


def test_a_runner_needs_no_broker_and_no_internal_or_dataplane_secret():
    result = start(
        {
            "DUCKGRES_BROKER_URL": None,
            "DUCKGRES_INTERNAL_SECRET": None,
            "DUCKGRES_DATAPLANE_SECRET": None,
        },
        "reshard_runner",
    )
    assert result.returncode == 0, result.stderr


@pytest.mark.safeguard("reshard-128")
def test_a_runner_is_never_given_django_s_signing_key_and_never_reads_one():
    """Issue 25 item 3: a runner starts without DJANGO_SECRET_KEY, and one passed anyway (an
    older launcher) is not the key it holds; every other process still requires it."""
    code = (
        "import sys; sys.argv = ['manage.py', 'reshard_runner']; import django; django.setup(); "
        "from django.conf import settings; import os; "
        "print(len(settings.SECRET_KEY) >= 50, settings.SECRET_KEY == os.environ.get("
        "'DJANGO_SECRET_KEY'), settings.SECRET_KEY_FALLBACKS)"
    )
    env = {**_env(), "DJANGO_SECRET_KEY_PREVIOUS": "previous-" + "p" * 50}
    given = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert given.returncode == 0, given.stderr
    assert given.stdout.split() == ["True", "False", "[]"]
    env.pop("DJANGO_SECRET_KEY")
    without = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert without.returncode == 0, without.stderr
    assert without.stdout.split() == ["True", "False", "[]"]
    other = start({"DJANGO_SECRET_KEY": None}, "migrate")
    assert other.returncode != 0
    assert "DJANGO_SECRET_KEY is required" in other.stderr


@pytest.mark.safeguard("reshard-129")
def test_the_previous_signing_key_verifies_during_the_rotation_window():
    """Rotation with an overlap (issue 25 item 7): what the previous key signed still verifies
    while DJANGO_SECRET_KEY_PREVIOUS names it; without it, it no longer does."""
    old = "old-" + "o" * 60
    signed = subprocess.run(
        [sys.executable, "-c", "import django; django.setup(); from django.core import signing; "
         "print(signing.dumps('session-of-an-operator'))"],
        cwd=ROOT, env={**_env(), "DJANGO_SECRET_KEY": old}, capture_output=True, text=True,
        timeout=60,
    )  # fmt: skip
    assert signed.returncode == 0, signed.stderr
    token = signed.stdout.strip()
    check = (
        "import django, sys; django.setup(); from django.core import signing; "
        f"print(signing.loads({token!r}))"
    )
    new = "new-" + "n" * 60
    during = subprocess.run(
        [sys.executable, "-c", check],
        cwd=ROOT, env={**_env(), "DJANGO_SECRET_KEY": new, "DJANGO_SECRET_KEY_PREVIOUS": old},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert during.returncode == 0, during.stderr
    assert during.stdout.strip() == "session-of-an-operator"
    after = subprocess.run(
        [sys.executable, "-c", check],
        cwd=ROOT, env={**_env(), "DJANGO_SECRET_KEY": new},
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert after.returncode != 0
    assert "BadSignature" in after.stderr


def test_a_runner_with_a_password_url_needs_the_runner_secret():
    result = start(
        {
            "DUCKGRES_RUNNER_SECRET": None,
            "DUCKGRES_RESHARD_PASSWORD_URL": "http://127.0.0.1:8080/api/v1/reshards/1/password",
        },
        "reshard_runner",
    )
    assert result.returncode != 0
    assert "DUCKGRES_RUNNER_SECRET is required" in result.stderr


def test_an_unknown_launcher_is_refused():
    result = start({"DUCKGRES_RESHARD_LAUNCHER": "job"})
    assert result.returncode != 0
    assert "DUCKGRES_RESHARD_LAUNCHER='job' is not one of: local, pod" in result.stderr


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"DUCKGRES_RESHARD_STALE_SECONDS": "70", "DUCKGRES_RESHARD_HEARTBEAT_SECONDS": "30"},
            "DUCKGRES_RESHARD_STALE_SECONDS must be >= 60 + 2 x DUCKGRES_RESHARD_HEARTBEAT_SECONDS",
        ),
        (
            {"DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS": "600"},
            "DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS must be < 600",
        ),
        ({"DUCKGRES_RESHARD_POLL_SECONDS": "0"}, "DUCKGRES_RESHARD_POLL_SECONDS='0' must be >= 1"),
        ({"DUCKGRES_RESHARD_MAX_PARTS": "10001"}, "DUCKGRES_RESHARD_MAX_PARTS='10001' must be <="),
        ({"DUCKGRES_RESHARD_HEARTBEAT_SECONDS": "soon"}, "is not an integer"),
        (
            {
                "DUCKGRES_JANITOR_LEASE_SECONDS": "60",
                "DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS": "60",
            },
            "DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS must be < DUCKGRES_JANITOR_LEASE_SECONDS",
        ),
    ],
)
def test_thresholds_are_checked_at_start(overrides, message):
    result = start(overrides)
    assert result.returncode != 0
    assert message in result.stderr


def test_all_problems_are_reported_together():
    result = start({"DUCKGRES_DEBUG": "yes", "DUCKGRES_RESHARD_LAUNCHER": "job"})
    assert "DUCKGRES_DEBUG" in result.stderr
    assert "DUCKGRES_RESHARD_LAUNCHER" in result.stderr


def test_an_invalid_flip_timeout_is_a_warning_not_a_refusal():
    code = (
        "import django; django.setup(); from django.conf import settings; "
        "print(settings.DUCKGRES_RESHARD_FLIP_TIMEOUT, settings.CONFIG_WARNINGS)"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUCKGRES_", "DJANGO_"))}
    env.update(TEST_ENV)
    env["DUCKGRES_RESHARD_FLIP_TIMEOUT"] = "soonish"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("900 ")
    assert "DUCKGRES_RESHARD_FLIP_TIMEOUT='soonish' is not a duration" in result.stdout
