"""Platform metrics on real parts (docs/monitoring.md "Platform metrics"): the default worker's
prefork children's task outcomes served by its main process, queue depth from the real broker,
and webhook deliveries given up from the config store."""

from __future__ import annotations

import subprocess
import sys
import time
import urllib.request
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
from django.utils import timezone

from duckgres_admin.models import Notification, NotificationKind, NotificationState
from duckgres_admin.observability import metrics
from duckgres_admin.platform.queues import QueueName, TaskName
from tests.fixtures.gunicorn import free_port
from tests.fixtures.processes import process_env

ROOT = Path(__file__).resolve().parents[2]


def _scrape(port: int) -> dict[str, float]:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    return {
        line.rsplit(" ", 1)[0]: float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("duckgres_celery_tasks_total{")
    }


def _outcome(samples: dict[str, float], task: str, outcome: str) -> float:
    return sum(v for k, v in samples.items() if f'task="{task}"' in k and f'"{outcome}"' in k)


def test_the_prefork_childrens_task_outcomes_are_served_by_the_main_process(
    celery_worker_factory: Any, tmp_path: Path
) -> None:
    from duckgres_admin.celery import app

    port = free_port()
    directory = tmp_path / "emptydir" / "worker-metrics"  # as in the pod: not there yet
    celery_worker_factory(
        pool="prefork",
        extra_env={"DUCKGRES_WORKER_METRICS_DIR": str(directory),
                   "DUCKGRES_WORKER_METRICS_PORT": str(port)},
    )  # fmt: skip
    ok = app.send_task(TaskName.HOUSEKEEPING_PRUNE, queue=QueueName.DEFAULT)
    bad = app.send_task(TaskName.HOUSEKEEPING_PRUNE, kwargs={"no_such": 1}, queue=QueueName.DEFAULT)
    deadline = time.monotonic() + 60
    samples: dict[str, float] = {}
    while time.monotonic() < deadline:
        samples = _scrape(port)
        if (
            _outcome(samples, TaskName.HOUSEKEEPING_PRUNE, "failed") >= 1
            and _outcome(samples, TaskName.HOUSEKEEPING_PRUNE, "succeeded") >= 1
        ):
            break
        time.sleep(0.5)
    assert _outcome(samples, TaskName.HOUSEKEEPING_PRUNE, "succeeded") == 1, samples
    assert _outcome(samples, TaskName.HOUSEKEEPING_PRUNE, "failed") == 1, samples
    assert ok.id != bad.id
    assert list(directory.glob("*.db")), "the children wrote their counters to the directory"


def test_a_worker_start_empties_the_directory_of_a_previous_containers_files(
    tmp_path: Path,
) -> None:
    directory = tmp_path / "worker-metrics"
    directory.mkdir()
    (directory / "counter_999999.db").write_bytes(b"a previous container's counters")
    (directory / "notes.txt").write_text("not prometheus_client's: left alone")
    start = (
        "import sys; sys.argv = ['celery', '-A', 'duckgres_admin', 'worker']; import duckgres_admin"
    )
    env = process_env(DUCKGRES_WORKER_METRICS_DIR=str(directory))
    done = subprocess.run([sys.executable, "-c", start], cwd=ROOT, env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    assert sorted(p.name for p in directory.iterdir()) == ["notes.txt"]


@pytest.mark.django_db(transaction=True)
def test_queue_depth_is_read_from_the_broker_without_consuming(celery_worker_factory: Any) -> None:
    from duckgres_admin.celery import app

    celery_worker_factory(
        queues=(QueueName.CONTROL,)
    )  # flushes the broker db; consumes no direct queue
    for _ in range(3):
        app.send_task(TaskName.TRINO_POOL_TICK, queue=QueueName.TRINO)
    assert metrics.read_queue_depths()[QueueName.TRINO] == 3
    assert metrics.read_queue_depths()[QueueName.TRINO] == 3  # reading took nothing
    metrics.refresh_gauges()
    assert metrics.QUEUE_MESSAGES.labels(queue=QueueName.TRINO)._value.get() == 3


@pytest.mark.django_db
def test_deliveries_given_up_count_only_the_last_24_hours() -> None:
    now = timezone.now()
    common = {"kind": NotificationKind.RESHARD, "event": "succeeded", "payload": {}}
    for subject, state, ago in [
        (1, NotificationState.FAILED, timedelta(hours=1)),
        (2, NotificationState.FAILED, timedelta(hours=23)),
        (3, NotificationState.FAILED, timedelta(hours=25)),
        (4, NotificationState.DELIVERED, timedelta(hours=1)),
        (5, NotificationState.PENDING, timedelta(hours=1)),
    ]:
        Notification.objects.create(
            subject_id=subject, state=state, last_attempt_at=now - ago, **common
        )
    assert metrics.given_up_recently() == 2
    metrics.refresh_gauges()
    assert metrics.GIVEN_UP._value.get() == 2
