"""The copy mode at the API's edge (docs/api.md, docs/copy.md "Online copy"): a start names it
or takes ``DUCKGRES_RESHARD_COPY_MODE``; online is honoured where the stores allow it and
otherwise the operation runs offline saying why; the dry run reports the mode, its reason and
its steps; a bad value is refused naming the field; a restore has no online mode."""

from __future__ import annotations

from typing import Any

import pytest

from duckgres_admin.models import ReshardOperation
from reshard.operation import sequences
from tests.fixtures.api import error
from tests.fixtures.start import Setup, external_target_body


def _cnpg(setup: Setup, **body: Any) -> dict[str, Any]:
    return {"target": {"type": "cnpg", "cnpg_shard": setup.target_store.name}, **body}


def test_an_online_start_is_frozen_on_the_operation(clients, published, cnpg_source, settings):
    settings.DUCKGRES_RESHARD_ONLINE_BACKUP = "before_flip"
    response = clients.admin.post(
        cnpg_source.path, _cnpg(cnpg_source, copy_mode="online"), format="json"
    )
    assert response.status_code == 202, response.content
    body = response.json()
    assert (body["copy_mode"], body["copy_mode_reason"]) == ("online", "online (requested)")
    assert body["backup_after_unblock"] is False
    op = ReshardOperation.objects.get(id=body["id"])
    assert op.copy_variant == "online-backup-first"


def test_the_setting_is_the_default_and_a_request_overrides_it(
    clients, published, cnpg_source, settings
):
    settings.DUCKGRES_RESHARD_COPY_MODE = "online"
    response = clients.admin.post(cnpg_source.path, _cnpg(cnpg_source), format="json")
    assert response.status_code == 202, response.content
    body = response.json()
    assert body["copy_mode_reason"] == "online (DUCKGRES_RESHARD_COPY_MODE)"
    assert body["backup_after_unblock"] is True
    ReshardOperation.objects.filter(id=body["id"]).update(state="cancelled")
    response = clients.admin.post(
        cnpg_source.path, _cnpg(cnpg_source, copy_mode="offline"), format="json"
    )
    assert response.status_code == 202, response.content
    assert response.json()["copy_mode_reason"] == "offline (requested)"


def test_online_to_an_external_store_runs_offline_and_says_why(
    clients, published, cnpg_source, tenant_catalog
):
    ext = tenant_catalog(cnpg_source.clusters.target, with_tables=False)
    body = {**external_target_body(ext), "copy_mode": "online", "dry_run": True}
    response = clients.internal.post(cnpg_source.path, body, format="json")
    assert response.status_code == 200, response.content
    plan = response.json()
    assert plan["copy_mode"]["mode"] == "offline"
    assert (
        "the online mode moves cnpg → cnpg only (this is cnpg → external)"
        in (plan["copy_mode"]["reason"])
    )
    assert plan["steps"] == list(sequences.CNPG_TO_EXTERNAL)


def test_an_online_dry_run_plans_the_online_steps(clients, published, cnpg_source):
    response = clients.internal.post(
        cnpg_source.path, _cnpg(cnpg_source, copy_mode="online", dry_run=True), format="json"
    )
    assert response.status_code == 200, response.content
    plan = response.json()
    assert plan["copy_mode"] == {
        "mode": "online",
        "reason": "online (requested)",
        "backup": "after_unblock",
    }
    assert plan["steps"] == list(sequences.ONLINE_CNPG_TO_CNPG)
    assert "target login is ready" in plan["cancel_cutoff"]
    assert ReshardOperation.objects.count() == 0


@pytest.mark.parametrize("value", ["fast", 1, True])
def test_a_bad_copy_mode_is_refused_naming_the_field(clients, published, cnpg_source, value):
    response = clients.admin.post(
        cnpg_source.path, _cnpg(cnpg_source, copy_mode=value), format="json"
    )
    assert response.status_code == 400
    assert error(response).startswith("invalid body: copy_mode: ")
    assert ReshardOperation.objects.count() == 0


def test_a_restore_refuses_a_copy_mode(clients, published, cnpg_source):
    response = clients.admin.post(
        f"/api/v1/warehouses/{cnpg_source.org}/restores",
        {**_cnpg(cnpg_source, copy_mode="online"), "backup_key": "x"},
        format="json",
    )
    assert response.status_code == 400
    assert error(response) == "invalid body: copy_mode: unknown field"
