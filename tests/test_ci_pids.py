"""The service scripts' pid-file rule (.ci/pids.sh): a pid file counts only while its process
runs the program it was written for. A machine restored from a snapshot keeps the files while
the pids are reused, and a CI run once took an unrelated process for containerd."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

PIDS = Path(__file__).resolve().parent.parent / ".ci" / "pids.sh"


def _ours(pidfile: Path) -> bool:
    done = subprocess.run(
        ["bash", "-c", f'. "{PIDS}"; pid_ours "$1"', "check", str(pidfile)], check=False
    )
    return done.returncode == 0


def _write(pidfile: Path, pid: int, program: str) -> None:
    subprocess.run(
        [
            "bash",
            "-c",
            f'. "{PIDS}"; pid_write "$1" "$2" "$3"',
            "w",
            str(pidfile),
            str(pid),
            program,
        ],
        check=True,
    )


@pytest.fixture
def sleeper() -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(["sleep", "300"])
    yield proc
    proc.kill()
    proc.wait()


def test_a_live_process_of_the_recorded_program_is_ours(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    pidfile = tmp_path / "x.pid"
    _write(pidfile, sleeper.pid, "/usr/bin/sleep")
    assert pidfile.read_text() == f"{sleeper.pid}\nsleep\n"
    assert _ours(pidfile)


def test_a_reused_pid_running_another_program_is_not_ours(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    pidfile = tmp_path / "containerd.pid"
    _write(pidfile, sleeper.pid, "/usr/bin/containerd")
    assert not _ours(pidfile)


def test_a_pid_file_without_its_program_is_not_ours(
    tmp_path: Path, sleeper: subprocess.Popen[bytes]
) -> None:
    # The one-line files older scripts wrote: nothing says what the pid ran.
    pidfile = tmp_path / "old.pid"
    pidfile.write_text(f"{sleeper.pid}\n")
    assert not _ours(pidfile)


def test_a_dead_or_zombie_process_is_not_ours(tmp_path: Path) -> None:
    pidfile = tmp_path / "z.pid"
    zombie = subprocess.Popen(["sleep", "0"])
    # Not reaped yet: once it exits it is a zombie, whose /proc/PID/exe cannot be read.
    deadline = 200
    while deadline and Path(f"/proc/{zombie.pid}/stat").read_text().split()[2] != "Z":
        subprocess.run(["sleep", "0.05"], check=True)
        deadline -= 1
    assert deadline, "the child did not become a zombie"
    _write(pidfile, zombie.pid, "sleep")
    assert not _ours(pidfile)
    zombie.wait()
    assert not _ours(pidfile)
    (tmp_path / "garbage.pid").write_text("not-a-pid\nsleep\n")
    assert not _ours(tmp_path / "garbage.pid")


def test_the_service_scripts_use_the_rule() -> None:
    ci = PIDS.parent
    for script in ("kube-node.sh", "kube-apiserver.sh", "rgw.sh"):
        text = (ci / script).read_text()
        assert "pids.sh" in text, script
        assert "kill -0" not in text, f"{script} trusts a bare pid"
