"""A local runner pulls with its one-time credential, and nothing else does (safeguard reshard-79).

The API runs in ``live_server`` (this process, so the stash is this process's). The local
launcher starts a real child process (its test-only ``command``: a short script that uses the
runner's own ``take_inherited_credential`` and ``pull_password``); the test reads the child's
``/proc/<pid>/environ`` and ``cmdline`` while the child holds the credential, starts an
impostor with exactly that environment, and then lets the child pull and replay its request.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from duckgres_admin.models import ReshardOperation
from reshard.launchers.local import LocalLauncher
from reshard.start import stash
from reshard.start.operations import pull_credential_digest
from tests.fixtures.processes import stop_local_runners
from tests.fixtures.rows import new_op, new_store, new_warehouse

pytestmark = [pytest.mark.safeguard("reshard-79"), pytest.mark.timeout(120)]

# The child: read the credential exactly as a runner does (at start, from the pipe), report
# its digest (never the value) and pid, wait for "go", pull, then replay the same request.
CHILD = r"""
import hashlib, json, os, sys, threading, time
from reshard.runner.password import (
    PasswordPullError, PullRequest, pull_password, take_inherited_credential,
)
credential = take_inherited_credential()
state = os.environ["DUCKGRES_RESHARD_LOCAL_STATE_DIR"]
op = os.environ["DUCKGRES_RESHARD_OP_ID"]
out = os.path.join(state, f"child-{op}.json")
def report(**kw):
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        json.dump(kw, f)
    os.replace(tmp, out)
digest = hashlib.sha256(credential.encode()).hexdigest() if credential else ""
report(pid=os.getpid(), digest=digest)
while not os.path.exists(os.path.join(state, f"go-{op}")):
    time.sleep(0.02)
request = PullRequest(
    url=os.environ["DUCKGRES_RESHARD_PASSWORD_URL"],
    runner_secret=os.environ["DUCKGRES_RUNNER_SECRET"],
    epoch=int(sys.argv[1]),
    runner_id=os.environ["POD_NAME"],
    credential=credential,
)
def attempt():
    try:
        return "ok:" + pull_password(request, threading.Event(), attempts=1)
    except PasswordPullError as exc:
        return "error:" + str(exc)
first = attempt()
replay = attempt()
report(pid=os.getpid(), first=first, replay=replay)
"""

# The impostor: the same environment, no inherited pipe.
IMPOSTOR = r"""
import os, sys, threading
from reshard.runner.password import (
    PasswordPullError, PullRequest, pull_password, take_inherited_credential,
)
request = PullRequest(
    url=os.environ["DUCKGRES_RESHARD_PASSWORD_URL"],
    runner_secret=os.environ["DUCKGRES_RUNNER_SECRET"],
    epoch=int(sys.argv[1]),
    runner_id=os.environ["POD_NAME"],
    credential=take_inherited_credential(),
)
try:
    pull_password(request, threading.Event(), attempts=1)
    print("ok")
except PasswordPullError as exc:
    print("error:" + str(exc))
"""


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "runners"
    try:
        yield directory
    finally:
        if directory.exists():
            stop_local_runners(directory, grace=0.5)


def wait_for_json(path: Path, key: str, seconds: float = 30.0) -> dict[str, object]:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if path.exists():
            data = json.loads(path.read_text())
            if key in data:
                return dict(data)
        time.sleep(0.02)
    raise AssertionError(f"no {key} in {path} within {seconds} s")


def test_only_the_launched_child_pulls_once_with_its_one_time_credential(
    live_server, settings, state_dir, monkeypatch
):
    monkeypatch.setenv("DUCKGRES_RUNNER_SECRET", settings.DUCKGRES_RUNNER_SECRET)
    warehouse = new_warehouse(
        org_id="pull-local",
        store=new_store(name="pull-local-src"),
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    op = new_op(
        warehouse,
        state="pending",
        target_endpoint="ext.example",
        target_port=5432,
        target_user="u",
        target_database="d",
        target_password_secret_ref="env:Y",
    )
    ReshardOperation.objects.filter(pk=op.id).update(
        password_url=f"{live_server.url}/api/v1/reshards/{op.id}/password"
    )
    op.refresh_from_db()
    password = "the-external-target-password-" + os.urandom(8).hex()
    stash.put(op.id, password)

    launcher = LocalLauncher(state_dir, command=[sys.executable, "-c", CHILD, "1"])
    launcher.create(op, replace=False)
    report = state_dir / f"child-{op.id}.json"
    started = wait_for_json(report, "digest")
    pid = int(str(started["pid"]))
    # The child got the credential the launcher issued: its digest is the one on the row.
    op.refresh_from_db()
    assert op.password_pull_digest
    assert started["digest"] == op.password_pull_digest
    # What the claim does: the child is the op's current runner, epoch 1.
    ReshardOperation.objects.filter(pk=op.id).update(
        state="running", runner_id=f"duckgres-reshard-op-{op.id}", runner_epoch=1
    )

    # The credential is neither in the child's environment nor in its argv.
    environ_raw = Path(f"/proc/{pid}/environ").read_bytes()
    cmdline_raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    child_env = dict(item.split("=", 1) for item in environ_raw.decode().split("\0") if "=" in item)
    for name, value in child_env.items():
        assert pull_credential_digest(value) != op.password_pull_digest, name
    for arg in cmdline_raw.decode().split("\0"):
        assert pull_credential_digest(arg) != op.password_pull_digest
    assert "DUCKGRES_RESHARD_PASSWORD_PULL_FD" in child_env  # only the fd number is

    # A process with exactly the child's environment (no pipe) is refused; the entry stays.
    impostor = subprocess.run(
        [sys.executable, "-c", IMPOSTOR, "1"],
        env=child_env,
        cwd=settings.BASE_DIR,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert impostor.stdout.startswith("error:password pull refused (HTTP 403"), (
        impostor.stdout + impostor.stderr
    )
    assert stash.get(op.id) == password

    # The child pulls once; its replay of the very same request is refused.
    (state_dir / f"go-{op.id}").touch()
    done = wait_for_json(report, "replay")
    assert done["first"] == f"ok:{password}"
    assert str(done["replay"]).startswith("error:password pull refused (HTTP 403"), done
    assert stash.get(op.id) is None
    op.refresh_from_db()
    assert op.password_pull_digest == ""
