"""Real processes log one JSON object per line, keep ``op_id``/``epoch``/``pool_id`` and never
carry a shared secret, raw or URL-encoded (design §6, spec reshard §2.7, docs/logging.md).

The processes are the shipped entry points, started as subprocesses on the test database and
broker: ``celery -A duckgres_admin worker`` (the default worker's prefork pool and the control
worker's solo pool), ``celery -A duckgres_admin beat``, ``manage.py reshard_runner`` and
gunicorn with ``duckgres_admin.gunicorn_conf``. Each gets the internal secret as a random value
with URL-special characters. The Celery processes load ``tests.fixtures.logging_probe``
through Celery's ``CELERY_LOADER``: it logs that secret in every form from the process itself
and from a task. EVERY stderr line must parse as JSON.
"""

from __future__ import annotations

import json
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote, quote_plus

import pytest
from django.utils.encoding import escape_uri_path, iri_to_uri

from reshard.runner.execute import EXIT_INFRA
from tests.fixtures.logging_probe import EPOCH, OP_ID, POOL_ID, TASK
from tests.fixtures.processes import ROOT, _flush_broker, process_env
from tests.fixtures.secrets_scan import find_secret, unique_password

PROBE_LOADER = "tests.fixtures.logging_probe:ProbeLoader"
MASK = "***"


@dataclass
class Proc:
    """A subprocess whose stdout and stderr go to separate files."""

    proc: subprocess.Popen[bytes]
    stdout: Path
    stderr: Path

    def err(self) -> str:
        return self.stderr.read_text(errors="replace")

    def out(self) -> str:
        return self.stdout.read_text(errors="replace")

    def wait_for(self, what: str, ready: Callable[[str], bool], timeout: float = 60.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if ready(self.err()):
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.2)
        raise AssertionError(f"{what}: not seen (exit {self.proc.poll()}):\n{self.err()[-4000:]}")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=10)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Callable[..., Proc]]:
    """Factory: ``start(name, cmd, env)``; every process is stopped after the test."""
    started: list[Proc] = []

    def factory(name: str, cmd: list[str], env: dict[str, str]) -> Proc:
        out, err = tmp_path / f"{name}.out", tmp_path / f"{name}.err"
        with out.open("wb") as stdout, err.open("wb") as stderr:
            proc = subprocess.Popen(
                cmd, cwd=ROOT, env=env, stdout=stdout, stderr=stderr, start_new_session=True
            )
        started.append(Proc(proc, out, err))
        return started[-1]

    yield factory
    for proc in started:
        proc.stop()


def json_lines(text: str) -> list[dict[str, Any]]:
    """Every line of ``text`` as a JSON object (none may be anything else)."""
    lines = []
    for number, line in enumerate(text.splitlines(), 1):
        try:
            record = json.loads(line)
        except ValueError:
            pytest.fail(f"line {number} is not JSON: {line!r}")
        assert isinstance(record, dict), f"line {number} is not a JSON object: {line!r}"
        lines.append(record)
    return lines


def assert_no_secret(secret: str, text: str) -> None:
    """No form of ``secret``: raw, URL-encoded, base64 (``find_secret``), nor the partly encoded
    forms of URLs (urllib's default ``quote``, Django's request paths and IRIs)."""
    partly = {
        "quote": quote(secret),
        "uri-path": escape_uri_path(secret),
        "iri": iri_to_uri(secret),
    }
    found = find_secret(secret, text) + [name for name, form in partly.items() if form in text]
    assert not found, f"the shared secret is in the log ({found}):\n{text[-4000:]}"


def by_event(lines: list[dict[str, Any]], event: str) -> dict[str, Any]:
    matches = [line for line in lines if line.get("event") == event]
    assert matches, f"no line {event!r} in {[line.get('event') for line in lines]}"
    return matches[0]


def assert_probe_lines(lines: list[dict[str, Any]], where: str) -> None:
    """The lines ``tests.fixtures.logging_probe.leak(where)`` wrote, scrubbed, fields kept."""
    fields = {"op_id": OP_ID, "epoch": EPOCH, "pool_id": POOL_ID}
    raw = by_event(lines, f"probe {where} raw {MASK}")
    assert {k: raw.get(k) for k in fields} == fields
    assert (raw["level"], raw["logger"]) == ("warning", "duckgres.test.probe")
    assert "timestamp" in raw
    encoded = by_event(
        lines, f"probe {where} url-encoded postgresql://u:{MASK}@h/db?password={MASK}"
    )
    assert {k: encoded.get(k) for k in fields} == fields
    assert encoded["dsn"] == f"postgresql://u:{MASK}@h/db"
    assert encoded["nested"] == {"s": [MASK]}
    native = by_event(lines, f"probe {where} structlog {MASK}")
    assert {k: native.get(k) for k in fields} == fields
    assert (native["password"], native["dsn"]) == (MASK, MASK)
    failed = by_event(lines, f"probe {where} exception")
    assert {k: failed.get(k) for k in fields} == fields
    assert f"RuntimeError: probe {where} failure {MASK} {MASK}" in failed["exception"]
    # print() to stdout and stderr is redirected into the log (Celery's worker_redirect_stdouts).
    assert by_event(lines, f"probe {where} print {MASK}")["logger"] == "celery.redirected"
    assert by_event(lines, f"probe {where} stderr {MASK}")["logger"] == "celery.redirected"


def celery_env(tmp_path: Path, secret: str) -> dict[str, str]:
    from django.conf import settings

    _flush_broker(str(settings.CELERY_BROKER_URL))
    return process_env(
        DUCKGRES_BROKER_URL=str(settings.CELERY_BROKER_URL),
        DUCKGRES_INTERNAL_SECRET=secret,
        DUCKGRES_RESHARD_LOCAL_STATE_DIR=str(tmp_path / "runners"),
        CELERY_LOADER=PROBE_LOADER,
    )


@pytest.mark.parametrize(
    ("queue", "pool"),
    [("duckgres.default", "prefork"), ("duckgres.control", "solo")],
    ids=["default-worker-prefork", "control-worker-solo"],
)
def test_celery_worker_logs_json_lines_without_shared_secrets(
    transactional_db, tmp_path, start, queue, pool
):
    from duckgres_admin.celery import app

    secret = unique_password()
    cmd = [
        sys.executable, "-m", "celery", "-A", "duckgres_admin", "worker", "-Q", queue,
        "-P", pool, "-c", "1", "-n", f"pytest-logs-{secrets.token_hex(3)}@%h",
        "--without-gossip", "--without-mingle", "--without-heartbeat", "--loglevel", "INFO",
    ]  # fmt: skip
    worker = start("worker", cmd, celery_env(tmp_path, secret))
    worker.wait_for("worker ready", lambda t: " ready." in t and "probe worker stderr" in t)
    # duckgres.control is a broadcast queue: a replica receives what is sent once it has
    # subscribed, just after it logs "ready", so the probe is sent until one arrives.
    deadline = time.monotonic() + 60
    while "raised unexpected" not in worker.err() and time.monotonic() < deadline:
        app.send_task(TASK, queue=queue)
        time.sleep(1.0)
    worker.wait_for("the probe task's failure", lambda t: "raised unexpected" in t)
    worker.stop()

    text = worker.err()
    assert_no_secret(secret, text)
    assert_no_secret(secret, worker.out())
    lines = json_lines(text)
    assert_probe_lines(lines, "worker")
    assert_probe_lines(lines, "task")
    in_task = by_event(lines, f"probe task raw {MASK}")
    assert in_task["task_name"] == TASK
    assert in_task["task_id"]
    # Celery's own lines are JSON records of their own loggers.
    ready = [line for line in lines if line["event"].endswith(" ready.")]
    assert ready
    assert ready[0]["logger"] == "celery.apps.worker"
    failure = next(line for line in lines if "raised unexpected" in line["event"])
    assert failure["logger"] == "celery.app.trace"
    assert f"RuntimeError('probe task raised {MASK} {MASK}')" in failure["event"]
    assert f"RuntimeError: probe task raised {MASK} {MASK}" in failure["exception"]


def test_celery_beat_logs_json_lines_without_shared_secrets(transactional_db, tmp_path, start):
    from django_celery_beat.models import IntervalSchedule, PeriodicTask

    secret = unique_password()
    every_second, _ = IntervalSchedule.objects.get_or_create(
        every=1, period=IntervalSchedule.SECONDS
    )
    # Beat logs the entry's name when it sends it: Celery's own line carries the secret.
    PeriodicTask.objects.create(name=f"probe {secret}", task=TASK, interval=every_second)
    cmd = [
        sys.executable, "-m", "celery", "-A", "duckgres_admin", "beat",
        "-S", "django_celery_beat.schedulers:DatabaseScheduler", "--pidfile=",
        "--max-interval", "1", "--loglevel", "INFO",
    ]  # fmt: skip
    beat = start("beat", cmd, celery_env(tmp_path, secret))
    beat.wait_for("beat's probe", lambda t: "probe beat stderr" in t)
    beat.wait_for("the due probe entry", lambda t: "Sending due task probe" in t)
    beat.stop()

    text = beat.err()
    assert_no_secret(secret, text)
    assert_no_secret(secret, beat.out())
    lines = json_lines(text)
    assert_probe_lines(lines, "beat")
    sent = next(line for line in lines if "Sending due task probe" in line["event"])
    assert sent["event"] == f"Scheduler: Sending due task probe {MASK} ({TASK})"
    assert sent["logger"] == "celery.beat"


def test_runner_logs_json_lines_without_shared_secrets(tmp_path, start):
    secret = unique_password()
    # The runner logs the (invalid) op id it was given, here the secret itself, and exits.
    env = process_env(DUCKGRES_RESHARD_OP_ID=secret, DUCKGRES_INTERNAL_SECRET=secret)
    runner = start("runner", [sys.executable, "manage.py", "reshard_runner"], env)
    assert runner.proc.wait(timeout=60) == EXIT_INFRA, runner.err()

    text = runner.err() + runner.out()
    assert_no_secret(secret, text)
    refused = by_event(json_lines(text), "DUCKGRES_RESHARD_OP_ID must be a positive integer")
    assert (refused["value"], refused["level"]) == (MASK, "error")


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str, **headers: str) -> int:
    request = urllib.request.Request(url, headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_gunicorn_with_the_shipped_conf_logs_json_error_and_access_lines(tmp_path, start):
    secret = unique_password()
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    cmd = [
        sys.executable, "-m", "gunicorn", "-c", "python:duckgres_admin.gunicorn_conf",
        "duckgres_admin.wsgi:application",
    ]  # fmt: skip
    env = process_env(DUCKGRES_HTTP_BIND=f"127.0.0.1:{port}", DUCKGRES_INTERNAL_SECRET=secret)
    api = start("gunicorn", cmd, env)
    api.wait_for("gunicorn booted a worker", lambda t: "Booting worker" in t)
    deadline = time.monotonic() + 60
    while True:
        try:
            if _get(f"{base}/livez") == 200:
                break
        except OSError:
            pass
        assert time.monotonic() < deadline, api.err()[-4000:]
        time.sleep(0.2)
    query = f"token={quote(secret, safe='')}&plus={quote_plus(secret)}"
    assert _get(f"{base}/livez?{query}", **{"User-Agent": f"probe {secret}"}) == 200
    assert _get(f"{base}/nope/{quote(secret, safe='')}") == 404
    api.wait_for("the 404 access line", lambda t: '"status": 404' in t)
    api.stop()

    text = api.err() + api.out()
    assert_no_secret(secret, text)
    lines = json_lines(text)
    errors = [line["event"] for line in lines if line.get("logger") == "gunicorn.error"]
    assert any(e.startswith("Starting gunicorn") for e in errors), errors
    assert f"Listening at: {base} ({api.proc.pid})" in errors
    assert any(e.startswith("Booting worker with pid") for e in errors), errors
    assert "Handling signal: term" in errors
    access = [line for line in lines if line.get("logger") == "gunicorn.access"]
    probe = next(line for line in access if line.get("user_agent") == f"probe {MASK}")
    assert (probe["method"], probe["path"], probe["status"]) == ("GET", "/livez", 200)
    assert probe["query"] == f"token={MASK}&plus={MASK}"
    assert probe["level"] == "info"
    assert f"GET /livez?token={MASK}&plus={MASK} HTTP/1.1" in probe["event"]
    missing = next(line for line in access if line.get("status") == 404)
    assert missing["path"] == f"/nope/{MASK}"
    not_found = by_event(lines, f"Not Found: /nope/{MASK}")
    assert (not_found["logger"], not_found["status_code"]) == ("django.request", 404)
