"""A janitor relaunch hands the launcher the persisted password URL (spec reshard §4.13, §4.15;
the relaunch side of safeguard reshard-79), with the real local-process launcher.

An external-target operation records its ``password_url`` once, at submit. The runner that
pulls the password may die and be relaunched by the janitor many times; every relaunch must
start a runner that knows that same URL and holds a fresh one-time pull credential whose digest
is the one on the row (the API verifies against it). The stand-in runner below prints what it
was handed: the URL from its environment and the SHA-256 of the credential it read from its
inherited pipe (never the credential itself).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from duckgres_admin.models import ReshardOperation
from duckgres_admin.platform.leadership import LeaderLease
from reshard.control.janitor import Janitor
from reshard.launchers.local import LocalLauncher
from tests.fixtures.janitor import age_op, janitor_env, op_log, refresh, stale_pending

pytestmark = pytest.mark.usefixtures("janitor_env")
assert janitor_env

STAND_IN = [
    sys.executable,
    "-c",
    "import hashlib, os, time\n"
    "url = os.environ.get('DUCKGRES_RESHARD_PASSWORD_URL', '<none>')\n"
    "fd = os.environ.get('DUCKGRES_RESHARD_PASSWORD_PULL_FD')\n"
    "credential = os.read(int(fd), 256) if fd else b''\n"
    "digest = hashlib.sha256(credential).hexdigest() if credential else '<none>'\n"
    "print('handed', url, digest, flush=True)\n"
    "time.sleep(600)\n",
]


@pytest.fixture
def local_launcher(tmp_path: Path) -> Iterator[LocalLauncher]:
    launcher = LocalLauncher(tmp_path / "runners", command=STAND_IN)
    yield launcher
    for obj in launcher.list():
        record = launcher._read(int(obj.op_id_label))
        if record:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(int(record["pid"]), signal.SIGKILL)


def _wait_for(predicate: Callable[[], bool], timeout: float = 15.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError("condition not met within the deadline")


def _handed(launcher: LocalLauncher, op_id: int) -> tuple[str, str]:
    """(password URL, credential digest) the current runner printed."""
    log = launcher.directory / f"op-{op_id}.log"
    _wait_for(lambda: log.exists() and "handed " in log.read_text())
    line = next(x for x in log.read_text().splitlines() if x.startswith("handed "))
    _, url, digest = line.split(" ")
    return url, digest


def test_a_relaunch_hands_the_launcher_the_persisted_password_url(
    local_launcher: LocalLauncher,
) -> None:
    op = stale_pending(
        target_kind="external", to_shard="", target_endpoint="db.customer.example", target_port=5432
    )
    url = f"https://admin-1.duckgres.internal:8443/api/v1/reshards/{op.id}/password"
    ReshardOperation.objects.filter(id=op.id).update(password_url=url)
    janitor = Janitor(
        LeaderLease("janitor", holder="local-test.1.00000000"),
        launcher_for=lambda kind: local_launcher,
    )

    # Tick 1: no runner yet → the first launch.
    janitor.reconcile()
    assert refresh(op).respawn_attempts == 1
    first_url, first_digest = _handed(local_launcher, op.id)
    assert first_url == url
    assert first_digest == refresh(op).password_pull_digest

    # The runner claims, then dies (SIGKILL) and its heartbeat goes stale.
    ReshardOperation.objects.filter(id=op.id).update(
        state="running", runner_epoch=1, step="copying"
    )
    age_op(op.id, heartbeat_at="1 second")
    record = local_launcher._read(op.id)
    assert record is not None
    os.killpg(int(record["pid"]), signal.SIGKILL)
    _wait_for(lambda: local_launcher.get_phase(op.id).exited)
    age_op(op.id, heartbeat_at="10 minutes")

    # Tick 2: the janitor relaunches; the new runner gets the same persisted URL and a fresh
    # one-time credential whose digest replaced the first on the row.
    janitor.reconcile()
    row = refresh(op)
    assert row.respawn_attempts == 2
    assert any(m.endswith("(attempt 2/3)") for m in op_log(op.id, "janitor"))
    second_url, second_digest = _handed(local_launcher, op.id)
    assert second_url == url
    assert row.password_url == url  # the relaunch never rewrites the recorded URL
    assert second_digest == row.password_pull_digest
    assert second_digest != first_digest
