"""``GET /reshards/<id>/password`` (spec §5.3, §4.17; safeguards 7, 39, 50, 79).

These ops are local-launcher ops: the caller proves the op's current runner with the one-time
credential whose digest the launcher stored (``password_pull_digest``). The runner-pod binding
(TokenReview) is in ``test_password_tokenreview.py``, the port split in ``test_pull_port.py``.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest
from django.conf import settings

from duckgres_admin.models import ReshardLogEntry
from reshard.start import stash
from reshard.start.operations import pull_credential_digest
from tests.fixtures.rows import new_op, new_store, new_warehouse

CREDENTIAL = secrets.token_hex(32)


@pytest.fixture
def running_op(db):
    store = new_store(name="pw-src")
    warehouse = new_warehouse(
        org_id="pw-org",
        store=store,
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    op = new_op(
        warehouse,
        state="running",
        runner_id="runner-a",
        runner_epoch=3,
        target_endpoint="ext.example",
        target_port=5432,
        target_user="u",
        target_database="d",
        target_password_secret_ref="env:Y",
        password_pull_digest=pull_credential_digest(CREDENTIAL),
    )
    password = secrets.token_urlsafe(30)
    stash.put(op.id, password)
    return op, password


def fetch(
    clients: Any,
    op_id: int,
    *,
    epoch: str = "3",
    runner: str = "runner-a",
    client: Any = None,
    credential: str | None = CREDENTIAL,
) -> Any:
    headers = {"HTTP_X_DUCKGRES_OP_EPOCH": epoch, "HTTP_X_DUCKGRES_RUNNER_ID": runner}
    if credential is not None:
        headers["HTTP_AUTHORIZATION"] = f"Bearer {credential}"
    return (client or clients.runner).get(f"/api/v1/reshards/{op_id}/password", **headers)


def op_lines(op_id: int) -> list[str]:
    return list(
        ReshardLogEntry.objects.filter(operation_id=op_id)
        .order_by("id")
        .values_list("message", flat=True)
    )


@pytest.mark.safeguard("reshard-39")
@pytest.mark.safeguard("reshard-7")
def test_current_runner_gets_the_password(clients, running_op):
    op, password = running_op
    response = fetch(clients, op.id)
    assert response.status_code == 200
    assert response.json() == {"password": password}
    assert response["Cache-Control"] == "no-store"
    lines = op_lines(op.id)
    assert len(lines) == 1
    assert lines[0].startswith("runner fetched the ephemeral external target password")
    assert "runner-a" in lines[0]
    assert all(password not in line and CREDENTIAL not in line for line in lines)


@pytest.mark.safeguard("reshard-79")
def test_the_first_pull_consumes_the_entry_and_the_credential(clients, running_op):
    op, password = running_op
    assert fetch(clients, op.id).status_code == 200
    assert stash.held_ids() == []
    op.refresh_from_db()
    assert op.password_pull_digest == ""
    # The same request replayed: the credential is spent (403), and there is nothing to pull.
    replay = fetch(clients, op.id)
    assert replay.status_code == 403
    assert replay.json() == {"error": "runner identity not proven for this operation"}
    assert password not in replay.content.decode()
    # Even with the credential restored on the row, the entry is gone: 404.
    type(op).objects.filter(pk=op.id).update(
        password_pull_digest=pull_credential_digest(CREDENTIAL)
    )
    assert fetch(clients, op.id).status_code == 404
    assert "already pulled once" in op_lines(op.id)[-1]


@pytest.mark.safeguard("reshard-79")
@pytest.mark.parametrize(
    "credential",
    [None, "", CREDENTIAL[:-1] + ("0" if CREDENTIAL[-1] != "0" else "1"), "x"],
    # Stable ids (the credential is random per process): pytest-xdist workers must collect
    # the same test names.
    ids=["none", "empty", "one-digit-off", "short"],
)
def test_the_runner_secret_alone_or_a_wrong_credential_is_403_and_keeps_the_entry(
    clients, running_op, credential
):
    op, password = running_op
    response = fetch(clients, op.id, credential=credential)
    assert response.status_code == 403
    assert response.json() == {"error": "runner identity not proven for this operation"}
    assert stash.get(op.id) == password
    op.refresh_from_db()
    assert op.password_pull_digest == pull_credential_digest(CREDENTIAL)
    (line,) = op_lines(op.id)
    assert "refused (403 runner identity not proven for this operation)" in line
    assert CREDENTIAL not in line
    # The real runner still pulls afterwards.
    assert fetch(clients, op.id).json() == {"password": password}


@pytest.mark.safeguard("reshard-79")
def test_an_op_without_an_outstanding_credential_is_403(clients, running_op):
    op, password = running_op
    type(op).objects.filter(pk=op.id).update(password_pull_digest="")
    assert fetch(clients, op.id).status_code == 403
    assert "no one-time pull credential is outstanding" in op_lines(op.id)[0]
    assert stash.get(op.id) == password


@pytest.mark.safeguard("reshard-50")
@pytest.mark.parametrize(
    ("epoch", "runner"),
    [("2", "runner-a"), ("4", "runner-a"), ("3", "runner-b"), ("", "runner-a"), ("3", "")],
)
def test_stale_epoch_or_other_runner_is_404(clients, running_op, epoch, runner):
    op, password = running_op
    response = fetch(clients, op.id, epoch=epoch, runner=runner)
    assert response.status_code == 404
    assert response.json() == {"error": "password not available"}
    assert password not in response.content.decode()
    (line,) = op_lines(op.id)
    assert "refused (404 password not available)" in line
    assert password not in line


@pytest.mark.safeguard("reshard-50")
def test_pending_op_is_404(clients, running_op):
    op, _ = running_op
    type(op).objects.filter(pk=op.id).update(state="pending")
    assert fetch(clients, op.id).status_code == 404
    assert "operation is pending" in op_lines(op.id)[0]


def test_terminal_op_entry_is_deleted_and_404(clients, running_op):
    op, _ = running_op
    type(op).objects.filter(pk=op.id).update(state="failed")
    assert fetch(clients, op.id).status_code == 404
    assert stash.held_ids() == []


def test_unknown_op_and_missing_entry_are_indistinguishable(clients, running_op):
    op, _ = running_op
    unknown = fetch(clients, 999999)
    stash.delete(op.id)  # the credential is right, the entry is gone
    missing = fetch(clients, op.id)
    assert unknown.status_code == missing.status_code == 404
    assert unknown.json() == missing.json() == {"error": "password not available"}
    assert op_lines(999999) == []
    assert "holds no password" in op_lines(op.id)[0]


@pytest.mark.safeguard("reshard-39")
@pytest.mark.safeguard("reshard-50")
def test_other_identities_are_403_and_logged(clients, running_op):
    op, password = running_op
    for name in ("internal", "dataplane", "admin", "superuser"):
        response = fetch(clients, op.id, client=getattr(clients, name))
        assert response.status_code == 403
        assert response.json() == {"error": "runner secret required"}
        assert password not in response.content.decode()
    assert fetch(clients, op.id, client=clients.anon).status_code == 401
    lines = op_lines(op.id)
    assert len(lines) == 4
    assert all("refused (403 runner secret required)" in line for line in lines)


def test_wrong_runner_secret_is_401(running_op):
    from rest_framework.test import APIClient

    op, _ = running_op
    client = APIClient()
    client.credentials(HTTP_X_DUCKGRES_RUNNER_SECRET=settings.DUCKGRES_RUNNER_SECRET[:-1] + "!")
    response = client.get(
        f"/api/v1/reshards/{op.id}/password",
        HTTP_X_DUCKGRES_OP_EPOCH="3",
        HTTP_X_DUCKGRES_RUNNER_ID="runner-a",
    )
    assert response.status_code == 401


def test_password_requests_prune_terminal_entries(clients, running_op):
    op, _ = running_op
    store = new_store(name="pw-other")
    other = new_op(
        new_warehouse(
            org_id="pw-other-org",
            store=store,
            metadata_store_database="d",
            metadata_store_user="u",
            metadata_store_password_ref="env:X",
        ),
        state="succeeded",
        target_endpoint="h",
        target_port=5432,
    )
    stash.put(other.id, "old-password-value")
    fetch(clients, op.id, credential="not-it")  # refused: the op's own entry stays
    assert stash.held_ids() == [op.id]
