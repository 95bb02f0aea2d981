"""The local-process launcher (spec reshard §4.13; safeguards 40, 56, 57) with real child processes.

Lifecycle tests use a small python child through the test-only ``command`` override (a child
that ignores SIGTERM, or exits with a code); one test starts the real ``manage.py
reshard_runner`` for an already-terminal op and reads its exit file.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict

from duckgres_admin.models import ReshardOperation
from reshard.launchers import login
from reshard.launchers.base import StillTerminating
from reshard.launchers.local import LocalLauncher, process_start_time, runner_env
from tests.fixtures.processes import child_config_store_dsn, stop_local_runners

# A child that records its environment, then behaves as told by MODE.
CHILD = r"""
import json, os, signal, sys, time
state = os.environ["DUCKGRES_RESHARD_LOCAL_STATE_DIR"]
op = os.environ["DUCKGRES_RESHARD_OP_ID"]
with open(os.path.join(state, f"env-{op}.json"), "w") as f:
    json.dump(dict(os.environ), f)
mode = sys.argv[1]
print("runner line 1", flush=True)
if mode == "ignore-term":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    open(os.path.join(state, f"ready-{op}"), "w").close()
    time.sleep(600)
elif mode == "honour-term":
    open(os.path.join(state, f"ready-{op}"), "w").close()
    time.sleep(600)
elif mode.startswith("exit-"):
    code = int(mode[5:])
    with open(os.path.join(state, f"op-{op}.exit"), "w") as f:
        f.write(f"{code}\n")
    sys.exit(code)
elif mode == "exit-slow":
    with open(os.path.join(state, f"op-{op}.exit"), "w") as f:
        f.write("0\n")
    time.sleep(0.5)
elif mode == "die":
    os._exit(7)
elif mode == "chatty":
    sys.stdout.write("x" * 10000 + "THE-END\n")
"""


def child(mode: str) -> list[str]:
    return [sys.executable, "-c", CHILD, mode]


@pytest.fixture(autouse=True)
def _login_without_a_config_store(request: pytest.FixtureRequest, monkeypatch) -> None:
    """Tests of the process lifecycle with unsaved ops and stand-in children have no config
    store to mint a login on, nor a warehouse to scope an S3 session to: the mint is replaced
    by a fixed DSN and the warehouse has no bucket (the one seam). Tests with a database mint
    both for real."""
    if request.node.get_closest_marker("django_db") or "make_op" in request.fixturenames:
        return
    monkeypatch.setattr(
        "reshard.launchers.local.login.mint", lambda op_id: "postgresql://runner-login@h/db"
    )
    monkeypatch.setattr("reshard.launchers.local.s3scope.for_launch", lambda op: None)


@pytest.fixture
def state_dir(tmp_path: Path) -> Iterator[Path]:
    directory = tmp_path / "runners"
    try:
        yield directory
    finally:
        if directory.exists():
            stop_local_runners(directory, grace=0.5)


def unsaved_op(**fields: Any) -> ReshardOperation:
    fields.setdefault("id", int(time.time_ns() % 10**9) + 1)
    fields.setdefault("launcher", "local")
    return ReshardOperation(**fields)


def wait_for(predicate, timeout: float = 20.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(0.05)


def record(state_dir: Path, op_id: int) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((state_dir / f"op-{op_id}.json").read_text())
    return data


def alive(pid: int) -> bool:
    info = process_start_time(pid)
    return info is not None and info[1] != "Z"


@pytest.mark.safeguard("reshard-56")
@pytest.mark.safeguard("reshard-128")
def test_the_env_contract_is_built_from_the_allowlist_and_env_refs():
    environ = {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PYTHONPATH": "/app",
        "VIRTUAL_ENV": "/app/.venv",
        "DJANGO_SETTINGS_MODULE": "duckgres_admin.settings",
        "DJANGO_SECRET_KEY": "k" * 40,
        "DJANGO_SECRET_KEY_PREVIOUS": "p" * 40,
        "DUCKGRES_CONFIG_STORE": "postgresql://u@h/db",
        "DUCKGRES_RUNNER_SECRET_FILE": "/run/secrets/runner",
        "DUCKGRES_INTERNAL_SECRET": "i" * 40,
        "DUCKGRES_DATAPLANE_SECRET": "d" * 40,
        "DUCKGRES_BROKER_URL": "redis://x",
        "DUCKGRES_RESHARD_POD_CPU": "4",
        "DUCKGRES_RESHARD_STALE_SECONDS": "62",
        "DUCKGRES_LOG_LEVEL_FILE": "/not/secret-bearing",
        "SRC_PW": "source-password",
        "TGT_PW": "target-password",
        "PROV_PW": "provisioner-password",
        "UNRELATED": "x",
    }
    op = unsaved_op(
        id=5,
        source_password_secret_ref="env:SRC_PW",
        target_password_secret_ref="env:TGT_PW",
        password_url="http://127.0.0.1:8080/api/v1/reshards/5/password",
    )
    env = runner_env(
        op,
        environ,
        directory=Path("/state"),
        uid="local-1-2",
        secret_refs=[
            "env:PROV_PW",
            "k8s:ns/s#k",
            "env:DUCKGRES_INTERNAL_SECRET",
            "env:DJANGO_SECRET_KEY",
        ],
    )
    # Never Django's signing key (issue 25 item 3), not even named by a secret reference.
    assert env == {
        "PATH": "/usr/bin",
        "HOME": "/root",
        "LANG": "C.UTF-8",
        "PYTHONPATH": "/app",
        "VIRTUAL_ENV": "/app/.venv",
        "DJANGO_SETTINGS_MODULE": "duckgres_admin.settings",
        "DUCKGRES_CONFIG_STORE": "postgresql://u@h/db",
        "DUCKGRES_RUNNER_SECRET_FILE": "/run/secrets/runner",
        "DUCKGRES_RESHARD_STALE_SECONDS": "62",
        "SRC_PW": "source-password",
        "TGT_PW": "target-password",
        "PROV_PW": "provisioner-password",
        "DUCKGRES_RESHARD_LOCAL_STATE_DIR": "/state",
        "DUCKGRES_RESHARD_LAUNCHER": "local",
        "DUCKGRES_RESHARD_OP_ID": "5",
        "POD_NAME": "duckgres-reshard-op-5",
        "POD_UID": "local-1-2",
        "DUCKGRES_RESHARD_PASSWORD_URL": "http://127.0.0.1:8080/api/v1/reshards/5/password",
    }


@pytest.mark.safeguard("reshard-56")
@pytest.mark.safeguard("reshard-133")
def test_a_started_runner_gets_the_stores_env_refs(
    state_dir, make_store, make_warehouse, make_op, monkeypatch
):
    monkeypatch.setenv("DUCKGRES_TEST_PROVISIONER_PASSWORD", "prov-src")
    monkeypatch.setenv("DUCKGRES_TEST_TARGET_PROVISIONER", "prov-dst")
    monkeypatch.setenv("DUCKGRES_TEST_TENANT_PW", "tenant-pw")
    monkeypatch.setenv("DUCKGRES_TEST_NOT_REFERENCED", "x")
    source = make_store()
    target = make_store(provisioner_password_ref="env:DUCKGRES_TEST_TARGET_PROVISIONER")
    warehouse = make_warehouse(
        store=source,
        metadata_store_database="cat",
        metadata_store_user="tenant",
        metadata_store_password_ref="env:DUCKGRES_TEST_TENANT_PW",
    )
    op = make_op(warehouse, to_store=target)
    launcher = LocalLauncher(state_dir, command=child("exit-0"))
    launcher.create(op, replace=False)
    env_file = state_dir / f"env-{op.id}.json"
    wait_for(env_file.exists, what="the child's environment dump")
    wait_for(lambda: launcher.get_phase(op.id).phase == "Succeeded", what="exit")
    env = json.loads(env_file.read_text())
    assert env["DUCKGRES_TEST_PROVISIONER_PASSWORD"] == "prov-src"
    assert env["DUCKGRES_TEST_TARGET_PROVISIONER"] == "prov-dst"
    assert env["DUCKGRES_TEST_TENANT_PW"] == "tenant-pw"
    assert "DUCKGRES_TEST_NOT_REFERENCED" not in env
    assert "DUCKGRES_INTERNAL_SECRET" not in env
    assert "DUCKGRES_DATAPLANE_SECRET" not in env
    assert env["POD_NAME"] == f"duckgres-reshard-op-{op.id}"
    assert env["POD_UID"] == record(state_dir, op.id)["uid"]
    assert env["POD_UID"].startswith("local-")
    assert env["DUCKGRES_RESHARD_LOCAL_STATE_DIR"] == str(state_dir)
    # Its own config-store login, never the worker's (safeguard reshard-133).
    assert conninfo_to_dict(env["DUCKGRES_CONFIG_STORE"])["user"] == login.role_name(op.id)
    assert login.role_name(op.id) in login.logins()
    login.drop(login.role_name(op.id))


def launched_env(state_dir, make_store, make_warehouse, make_op, bucket: str):
    """Launch a stand-in runner for a new op of a warehouse with ``bucket``; its environment."""
    warehouse = make_warehouse(
        store=make_store(),
        data_bucket=bucket,
        metadata_store_database="cat",
        metadata_store_user="tenant",
        metadata_store_password_ref="env:X",
    )
    op = make_op(warehouse, to_store=make_store())
    LocalLauncher(state_dir, command=child("exit-0")).create(op, replace=False)
    env_file = state_dir / f"env-{op.id}.json"
    wait_for(env_file.exists, what="the child's environment dump")
    login.drop(login.role_name(op.id))
    return op, json.loads(env_file.read_text())


@pytest.mark.safeguard("reshard-137")
@pytest.mark.parametrize("scope", ["operation", "ambient"])
def test_a_started_runner_holds_its_operations_s3_session_not_the_launchers_keys(
    scope, state_dir, make_store, make_warehouse, make_op, s3_bucket, monkeypatch, settings
):
    for name, value in s3_bucket.env().items():
        monkeypatch.setenv(name, value)
    settings.DUCKGRES_S3_ENDPOINT_URL = s3_bucket.endpoint_url  # STS is asked there too
    settings.DUCKGRES_AWS_REGION = s3_bucket.region
    settings.DUCKGRES_RUNNER_S3_CREDENTIALS = scope
    op, env = launched_env(state_dir, make_store, make_warehouse, make_op, s3_bucket.bucket)
    if scope == "ambient":
        assert env["AWS_ACCESS_KEY_ID"] == s3_bucket.env()["AWS_ACCESS_KEY_ID"]
        assert "AWS_SESSION_TOKEN" not in env
        assert "DUCKGRES_RESHARD_S3_SESSION" not in env
        return
    # A session minted for this launch (moto: a federation token), never the launcher's keys.
    assert env["AWS_ACCESS_KEY_ID"] != s3_bucket.env()["AWS_ACCESS_KEY_ID"]
    assert env["AWS_SECRET_ACCESS_KEY"] != s3_bucket.env()["AWS_SECRET_ACCESS_KEY"]
    assert env["AWS_SESSION_TOKEN"]
    session = env["DUCKGRES_RESHARD_S3_SESSION"]
    assert f"bucket {s3_bucket.bucket}, own keys _reshard_catalog_backups/op-{op.id}-*" in session
    assert "federation token" in session
    assert env["AWS_SESSION_TOKEN"] not in session


@pytest.mark.safeguard("reshard-137")
def test_a_warehouse_without_a_bucket_gives_its_runner_no_s3_credentials(
    state_dir, make_store, make_warehouse, make_op, s3_bucket, monkeypatch
):
    for name, value in s3_bucket.env().items():
        monkeypatch.setenv(name, value)
    _, env = launched_env(state_dir, make_store, make_warehouse, make_op, "")
    assert not {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"} & set(env)


@pytest.mark.safeguard("reshard-57")
def test_delete_never_blocks_sigterm_now_sigkill_after_the_grace(state_dir):
    launcher = LocalLauncher(state_dir, command=child("ignore-term"))
    op = unsaved_op()
    launcher.create(op, replace=False)
    wait_for((state_dir / f"ready-{op.id}").exists, what="the child to ignore SIGTERM")
    pid = record(state_dir, op.id)["pid"]
    assert os.getpgid(pid) == pid  # its own process group (new session)

    started = time.monotonic()
    launcher.delete(op.id)
    assert time.monotonic() - started < 1.0
    meta = record(state_dir, op.id)
    assert meta["sigterm_at"] is not None
    assert meta["grace_seconds"] == 600
    time.sleep(0.3)
    assert alive(pid)  # SIGTERM ignored
    status = launcher.get_phase(op.id)
    assert (status.phase, status.terminating) == ("Running", True)

    launcher.delete(op.id)  # a tick within the grace: nothing more
    time.sleep(0.2)
    assert alive(pid)
    assert record(state_dir, op.id)["sigterm_at"] == meta["sigterm_at"]

    # A later tick after the grace: SIGKILL, files removed once it is gone.
    meta["sigterm_at"] = (datetime.now(UTC) - timedelta(seconds=601)).isoformat()
    (state_dir / f"op-{op.id}.json").write_text(json.dumps(meta))
    started = time.monotonic()
    launcher.delete(op.id)
    assert time.monotonic() - started < 2.0
    wait_for(lambda: not alive(pid), what="the SIGKILLed child to vanish")
    launcher.delete(op.id)  # idempotent; removes files if the first call raced the reaper
    assert not (state_dir / f"op-{op.id}.json").exists()
    assert not (state_dir / f"op-{op.id}.log").exists()
    assert launcher.get_phase(op.id).phase == "absent"


def test_a_runner_honouring_sigterm_is_removed_on_the_next_delete(state_dir):
    launcher = LocalLauncher(state_dir, command=child("honour-term"))
    op = unsaved_op()
    launcher.create(op, replace=False)
    wait_for((state_dir / f"ready-{op.id}").exists, what="the child to start")
    pid = record(state_dir, op.id)["pid"]
    launcher.delete(op.id, grace_seconds=30)
    wait_for(lambda: not alive(pid), what="the child to exit on SIGTERM")
    status = launcher.get_phase(op.id)
    assert status.phase == "Failed"
    assert "killed" in status.reason
    launcher.delete(op.id)
    assert launcher.get_phase(op.id).phase == "absent"
    assert list(state_dir.glob(f"op-{op.id}.*")) == []


@pytest.mark.parametrize(
    ("mode", "phase", "reason"),
    [
        ("exit-0", "Succeeded", "exit code 0"),
        ("exit-3", "Failed", "exit code 3"),
        ("die", "Failed", "killed (the runner exited without writing its exit code)"),
    ],
)
def test_phase_comes_from_the_exit_file_else_killed(state_dir, mode, phase, reason):
    launcher = LocalLauncher(state_dir, command=child(mode))
    op = unsaved_op()
    created = launcher.create(op, replace=False)
    assert created.phase == "Running"
    wait_for(lambda: launcher.get_phase(op.id).exited, what=f"{mode} to exit")
    status = launcher.get_phase(op.id)
    assert (status.phase, status.reason, status.terminating) == (phase, reason, False)
    assert status.uid == created.uid
    assert status.spawned_at == created.spawned_at
    assert launcher.read_log(op.id).startswith("runner line 1")


def test_delete_right_after_the_exit_file_waits_for_the_exit_instead_of_signalling(state_dir):
    """The launch task deletes an exited runner and creates a new one at once."""
    launcher = LocalLauncher(state_dir, command=child("exit-slow"))
    op = unsaved_op()
    launcher.create(op, replace=False)
    wait_for(lambda: launcher.get_phase(op.id).exited, what="the exit file")
    launcher.delete(op.id)
    assert launcher.get_phase(op.id).phase == "absent"
    launcher.command = child("exit-0")
    launcher.create(op, replace=False)


def test_a_reused_pid_is_never_taken_for_the_runner(state_dir):
    launcher = LocalLauncher(state_dir, command=child("ignore-term"))
    op = unsaved_op()
    launcher.create(op, replace=False)
    wait_for((state_dir / f"ready-{op.id}").exists, what="the child to start")
    meta = record(state_dir, op.id)
    pid = meta["pid"]
    # Pretend the runner died and an unrelated process now holds its pid.
    meta["start_time"] = "1"
    (state_dir / f"op-{op.id}.json").write_text(json.dumps(meta))
    assert launcher.get_phase(op.id).phase == "Failed"
    launcher.delete(op.id, grace_seconds=0)
    time.sleep(0.2)
    assert alive(pid)  # never signalled
    assert launcher.get_phase(op.id).phase == "absent"
    os.killpg(pid, signal.SIGKILL)


@pytest.mark.safeguard("reshard-40")
def test_create_never_replaces_a_live_runner(state_dir):
    launcher = LocalLauncher(state_dir, command=child("honour-term"))
    op = unsaved_op()
    first = launcher.create(op, replace=False)
    wait_for((state_dir / f"ready-{op.id}").exists, what="the child to start")
    pid = record(state_dir, op.id)["pid"]
    for replace in (False, True):
        with pytest.raises(StillTerminating, match="previous runner pod still terminating") as err:
            launcher.create(op, replace=replace)
        assert err.value.existing is not None
        assert err.value.existing.phase == "Running"
    assert record(state_dir, op.id)["uid"] == first.uid
    assert alive(pid)
    launcher.delete(op.id)
    wait_for(lambda: not alive(pid), what="the child to exit")
    with pytest.raises(StillTerminating) as err:  # exited, but replace was not asked for
        launcher.create(op, replace=False)
    assert err.value.existing is not None
    assert err.value.existing.exited
    launcher.command = child("exit-0")
    second = launcher.create(op, replace=True)
    assert second.uid != first.uid
    assert record(state_dir, op.id)["uid"] == second.uid


def test_list_scans_the_state_dir(state_dir):
    launcher = LocalLauncher(state_dir, command=child("exit-0"))
    assert launcher.list() == []
    a, b = unsaved_op(id=101), unsaved_op(id=102)
    launcher.create(a, replace=False)
    launcher.create(b, replace=False)
    # A pid above any pid_max: never a real process (teardown helpers signal recorded pids).
    (state_dir / "op-garbage.json").write_text(json.dumps({"pid": 2**30, "start_time": "x"}))
    objects = {o.op_id_label: o for o in launcher.list()}
    assert set(objects) == {"101", "102", "garbage"}
    assert objects["101"].name == "duckgres-reshard-op-101"
    assert objects["garbage"].status.phase == "Failed"
    wait_for(lambda: launcher.get_phase(102).exited, what="exit")
    launcher.delete(102)
    assert {o.op_id_label for o in launcher.list()} == {"101", "garbage"}


def test_read_log_returns_the_tail(state_dir):
    launcher = LocalLauncher(state_dir, command=child("chatty"))
    op = unsaved_op()
    launcher.create(op, replace=False)
    wait_for(lambda: launcher.get_phase(op.id).exited, what="exit")
    assert launcher.read_log(op.id, limit_bytes=8) == "THE-END\n"
    assert len(launcher.read_log(op.id)) > 10000


@pytest.mark.django_db(transaction=True)
def test_the_real_runner_reports_its_exit_through_the_exit_file(state_dir, monkeypatch):
    """``manage.py reshard_runner`` for an op that is already terminal exits 0 (spec §4.2 3)."""
    monkeypatch.setenv("DUCKGRES_CONFIG_STORE", child_config_store_dsn())
    op = ReshardOperation.objects.create(
        org_id="org-local-launcher",
        source_kind="cnpg",
        from_shard="",
        target_kind="external",
        state="succeeded",
        launcher="local",
    )
    launcher = LocalLauncher(state_dir)
    created = launcher.create(op, replace=False)
    wait_for(lambda: launcher.get_phase(op.id).exited, timeout=60, what="the runner to exit")
    status = launcher.get_phase(op.id)
    log = launcher.read_log(op.id)
    assert (status.phase, status.reason) == ("Succeeded", "exit code 0"), log
    assert status.uid == created.uid
