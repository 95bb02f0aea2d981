"""Rotating a shared secret with an overlap window (docs/configuration.md "Rotating a shared
secret"): while ``<NAME>_PREVIOUS`` holds the old value the API accepts it beside the new one
(counted, so an operator sees when it is no longer used), and refuses it once the setting is
removed; the settings refuse a bad ``_PREVIOUS`` value without echoing it; the scrubber and the
secret-reference denylist know the previous values too."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework.test import APIClient

from duckgres_admin.api import auth
from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.lib import secretrefs
from duckgres_admin.models import AuditRecord
from tests.fixtures.settings_probe import start

OLD = "the-old-value-of-a-rotated-secret-0123456789"

# (secret variable, header, a request of a route that takes it) → the status once proven.
CASES = [
    (
        "DUCKGRES_INTERNAL_SECRET",
        "HTTP_X_DUCKGRES_INTERNAL_SECRET",
        ("get", "/api/v1/reshards", {}),
        200,
    ),
    (
        "DUCKGRES_RUNNER_SECRET",
        "HTTP_X_DUCKGRES_RUNNER_SECRET",
        (
            "get",
            "/api/v1/reshards/999999/password",
            {"HTTP_X_DUCKGRES_OP_EPOCH": "1", "HTTP_X_DUCKGRES_RUNNER_ID": "r"},
        ),
        404,
    ),
    (
        "DUCKGRES_DATAPLANE_SECRET",
        "HTTP_X_DUCKGRES_DATAPLANE_SECRET",
        ("post", "/api/v1/warehouses/no-such-org/leases", {}),
        404,
    ),
]


def send(header: str, value: str, request: tuple[str, str, dict[str, Any]]):
    method, path, extra = request
    client = APIClient()
    client.credentials(**{header: value})
    if method == "post":
        return client.post(path, {"holder": "h", "purpose": "query"}, format="json", **extra)
    return client.get(path, **extra)


def accepted_count(variable: str) -> float:
    return float(auth.PREVIOUS_SECRET_ACCEPTED.labels(secret=variable)._value.get())


@pytest.mark.safeguard("reshard-121")
@pytest.mark.parametrize(("variable", "header", "request_", "proven"), CASES)
def test_the_previous_value_is_accepted_only_during_the_overlap(
    db, settings, variable, header, request_, proven
):
    current = getattr(settings, variable)
    # Before the rotation: the old value is just a wrong secret.
    assert send(header, OLD, request_).status_code == 401
    # Overlap: both values are accepted; only the old one is counted.
    setattr(settings, f"{variable}_PREVIOUS", OLD)
    before = accepted_count(variable)
    assert send(header, OLD, request_).status_code == proven
    assert accepted_count(variable) == before + 1
    assert send(header, current, request_).status_code == proven
    assert accepted_count(variable) == before + 1
    assert send(header, OLD[:-1] + "!", request_).status_code == 401
    # After: _PREVIOUS removed, the old value is refused again.
    setattr(settings, f"{variable}_PREVIOUS", "")
    assert send(header, OLD, request_).status_code == 401
    assert send(header, current, request_).status_code == proven


@pytest.mark.safeguard("reshard-121")
def test_the_previous_internal_secret_writes_as_internal_secret_and_is_scrubbed(db, settings):
    settings.DUCKGRES_INTERNAL_SECRET_PREVIOUS = OLD
    client = APIClient()
    client.credentials(HTTP_X_DUCKGRES_INTERNAL_SECRET=OLD)
    response = client.post("/api/v1/warehouses", {"org_id": "rotated"}, format="json")
    assert response.status_code == 201, response.content
    audit = AuditRecord.objects.get()
    assert (audit.actor, audit.source) == ("internal-secret", "internal-secret")
    assert process_scrubber().scrub(f"boom {OLD} boom") == "boom *** boom"
    # A previous value on a route that does not take it is still a foreign secret: 403.
    settings.DUCKGRES_RUNNER_SECRET_PREVIOUS = OLD + "-runner"
    client = APIClient()
    client.credentials(HTTP_X_DUCKGRES_RUNNER_SECRET=OLD + "-runner")
    assert client.get("/api/v1/reshards").status_code == 403


@pytest.mark.safeguard("reshard-121")
def test_a_previous_variable_is_never_readable_through_a_reference():
    for name in ("INTERNAL", "RUNNER", "DATAPLANE"):
        parsed = secretrefs.parse(f"env:DUCKGRES_{name}_SECRET_PREVIOUS")
        assert secretrefs.denied_reason(parsed) is not None


@pytest.mark.safeguard("reshard-121")
def test_the_settings_check_previous_values_without_echoing_them(tmp_path):
    from tests.testenv import TEST_ENV

    ok = start({"DUCKGRES_INTERNAL_SECRET_PREVIOUS": OLD})
    assert ok.returncode == 0, ok.stderr
    path = tmp_path / "previous"
    path.write_text(OLD + "\n")
    from_file = start({"DUCKGRES_RUNNER_SECRET_PREVIOUS_FILE": str(path)})
    assert from_file.returncode == 0, from_file.stderr

    short = "s" * 31
    result = start({"DUCKGRES_RUNNER_SECRET_PREVIOUS": short})
    assert result.returncode != 0
    assert "DUCKGRES_RUNNER_SECRET_PREVIOUS must be at least 32 characters" in result.stderr
    assert short not in result.stderr

    same = TEST_ENV["DUCKGRES_DATAPLANE_SECRET"]
    result = start({"DUCKGRES_DATAPLANE_SECRET_PREVIOUS": same})
    assert result.returncode != 0
    assert (
        "DUCKGRES_DATAPLANE_SECRET_PREVIOUS equals DUCKGRES_DATAPLANE_SECRET: set the new value"
        in result.stderr
    )
    assert same not in result.stderr

    other = TEST_ENV["DUCKGRES_RUNNER_SECRET"]
    result = start({"DUCKGRES_INTERNAL_SECRET_PREVIOUS": other})
    assert result.returncode != 0
    assert "DUCKGRES_RUNNER_SECRET and DUCKGRES_INTERNAL_SECRET_PREVIOUS are equal" in result.stderr
    assert other not in result.stderr
