"""The janitor through a real Celery control worker (spec reshard §4.14, §6, §7; design §3):
the worker consuming ``duckgres.control`` serves the metrics, warns about a missing or drifted
beat row at start, and runs ``reshard.reconcile`` as the lease holder."""

from __future__ import annotations

import socket
import time
import urllib.request
from collections.abc import Callable
from typing import Any

import pytest
from django.conf import settings

from duckgres_admin.models import ReshardStepTiming
from duckgres_admin.platform.leadership import read_lease
from tests.fixtures.janitor import janitor_env, new_op, refresh, reset_leases, sql
from tests.fixtures.processes import CeleryWorker

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.usefixtures("janitor_env")]
assert janitor_env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
        return str(response.read().decode())


def _until(predicate: Callable[[], Any], what: str, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = predicate()
        except OSError as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        time.sleep(0.2)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}; last: {last!r}")


def test_control_worker_serves_metrics_and_reconciles_as_leader(
    celery_worker_factory: Callable[..., CeleryWorker],
) -> None:
    from django_celery_beat.models import PeriodicTask

    reset_leases()
    PeriodicTask.objects.filter(task="reshard.reconcile").delete()  # drifted: no beat row
    op = new_op("succeeded")
    timing = ReshardStepTiming.objects.create(
        operation_id=op.id, step="blocking", runner_epoch=1, outcome="ok"
    )
    sql(
        "UPDATE duckgres_reshard_operation_steps SET started_at = now() - interval '3 seconds', "
        "ended_at = now() WHERE id = %s",
        [timing.id],
    )
    sql("UPDATE duckgres_reshard_operations SET finished_at = now() WHERE id = %s", [op.id])
    port = _free_port()
    worker = celery_worker_factory(
        queues=("duckgres.control",),
        extra_env={"DUCKGRES_CONTROL_METRICS_PORT": str(port)},
    )
    body = _until(lambda: _scrape(port), "the control worker's metrics exporter")
    assert "duckgres_janitor_is_leader 0.0" in body
    # The start-up check reports the missing beat row.
    assert "no enabled beat entry runs reshard.reconcile" in worker.log_text()

    from duckgres_admin.celery import app

    app.send_task("reshard.reconcile")
    row = _until(
        lambda: (r := read_lease("janitor")) is not None and r.holder and r,
        "the control worker to take the janitor lease",
    )
    assert row.live
    assert row.epoch == 1
    assert row.holder.count(".") >= 2
    assert str(worker.proc.pid) in row.holder.split("."), "holder <host>.<pid>.<hex>"
    _until(lambda: refresh(op).metrics_observed_at is not None, "the terminal op observed")
    body = _until(
        lambda: (b := _scrape(port)) and "duckgres_janitor_is_leader 1.0" in b and b,
        "is_leader 1 on the exporter",
    )
    assert "duckgres_janitor_lease_epoch 1.0" in body
    assert (
        'duckgres_reshard_step_duration_seconds_count{direction="cnpg_to_cnpg",'
        'outcome="ok",step="blocking"} 1.0'
    ) in body
    assert settings.CELERY_TASK_ROUTES[-1]["reshard.reconcile"]["queue"] == "duckgres.control"


def test_a_default_worker_exports_nothing(
    celery_worker_factory: Callable[..., CeleryWorker],
) -> None:
    port = _free_port()
    worker = celery_worker_factory(
        queues=("duckgres.default",),
        extra_env={"DUCKGRES_CONTROL_METRICS_PORT": str(port)},
    )
    time.sleep(1.0)
    with pytest.raises(OSError):
        _scrape(port)
    assert "beat entry" not in worker.log_text()
