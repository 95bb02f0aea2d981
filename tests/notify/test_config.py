"""The webhook's environment: validated at start, naming the variable, never the value."""

from __future__ import annotations

import subprocess
import sys

import pytest

from duckgres_admin.notifications.config import from_env
from duckgres_admin.platform.config import EnvReader
from tests.fixtures.processes import ROOT

SECRET = "w" * 40
SLACKISH = "https://hooks.example.com/services/T0/B0/s3cr3tpathtoken"


def _parse(**env: str):
    reader = EnvReader(env)
    return from_env(reader, shared_secrets=("x" * 40,)), reader


def test_unset_url_turns_notifications_off():
    config, reader = _parse()
    assert not config.enabled
    assert reader.errors == []


@pytest.mark.parametrize(
    "url",
    [SLACKISH, "http://127.0.0.1:8099/hook", "http://localhost/hook", "http://[::1]:1/x"],
)
def test_https_and_loopback_http_are_accepted(url):
    config, reader = _parse(DUCKGRES_WEBHOOK_URL=url, DUCKGRES_WEBHOOK_SECRET=SECRET)
    assert reader.errors == []
    assert config.enabled
    assert config.url == url
    assert config.format == "json"
    assert "s3cr3t" not in repr(config)
    assert SECRET not in repr(config)
    assert "s3cr3t" not in config.destination


@pytest.mark.safeguard("reshard-89")
@pytest.mark.parametrize(
    ("url", "fragment"),
    [
        ("http://hooks.example.com/s3cr3tpath", "must use https://"),
        ("ftp://hooks.example.com/s3cr3tpath", "absolute https:// URL"),
        ("https://user:s3cr3tpw@hooks.example.com/", "must not carry credentials"),
        ("https://hooks.example.com:99999/s3cr3tpath", "not a valid URL"),
        ("s3cr3tpath", "absolute https:// URL"),
    ],
)
def test_a_bad_url_is_refused_naming_the_variable_never_the_value(url, fragment):
    _config, reader = _parse(DUCKGRES_WEBHOOK_URL=url, DUCKGRES_WEBHOOK_SECRET=SECRET)
    assert len(reader.errors) == 1, reader.errors
    assert reader.errors[0].startswith("DUCKGRES_WEBHOOK_URL ")
    assert fragment in reader.errors[0]
    assert "s3cr3t" not in reader.errors[0]


@pytest.mark.safeguard("reshard-89")
def test_the_secret_is_required_long_and_its_own(tmp_path):
    _c, reader = _parse(DUCKGRES_WEBHOOK_URL=SLACKISH)
    assert reader.errors == [
        "DUCKGRES_WEBHOOK_SECRET is required when DUCKGRES_WEBHOOK_URL is set (every delivery "
        "is signed)"
    ]
    _c, reader = _parse(DUCKGRES_WEBHOOK_URL=SLACKISH, DUCKGRES_WEBHOOK_SECRET="short-s3cr3t")
    assert reader.errors == ["DUCKGRES_WEBHOOK_SECRET must be at least 32 characters"]
    _c, reader = _parse(DUCKGRES_WEBHOOK_URL=SLACKISH, DUCKGRES_WEBHOOK_SECRET="x" * 40)
    assert "equals one of the shared secrets" in reader.errors[0]
    # _FILE forms, and both at once refused.
    secret_file = tmp_path / "secret"
    secret_file.write_text(SECRET + "\n")
    url_file = tmp_path / "url"
    url_file.write_text(SLACKISH + "\n")
    config, reader = _parse(
        DUCKGRES_WEBHOOK_URL_FILE=str(url_file), DUCKGRES_WEBHOOK_SECRET_FILE=str(secret_file)
    )
    assert reader.errors == []
    assert config.url == SLACKISH
    assert config.secret == SECRET
    _c, reader = _parse(
        DUCKGRES_WEBHOOK_URL=SLACKISH,
        DUCKGRES_WEBHOOK_SECRET=SECRET,
        DUCKGRES_WEBHOOK_SECRET_FILE=str(secret_file),
    )
    assert reader.errors == [
        "DUCKGRES_WEBHOOK_SECRET and DUCKGRES_WEBHOOK_SECRET_FILE are both set: supply exactly one"
    ]
    _c, reader = _parse(
        DUCKGRES_WEBHOOK_URL=SLACKISH, DUCKGRES_WEBHOOK_SECRET=SECRET, DUCKGRES_WEBHOOK_FORMAT="xml"
    )
    assert reader.errors == ["DUCKGRES_WEBHOOK_FORMAT='xml' is not one of: json, slack"]


@pytest.mark.safeguard("reshard-89")
def test_a_process_with_a_bad_webhook_url_refuses_to_start():
    """The real settings import: the process exits before doing anything, naming the variable."""
    import os

    env = dict(os.environ)
    env.update(
        DUCKGRES_WEBHOOK_URL="http://hooks.example.com/s3cr3tpath",
        DUCKGRES_WEBHOOK_SECRET=SECRET,
    )
    proc = subprocess.run(
        [sys.executable, "manage.py", "check"],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    output = proc.stdout + proc.stderr
    assert proc.returncode != 0
    assert "invalid configuration:" in output
    assert "DUCKGRES_WEBHOOK_URL must use https://" in output
    assert "s3cr3t" not in output
    assert SECRET not in output
