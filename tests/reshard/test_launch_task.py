"""The launch task and service (spec reshard §4.13, safeguard 40), the Celery wiring of the
reshard tasks (§6) and the control worker's start-up checks (design §3)."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from reshard.control import metrics, worker
from reshard.control.launch import launch_runner
from reshard.launchers.base import StillTerminating
from reshard.launchers.capture import CAPTURE_HEADER
from reshard.tasks import launch_runner_task, reconcile_task
from tests.fixtures.janitor import (
    FakeLauncher,
    age_op,
    janitor_env,
    new_op,
    op_log,
    refresh,
)

pytestmark = pytest.mark.usefixtures("janitor_env")
assert janitor_env


def launch(op_id: int, launcher: FakeLauncher) -> str:
    return launch_runner(op_id, launcher_for=lambda kind: launcher)


@pytest.mark.safeguard("reshard-40")
def test_duplicate_delivery_never_touches_the_live_runner() -> None:
    op = new_op("pending")
    launcher = FakeLauncher()
    assert launch(op.id, launcher) == "launched"
    first = launcher.runners[op.id]
    assert launcher.creates() == [("create", op.id, False)], "create(op, replace=False)"

    # The second delivery, before the runner claimed: the op is still pending.
    assert launch(op.id, launcher) == "already-running"
    assert launcher.runners[op.id].uid == first.uid, "one runner, same uid"
    assert len(launcher.creates()) == 1
    assert launcher.deletes() == []

    # ... and after it claimed (fresh heartbeat): nothing to do at all.
    type(op).objects.filter(id=op.id).update(state="running", runner_epoch=1)
    age_op(op.id, heartbeat_at="5 seconds")
    assert launch(op.id, launcher) == "not-needed"
    assert launcher.runners[op.id].uid == first.uid
    assert launcher.deletes() == []
    assert op_log(op.id) == []


@pytest.mark.safeguard("reshard-40")
def test_a_racing_delivery_that_meets_a_live_runner_in_create_leaves_it_alone() -> None:
    """The launcher's own create(replace=False) refusal is the second line of defence."""
    op = new_op("pending")
    launcher = FakeLauncher()
    live = launcher.put(op.id, "Running", uid="live")
    launcher.runners.clear()  # the phase read does not see it yet

    def phase_then_appear(name: str, op_id: int) -> None:
        if name == "create":
            launcher.runners[op_id] = live  # another delivery won the race

    launcher.on_call = phase_then_appear
    assert launch(op.id, launcher) == "already-running"
    assert launcher.runners[op.id].uid == "live"
    assert launcher.deletes() == []
    assert op_log(op.id) == []


def test_launcher_semantics_create_without_replace_refuses_a_live_runner() -> None:
    op = new_op("pending")
    launcher = FakeLauncher()
    launcher.put(op.id, "Running", uid="live")
    with pytest.raises(StillTerminating) as info:
        launcher.create(op, replace=False)
    assert info.value.existing is not None
    assert info.value.existing.uid == "live"


def test_an_exited_runner_is_captured_and_deleted_before_the_new_one() -> None:
    op = new_op("running", step="blocking", runner_epoch=1)
    age_op(op.id, heartbeat_at="10 minutes")
    launcher = FakeLauncher()
    launcher.put(op.id, "Failed", uid="old", reason="exit code 1")
    launcher.logs[op.id] = "boom\n"
    assert launch(op.id, launcher) == "launched"
    assert op_log(op.id, "pod-log")[0] == CAPTURE_HEADER
    assert "boom" in op_log(op.id, "pod-log")
    assert launcher.deletes(op.id) == [("delete", op.id, None)]
    assert launcher.runners[op.id].uid != "old"


@pytest.mark.parametrize("state", ["succeeded", "failed", "cancelled"])
def test_terminal_ops_are_never_launched(state: str) -> None:
    op = new_op(state)
    launcher = FakeLauncher()
    assert launch(op.id, launcher) == "not-needed"
    assert launcher.calls == []


def test_a_missing_op_is_a_no_op() -> None:
    launcher = FakeLauncher()
    assert launch(987_654_321, launcher) == "missing"
    assert launcher.calls == []


def test_a_launch_failure_is_an_op_log_error_and_the_op_stays_pending() -> None:
    op = new_op("pending")
    launcher = FakeLauncher()
    launcher.create_error = RuntimeError("cannot read own control-plane pod cp-0: Forbidden")
    assert launch(op.id, launcher) == "failed"
    assert refresh(op).state == "pending"
    assert refresh(op).respawn_attempts == 0
    line = "launching the reshard runner failed: cannot read own control-plane pod cp-0: Forbidden"
    assert line in op_log(op.id)


def test_launch_errors_are_scrubbed() -> None:
    op = new_op("pending")
    launcher = FakeLauncher()
    from django.conf import settings

    launcher.create_error = RuntimeError(f"bad env {settings.DUCKGRES_INTERNAL_SECRET}")
    launch(op.id, launcher)
    assert settings.DUCKGRES_INTERNAL_SECRET not in " ".join(op_log(op.id))
    assert "launching the reshard runner failed: bad env ***" in op_log(op.id)


@pytest.mark.safeguard("reshard-92")
def test_task_options_and_routing() -> None:
    from duckgres_admin.celery import app

    assert launch_runner_task.name == "reshard.launch_runner"
    assert launch_runner_task.acks_late is True
    assert not getattr(launch_runner_task, "autoretry_for", ())
    assert launch_runner_task.max_retries == 0
    assert reconcile_task.name == "reshard.reconcile"
    assert reconcile_task.acks_late is False
    table = app.conf.task_routes[-1]
    assert table["reshard.launch_runner"] == {"queue": "duckgres.default"}
    assert table["reshard.reconcile"]["queue"] == "duckgres.control"
    assert app.conf.task_always_eager is False
    launch_route = app.amqp.router.route({}, "reshard.launch_runner")
    assert launch_route["queue"].name == "duckgres.default"
    assert launch_route["queue"].exchange.type == "direct"
    # The janitor's ticks are broadcast to every control-worker replica; the route declares
    # the fanout exchange so that the publisher does not take it for a direct one.
    reconcile_route = app.amqp.router.route({}, "reshard.reconcile")
    assert reconcile_route["queue"].alias == "duckgres.control"
    assert reconcile_route["queue"].exchange.type == "fanout"
    assert [e.type for e in reconcile_route["declare"]] == ["fanout"]
    # Any task a sender addresses to the broadcast queue by name declares it too (beat's row
    # names the queue; so do the admin's "run task" action and `celery call`).
    named = app.amqp.router.route({"queue": "duckgres.control"}, "duckgres.some_probe")
    assert named["queue"].exchange.type == "fanout"
    assert [e.type for e in named["declare"]] == ["fanout"]
    assert "declare" not in app.amqp.router.route({"queue": "duckgres.default"}, "x.y")
    # The op id is the message's only argument.
    assert launch_runner_task.s(42).args == (42,)


def _consumer(*queues: str) -> Any:
    return SimpleNamespace(
        app=SimpleNamespace(
            amqp=SimpleNamespace(queues=SimpleNamespace(consume_from={q: None for q in queues}))
        )
    )


def test_beat_row_as_migrated_has_no_drift() -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every, _ = IntervalSchedule.objects.get_or_create(every=30, period="seconds")
    PeriodicTask.objects.update_or_create(
        name="duckgres: reshard janitor (every 30 s)",
        defaults={
            "task": "reshard.reconcile",
            "interval": every,
            "queue": "duckgres.control",
            "expire_seconds": 30,
            "enabled": True,
        },
    )
    assert worker.beat_drift_warnings() == []


def test_beat_row_drift_is_reported(caplog: pytest.LogCaptureFixture) -> None:
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    every, _ = IntervalSchedule.objects.get_or_create(every=2, period="minutes")
    PeriodicTask.objects.filter(task="reshard.reconcile").delete()
    PeriodicTask.objects.create(
        name="janitor drifted",
        task="reshard.reconcile",
        interval=every,
        queue="duckgres.control",
        expire_seconds=30,
    )
    warnings = worker.beat_drift_warnings()
    assert any("runs every 120 s; expected 30 s" in w for w in warnings)
    # One warning per cause: expire_seconds is judged once the interval is right.
    assert not any("expire_seconds" in w for w in warnings)
    PeriodicTask.objects.filter(name="janitor drifted").update(
        interval=IntervalSchedule.objects.get_or_create(every=30, period="seconds")[0],
        expire_seconds=60,
    )
    assert [w for w in worker.beat_drift_warnings() if "expire_seconds" in w] == [
        "beat entry 'janitor drifted' for reshard.reconcile has expire_seconds=60; it must "
        "equal the interval (30 s)"
    ]
    PeriodicTask.objects.filter(name="janitor drifted").update(interval=every, expire_seconds=30)
    with caplog.at_level("WARNING", logger="duckgres.reshard.worker"):
        worker.on_worker_ready(sender=_consumer("duckgres.control"))
    assert "runs every 120 s" in caplog.text


def test_a_missing_beat_row_is_reported() -> None:
    from django_celery_beat.models import PeriodicTask

    PeriodicTask.objects.filter(task="reshard.reconcile").delete()
    assert any("never run" in w for w in worker.beat_drift_warnings())


def test_worker_ready_acts_only_on_the_control_worker(monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[int | None] = []

    def fake_start(port: int | None = None) -> bool:
        started.append(port)
        return True

    monkeypatch.setattr(metrics, "start_exporter", fake_start)
    worker.on_worker_ready(sender=_consumer("duckgres.default"))
    assert started == []
    worker.on_worker_ready(sender=_consumer("duckgres.control"))
    assert started == [None]


def test_exporter_port_zero_is_disabled(settings: Any) -> None:
    settings.DUCKGRES_CONTROL_METRICS_PORT = 0
    assert metrics.start_exporter() is False


EXPORTER_CHILD = """
import sys, urllib.request, django
django.setup()
from reshard.control import metrics
port = int(sys.argv[1])
first, second = metrics.start_exporter(port), metrics.start_exporter(port)
print(first, second)
print(urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode())
"""


def test_exporter_serves_the_reshard_metrics() -> None:
    """In a fresh process (the exporter starts once per process, as in a worker)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    result = subprocess.run(
        [sys.executable, "-c", EXPORTER_CHILD, str(port)],
        cwd=Path(__file__).resolve().parents[2],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    flags, _, body = result.stdout.partition("\n")
    assert flags == "True False", "started once per process"
    for name in (
        "duckgres_reshard_active_operations",
        "duckgres_reshard_stale_operations",
        "duckgres_reshard_recovery_required_operations",
        "duckgres_janitor_is_leader",
        "duckgres_janitor_lease_epoch",
    ):
        assert f"\n{name} " in body
