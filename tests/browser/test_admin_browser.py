"""The operator's admin in headless Chromium (issue 6 item 2), against a live server and real
runner processes on the store clusters (5433 source, 5434 target) with a moto S3 backup.

1. Log in, start a cnpg→cnpg reshard from the form (dry-run plan first, then confirm), and
   watch the op page tail the log and fill the step timeline without a reload until the op
   succeeds. A screenshot of the page is saved in test-artifacts/.
2. Start one whose drain is held by a granted connection lease, cancel it from the page (with
   its confirmation) and see the state change to ``cancelled`` after the runner's rollback.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.contrib.auth import get_user_model
from django.utils import timezone

from duckgres_admin.models import (
    ConnectionLease,
    Operator,
    ReshardLogEntry,
    ReshardOperation,
    ReshardStepTiming,
    Warehouse,
)
from reshard.start import operations
from tests.fixtures.processes import ARTIFACTS
from tests.fixtures.rows import new_store, new_warehouse
from tests.fixtures.runner import (
    RunnerProcess,
    RunnerS3,
    runner_moto_server,
    runner_s3,
    start_runner,
)
from tests.fixtures.stores import StoreClusters, TenantCatalogFactory

__all__ = ["runner_moto_server", "runner_s3"]  # fixtures used here

pytestmark = pytest.mark.browser

OPS = "/admin/duckgres_admin/reshardoperation/"
PASSWORD = "browser-pw-for-tests"
CNPG_TO_CNPG_STEPS = 11


@pytest.fixture
def admin_login(transactional_db: None) -> str:
    user = get_user_model().objects.create_user(
        "ops-admin", "ops-admin@example.com", PASSWORD, is_staff=True
    )
    Operator.objects.create(email=user.email, role="admin")
    return user.get_username()


@pytest.fixture
def runners(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, runner_s3: RunnerS3
) -> Iterator[list[RunnerProcess]]:
    """The start service's enqueue starts a real runner process at once (what the local
    launcher does from the Celery task), against the test database and the moto S3."""
    started: list[RunnerProcess] = []

    # Two deliberate pauses (the post-block propagation wait, and a test-hook pause on entering
    # `copying`) keep the op visibly mid-flight for a few seconds each, so the page's 2 s polls
    # see lines and bars arrive in stages however fast the machine is.
    pacing = {
        "DUCKGRES_CONFIG_POLL_INTERVAL": "2",
        "DUCKGRES_RESHARD_TEST_HOOKS": "1",
        "DUCKGRES_RESHARD_TEST_PAUSE_AT": "step:copying",
        "DUCKGRES_RESHARD_TEST_PAUSE_SECONDS": "4",
    }

    def launch(op_id: int) -> None:
        started.append(
            start_runner(op_id, tmp_path / "runners", env_extra={**runner_s3.env(), **pacing})
        )

    monkeypatch.setattr(operations, "_send_launch", launch)
    yield started
    for runner in started:
        if runner.proc.poll() is None:
            runner.proc.kill()
            runner.proc.wait(10)


@pytest.fixture
def world(
    transactional_db: None,
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
    runner_s3: RunnerS3,
) -> tuple[Warehouse, str]:
    catalog = tenant_catalog(store_clusters.source)
    source = new_store(store_clusters.source)
    target = new_store(store_clusters.target)
    warehouse = new_warehouse(
        store=source, catalog=catalog, compaction_enabled=True, data_bucket=runner_s3.bucket
    )
    return warehouse, target.name


def _login(page: Any, base: str, username: str) -> None:
    page.goto(f"{base}/admin/login/?next={OPS}")
    page.fill("#id_username", username)
    page.fill("#id_password", PASSWORD)
    page.click("input[type=submit]")
    page.wait_for_url(f"**{OPS}")


def _start_from_the_form(page: Any, org: str, shard: str) -> int:
    page.click("#start-reshard-link")
    page.fill("#id_org_id", org)
    page.select_option("#id_target_type", "cnpg")
    page.fill("#id_cnpg_shard", shard)
    page.click("#plan-submit")
    page.wait_for_selector("#preflight")
    failed = page.locator("#preflight tr.preflight-failed")
    assert failed.count() == 0, page.inner_text("#preflight")
    assert "cnpg_to_cnpg" in page.inner_text("#dry-run-plan")
    assert not ReshardOperation.objects.filter(org_id=org).exists()  # the plan created nothing
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "admin-start-plan.png"), full_page=True)
    page.click("#confirm-start")
    page.wait_for_selector("#op-detail")
    op_id = int(page.get_attribute("#op-detail", "data-op-id"))
    assert ReshardOperation.objects.filter(id=op_id, org_id=org).exists()
    return op_id


def _log_count(page: Any) -> int:
    return int(page.locator("#op-log tbody tr").count())


def _wait_for(page: Any, predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        page.wait_for_timeout(250)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def test_start_watch_the_log_and_timeline_fill_until_it_succeeds(
    live_server: Any, browser_page: Any, admin_login: str, world, runners, artifacts: Path
):
    page = browser_page
    warehouse, shard = world
    _login(page, live_server.url, admin_login)
    op_id = _start_from_the_form(page, warehouse.org_id, shard)
    page.evaluate("window.__sameDocument = 'yes'")  # gone if the page ever reloads

    samples: list[tuple[int, int, str]] = []

    def sample() -> bool:
        samples.append(
            (
                _log_count(page),
                page.locator("#timeline-svg .step-bar").count(),
                page.inner_text("#op-state"),
            )
        )
        return samples[-1][2] in ("succeeded", "failed", "cancelled")

    _wait_for(page, sample, 150, "the op to finish on the page")
    state = samples[-1][2]
    runner_output = runners[0].output() if runners else ""
    assert state == "succeeded", (page.inner_text("#op-log"), runner_output)
    # Lines and bars arrived over time, on the same document (no reload).
    assert page.evaluate("window.__sameDocument") == "yes"
    log_counts = sorted({n for n, _, _ in samples})
    bar_counts = sorted({b for _, b, _ in samples})
    assert len(log_counts) >= 3, samples
    assert len(bar_counts) >= 3, samples
    _wait_for(page, lambda: "operation finished" in page.inner_text("#op-log-status"), 20,
              "the final log drain")  # fmt: skip
    page_log = page.inner_text("#op-log")
    assert "==== reshard report (succeeded) ====" in page_log
    assert "operation created by ops-admin@example.com" in page_log
    # The timeline: one bar per step, all ok, and the maintenance window marked.
    bars = page.locator("#timeline-svg .step-bar")
    assert bars.count() == CNPG_TO_CNPG_STEPS
    assert {bars.nth(i).get_attribute("data-outcome") for i in range(bars.count())} == {"ok"}
    assert page.locator("#maintenance-window").count() == 1
    assert "maintenance window" in page.inner_text("#op-timeline")
    # Progress from the progress column (the copy wrote tables_done/tables_total).
    assert page.inner_text("#op-progress [data-key=tables]") != "—"
    assert page.locator("#op-cancel").is_hidden()
    page.screenshot(path=str(artifacts / f"admin-op-{op_id}-succeeded.png"), full_page=True)
    assert Warehouse.objects.get(org_id=warehouse.org_id).metadata_store_id == shard
    # The runner's process log is JSON lines bound with the op id and the epoch (item 5).
    records = [json.loads(line) for line in runner_output.splitlines() if line.startswith("{")]
    assert any(r.get("op_id") == op_id and r.get("epoch") == 1 for r in records), runner_output


def test_cancel_a_draining_op_from_its_page(
    live_server: Any, browser_page: Any, admin_login: str, world, runners, artifacts: Path
):
    page = browser_page
    warehouse, shard = world
    # A data-plane process holds the catalog: the drain waits for it (leases are never revoked).
    ConnectionLease.objects.create(
        org_id=warehouse.org_id,
        holder="query-pod-1",
        purpose="query",
        state="granted",
        granted_at=timezone.now(),
        expires_at=timezone.now() + timedelta(minutes=30),
    )
    _login(page, live_server.url, admin_login)
    op_id = _start_from_the_form(page, warehouse.org_id, shard)
    _wait_for(page, lambda: page.inner_text("#op-step") == "draining", 60, "the drain step")
    page.click("#op-cancel")
    assert "Cancel operation" in page.inner_text("#confirm-question")
    assert ReshardOperation.objects.get(id=op_id).cancel_requested is False  # not yet
    page.click("#confirm-submit")
    page.wait_for_selector("#op-detail")
    assert "cancel requested" in page.inner_text("ul.messagelist")
    _wait_for(page, lambda: page.inner_text("#op-state") == "cancelled", 90, "the cancel")
    _wait_for(page, lambda: "cancelled" in page.inner_text("#op-log"), 20, "the cancel lines")
    assert "cancel requested by ops-admin@example.com" in page.inner_text("#op-log")
    assert page.inner_text("#op-error") == "cancelled by operator"
    assert page.locator("#timeline-svg .step-bar[data-outcome=cancelled]").count() == 1
    _wait_for(page, lambda: "operation finished" in page.inner_text("#op-log-status"), 20,
              "the final log drain")  # fmt: skip
    assert "==== reshard report (cancelled) ====" in page.inner_text("#op-log")
    page.screenshot(path=str(artifacts / f"admin-op-{op_id}-cancelled.png"), full_page=True)
    warehouse.refresh_from_db()
    assert warehouse.state == "ready"


def test_progress_and_eta_of_a_long_copy_update_live(
    live_server: Any, browser_page: Any, admin_login: str, artifacts: Path
):
    """A long copy, driven from the test (a real copy of a big catalog takes minutes): the
    progress column moves, the ETA follows the rate, and appended log lines show up."""
    page = browser_page
    store = new_store(name=f"src-{admin_login[-4:]}")
    target = new_store(name=f"dst-{admin_login[-4:]}")
    warehouse = new_warehouse(
        store=store,
        metadata_store_database="cat",
        metadata_store_user="tenant",
        metadata_store_password_ref="env:SOME_TENANT_PASSWORD",
    )
    now = timezone.now()
    op = ReshardOperation.objects.create(
        org_id=warehouse.org_id,
        source_kind="cnpg",
        from_shard=store.name,
        target_kind="cnpg",
        to_shard=target.name,
        state="running",
        step="copying",
        launcher="local",
        runner_epoch=1,
        blocked_at=now - timedelta(seconds=50),
    )
    for i, step in enumerate(("blocking", "draining", "backup_catalog", "copying")):
        ReshardStepTiming.objects.create(
            operation_id=op.id,
            step=step,
            runner_epoch=1,
            started_at=now - timedelta(seconds=50 - 10 * i),
            ended_at=None if step == "copying" else now - timedelta(seconds=40 - 10 * i),
            outcome="" if step == "copying" else "ok",
        )

    def progress(done: int) -> None:
        ReshardOperation.objects.filter(id=op.id).update(
            progress={
                "bytes_dumped": 52_428_800,
                "backup_parts": 7,
                "tables_done": done,
                "tables_total": 400,
                "rows_copied": done * 1000,
                "bytes_copied": done * 65536,
                "updated_at": timezone.now().isoformat(),
            }
        )

    progress(40)
    _login(page, live_server.url, admin_login)
    page.goto(f"{live_server.url}{OPS}{op.id}/change/")
    eta = page.locator("#op-progress [data-key=ETA]")
    _wait_for(page, lambda: "tables in" in eta.inner_text(), 15, "a first ETA")
    first = eta.inner_text()
    ReshardLogEntry.objects.create(
        operation_id=op.id, message="copied ducklake_data_file (1200 rows)", source="runner"
    )
    progress(200)
    _wait_for(page, lambda: "200 / 400" in page.inner_text("#op-progress"), 15, "new progress")
    _wait_for(page, lambda: "ducklake_data_file" in page.inner_text("#op-log"), 15, "the line")
    assert eta.inner_text() != first
    assert page.locator("#timeline-svg .step-bar[data-outcome=open]").count() == 1
    assert "(blocked)" in page.inner_text("#op-timeline")
    page.screenshot(path=str(artifacts / f"admin-op-{op.id}-copying.png"), full_page=True)
