"""The local-process launcher (spec reshard §4.13): single-machine installs, the demo and tests.

Each runner is ``sys.executable manage.py reshard_runner`` in its own session (process group),
with the same env contract as a runner pod. Its state lives in the state directory:

- ``op-<id>.json``  pid, process start time (defeats pid reuse), uid, spawned_at, sigterm_at
- ``op-<id>.log``   the runner's stdout and stderr
- ``op-<id>.exit``  the runner's exit code, written by the runner itself as its last act

An operation with a password URL gets a fresh one-time pull credential at every spawn
(safeguard reshard-79): 32 random bytes (hex), whose SHA-256 digest is stored on the op row by a
guarded UPDATE (the API, another process, verifies against it and clears it at the first
successful pull). The credential itself reaches the child only through an inherited pipe: it is
written into the pipe before the child starts and the child reads it once and closes it; only
the fd number is in the environment (``DUCKGRES_RESHARD_PASSWORD_PULL_FD``). It is never in the
environment, argv, a file or a log. A process of the same OS user can still inspect the child
(ptrace, /proc/<pid>/fd): the local launcher's trust boundary is that user.

``delete`` never blocks: SIGTERM to the group on the first call, SIGKILL on a later call once
the grace has passed, files removed once the process is gone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from django.conf import settings

from duckgres_admin.lib.secretrefs import env_variable
from duckgres_admin.models import ReshardOperation
from reshard.launchers import capture, login, s3scope
from reshard.launchers.base import (
    DEFAULT_GRACE_SECONDS,
    LauncherError,
    RunnerObject,
    RunnerStatus,
    StillTerminating,
    runner_name,
    runner_secret_refs,
)
from reshard.launchers.envcontract import (
    ALLOWLIST,
    LOCAL_PASSTHROUGH,
    NEVER_PASSED,
    OP_ID_VAR,
    PASSWORD_URL_VAR,
    PULL_FD_VAR,
    SECRET_BEARING,
)

_log = logging.getLogger("duckgres.reshard.launcher")
ABSENT = RunnerStatus(phase="absent")
_KILL_SETTLE_SECONDS = 0.5  # after SIGKILL, how long delete looks for the process to vanish
_EXITING_SETTLE_SECONDS = 2.0  # a runner that wrote its exit file is finishing its shutdown


def state_dir() -> Path:
    return Path(settings.DUCKGRES_RESHARD_LOCAL_STATE_DIR)


def exit_file(op_id: int, directory: Path | None = None) -> Path:
    """Where the runner records its exit code as its last act (``manage.py reshard_runner``)."""
    return (directory or state_dir()) / f"op-{op_id}.exit"


def process_start_time(pid: int) -> tuple[str, str] | None:
    """(start time in clock ticks since boot, state letter) from /proc, or None if gone."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    # The command name (field 2) may contain spaces and parentheses: split after the last ')'.
    fields = raw[raw.rfind(")") + 2 :].split()
    if len(fields) < 20:
        return None
    return fields[19], fields[0]


def _now_iso() -> str:
    return datetime.now(UTC).isoformat()


def _parse_time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:
        return None


def runner_env(
    op: ReshardOperation,
    environ: Mapping[str, str],
    *,
    directory: Path,
    uid: str,
    secret_refs: Sequence[str] = (),
) -> dict[str, str]:
    """The runner's environment: the §4.13 contract built from ``environ`` (no other names)."""
    env: dict[str, str] = {}
    for name in (*ALLOWLIST, *LOCAL_PASSTHROUGH):
        if name in NEVER_PASSED:
            continue
        if name in environ:
            env[name] = environ[name]
        if name in SECRET_BEARING and f"{name}_FILE" in environ:
            env[f"{name}_FILE"] = environ[f"{name}_FILE"]
    for ref in (op.source_password_secret_ref, op.target_password_secret_ref, *secret_refs):
        variable = env_variable(ref)
        if variable and variable in environ and variable not in NEVER_PASSED:
            env[variable] = environ[variable]
    env["DUCKGRES_RESHARD_LOCAL_STATE_DIR"] = str(directory)
    env["DUCKGRES_RESHARD_LAUNCHER"] = "local"
    env[OP_ID_VAR] = str(op.id)
    env["POD_NAME"] = runner_name(op.id)
    env["POD_UID"] = uid
    if op.password_url:
        env[PASSWORD_URL_VAR] = op.password_url
    return env


def issue_pull_credential(op: ReshardOperation) -> int | None:
    """A fresh one-time pull credential for the runner about to be spawned (module docstring):
    its digest goes on the op row (guarded: the op is still pending or running), the value into
    a new pipe whose read end is returned (the caller passes it to the child and closes it).
    None when the op has no password URL or is no longer active (nothing to pull)."""
    if not op.password_url:
        return None
    credential = secrets.token_hex(32)
    digest = hashlib.sha256(credential.encode("ascii")).hexdigest()
    if not ReshardOperation.objects.filter(pk=op.id, state__in=("pending", "running")).update(
        password_pull_digest=digest
    ):
        return None
    read_end, write_end = os.pipe()
    try:
        os.write(write_end, credential.encode("ascii"))  # 64 bytes: far below the pipe buffer
    except OSError as exc:
        os.close(read_end)
        raise LauncherError(f"handing the pull credential to the runner failed: {exc}") from None
    finally:
        os.close(write_end)
    return read_end


class LocalLauncher:
    kind = "local"

    def __init__(
        self, directory: str | Path | None = None, *, command: Sequence[str] | None = None
    ) -> None:
        """``command`` replaces ``manage.py reshard_runner`` (tests only: a child that, say,
        ignores SIGTERM); it runs with the same environment, cwd and log redirection."""
        self.directory = Path(directory) if directory is not None else state_dir()
        self.command = list(command) if command else [sys.executable, "manage.py", "reshard_runner"]

    # --- files ------------------------------------------------------------------------------
    def _json(self, op_id: int | str) -> Path:
        return self.directory / f"op-{op_id}.json"

    def _log_file(self, op_id: int | str) -> Path:
        return self.directory / f"op-{op_id}.log"

    def _exit(self, op_id: int | str) -> Path:
        return self.directory / f"op-{op_id}.exit"

    def _read(self, op_id: int | str) -> dict[str, Any] | None:
        try:
            data = json.loads(self._json(op_id).read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None
        except (OSError, ValueError) as exc:
            raise LauncherError(f"cannot read {self._json(op_id)}: {exc}") from None
        if not isinstance(data, dict):
            raise LauncherError(f"cannot read {self._json(op_id)}: not a JSON object")
        return data

    def _write(self, op_id: int | str, record: dict[str, Any]) -> None:
        path = self._json(op_id)
        tmp = path.with_name(f"{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
        tmp.write_text(json.dumps(record, sort_keys=True), encoding="utf-8")
        os.replace(tmp, path)

    def _remove_files(self, op_id: int | str) -> None:
        for path in (self._json(op_id), self._exit(op_id), self._log_file(op_id)):
            path.unlink(missing_ok=True)

    # --- process state ----------------------------------------------------------------------
    @staticmethod
    def _alive(record: dict[str, Any]) -> bool:
        """The recorded process still runs: same pid *and* same start time, not a zombie."""
        pid = record.get("pid")
        if not isinstance(pid, int) or pid <= 1 or pid in (os.getpid(), os.getpgrp()):
            return False  # never our init, ourselves or our own group, whatever a file says
        info = process_start_time(pid)
        return info is not None and info[0] == str(record.get("start_time")) and info[1] != "Z"

    def _exit_code(self, op_id: int | str) -> int | None:
        try:
            return int(self._exit(op_id).read_text(encoding="utf-8").strip())
        except (OSError, ValueError):
            return None

    def _status(self, op_id: int | str, record: dict[str, Any]) -> RunnerStatus:
        spawned_at = _parse_time(record.get("spawned_at"))
        uid = str(record.get("uid") or "")
        code = self._exit_code(op_id)
        if code is not None:
            return RunnerStatus(
                phase="Succeeded" if code == 0 else "Failed",
                spawned_at=spawned_at,
                reason=f"exit code {code}",
                uid=uid,
            )
        if self._alive(record):
            return RunnerStatus(
                phase="Running",
                terminating=record.get("sigterm_at") is not None,
                spawned_at=spawned_at,
                uid=uid,
            )
        return RunnerStatus(
            phase="Failed",
            spawned_at=spawned_at,
            reason="killed (the runner exited without writing its exit code)",
            uid=uid,
        )

    # --- the launcher interface -------------------------------------------------------------
    def create(self, op: ReshardOperation, replace: bool) -> RunnerStatus:
        self.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        record = self._read(op.id)
        if record is not None:
            current = self._status(op.id, record)
            if not (replace and current.exited):
                raise StillTerminating(current)
            self._remove_files(op.id)
        elif self._exit(op.id).exists():
            self._exit(op.id).unlink(missing_ok=True)  # a stale exit code must not describe us

        s3 = s3scope.for_launch(op)  # first: a refused mint changes nothing
        spawned_at = _now_iso()
        uid = f"local-{os.getpid()}-{time.time_ns() // 1_000_000}"
        env = runner_env(
            op, os.environ, directory=self.directory, uid=uid, secret_refs=runner_secret_refs(op)
        )
        # Its S3 authority is its operation's session, never this process's credentials.
        if s3scope.scoped():
            for name in s3scope.AMBIENT_VARS:
                env.pop(name, None)
                env.pop(f"{name}_FILE", None)
        if s3 is not None:
            env.update(s3.environment())
        # Its own config-store login, never the worker's (login module); minted only now that
        # no runner of this op is alive (a new password would refuse that one's next connection).
        env.pop("DUCKGRES_CONFIG_STORE_FILE", None)
        env["DUCKGRES_CONFIG_STORE"] = login.mint(op.id)
        pipe = issue_pull_credential(op)
        pass_fds: tuple[int, ...] = ()
        if pipe is not None:
            env[PULL_FD_VAR] = str(pipe)
            pass_fds = (pipe,)
        log_path = self._log_file(op.id)
        try:
            with open(log_path, "wb") as log_handle:
                proc = subprocess.Popen(
                    self.command,
                    cwd=settings.BASE_DIR,
                    env=env,
                    stdin=subprocess.DEVNULL,
                    stdout=log_handle,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    close_fds=True,
                    pass_fds=pass_fds,
                )
        except OSError as exc:
            raise LauncherError(f"starting runner {runner_name(op.id)} failed: {exc}") from None
        finally:
            if pipe is not None:
                os.close(pipe)  # the child holds its own copy; the credential is in the pipe
        # Read before the waiter can reap it: an exited child stays a zombie until then.
        info = process_start_time(proc.pid)
        record = {
            "op_id": op.id,
            "name": runner_name(op.id),
            "pid": proc.pid,
            "start_time": info[0] if info else "",
            "uid": uid,
            "spawned_at": spawned_at,
            "sigterm_at": None,
            "grace_seconds": None,
        }
        self._write(op.id, record)
        threading.Thread(target=proc.wait, name=f"reap-{runner_name(op.id)}", daemon=True).start()
        _log.info("runner %s started as pid %s", runner_name(op.id), proc.pid)
        return RunnerStatus(phase="Running", spawned_at=_parse_time(spawned_at), uid=uid)

    def get_phase(self, op_id: int) -> RunnerStatus:
        record = self._read(op_id)
        return ABSENT if record is None else self._status(op_id, record)

    def list(self) -> list[RunnerObject]:
        if not self.directory.is_dir():
            return []
        objects = []
        for path in sorted(self.directory.glob("op-*.json")):
            label = path.name[len("op-") : -len(".json")]
            try:
                record = self._read(label)
            except LauncherError as exc:
                _log.warning("skipping unreadable runner state: %s", exc)
                continue
            if record is None:
                continue  # removed meanwhile
            objects.append(
                RunnerObject(
                    name=runner_name(label),
                    op_id_label=label,
                    status=self._status(label, record),
                )
            )
        return objects

    def delete(self, op_id: int, grace_seconds: int | None = None) -> None:
        record = self._read(op_id)
        if record is None:
            self._exit(op_id).unlink(missing_ok=True)
            return
        if self._exit_code(op_id) is not None:
            # The runner wrote its exit code as its last act: it is gone or about to be.
            self._wait_gone(record, _EXITING_SETTLE_SECONDS)
        if not self._alive(record):
            self._remove_files(op_id)
            return
        pid = int(record["pid"])
        if record.get("sigterm_at") is None:
            record["sigterm_at"] = _now_iso()
            record["grace_seconds"] = (
                DEFAULT_GRACE_SECONDS if grace_seconds is None else grace_seconds
            )
            self._write(op_id, record)
            self._signal(pid, signal.SIGTERM)
            _log.info("runner %s (pid %s): SIGTERM sent", runner_name(op_id), pid)
            if record["grace_seconds"] > 0:
                return
        grace = grace_seconds if grace_seconds is not None else record.get("grace_seconds")
        grace = DEFAULT_GRACE_SECONDS if grace is None else int(grace)
        sigterm_at = _parse_time(record["sigterm_at"]) or datetime.now(UTC)
        if (datetime.now(UTC) - sigterm_at).total_seconds() < grace:
            return  # still within its grace: the janitor repeats delete on a later tick
        self._signal(pid, signal.SIGKILL)
        _log.warning(
            "runner %s (pid %s) still alive %s s after SIGTERM: SIGKILL sent",
            runner_name(op_id),
            pid,
            grace,
        )
        if self._wait_gone(record, _KILL_SETTLE_SECONDS):
            self._remove_files(op_id)

    def _wait_gone(self, record: dict[str, Any], seconds: float) -> bool:
        """Poll briefly (bounded: delete never blocks) for the process to vanish."""
        deadline = time.monotonic() + seconds
        while self._alive(record):
            if time.monotonic() >= deadline:
                return False
            time.sleep(0.02)
        return True

    def forget_login(self, op_id: int) -> None:
        """Nothing outside the config store holds a local runner's login: its environment
        ended with the process."""

    def capture_log(self, op_id: int, status: RunnerStatus) -> bool:
        return capture.capture_log(op_id, status, self.read_log)

    def read_log(self, op_id: int, limit_bytes: int = 5 * 1024 * 1024) -> str:
        path = self._log_file(op_id)
        try:
            with open(path, "rb") as handle:
                size = handle.seek(0, os.SEEK_END)
                handle.seek(max(0, size - max(0, limit_bytes)))
                data = handle.read()
        except OSError as exc:
            raise LauncherError(f"cannot read runner log {path}: {exc.strerror}") from None
        return data.decode("utf-8", errors="replace")

    @staticmethod
    def _signal(pid: int, sig: signal.Signals) -> None:
        """Signal the runner's process group (it leads its own session), else the pid."""
        try:
            os.killpg(pid, sig)
        except ProcessLookupError:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        except PermissionError as exc:
            raise LauncherError(f"cannot signal runner pid {pid}: {exc.strerror}") from None
