"""Fixtures of the streamed-backup tests: a moto S3 server over HTTP and recording hooks."""

from __future__ import annotations

import os
import secrets
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from moto.server import ThreadedMotoServer

from duckgres_admin.lib.s3 import S3
from reshard import pgclients
from reshard.backup import KEY_PREFIX, BackupSource

# The runner's in-process step fixtures (tests/backup/test_prepared.py).
from tests.fixtures.runner import claimed_env, cnpg_world, runner_moto_server, runner_s3
from tests.fixtures.stores import StoreClusters, TenantCatalog

__all__ = ["claimed_env", "cnpg_world", "runner_moto_server", "runner_s3"]


@dataclass
class MotoS3:
    endpoint_url: str
    bucket: str
    s3: S3
    requests: list[dict[str, Any]] = field(default_factory=list)

    def open_uploads(self) -> list[tuple[str, str]]:
        return self.s3.list_multipart_uploads(self.bucket, KEY_PREFIX)

    def keys(self) -> list[str]:
        return self.s3.list_keys(self.bucket, KEY_PREFIX)

    def get(self, key: str) -> bytes:
        return bytes(self.s3.client.get_object(Bucket=self.bucket, Key=key)["Body"].read())


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def moto_s3(moto_server: str, monkeypatch: pytest.MonkeyPatch, settings: Any) -> MotoS3:
    """A fresh bucket on the moto server; settings point the product's S3 seam at it, and
    every request the product's clients send is recorded (method, URL, headers)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    settings.DUCKGRES_S3_ENDPOINT_URL = moto_server
    settings.DUCKGRES_AWS_REGION = "us-east-1"
    settings.DUCKGRES_S3_ADDRESSING_STYLE = "path"
    s3 = S3()
    bucket = f"bk-{secrets.token_hex(6)}"
    s3.client.create_bucket(Bucket=bucket)
    moto = MotoS3(moto_server, bucket, s3)

    def record(request: Any, **_: Any) -> None:
        moto.requests.append(
            {"method": request.method, "url": request.url, "headers": dict(request.headers)}
        )

    original_init = S3.__init__

    def init(self: S3, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.client.meta.events.register("before-send.s3.*", record)

    monkeypatch.setattr(S3, "__init__", init)
    return moto


class RecordingHooks:
    """BackupHooks that records everything and captures the child's argv and environment."""

    def __init__(self) -> None:
        self.logs: list[tuple[str, str]] = []
        self.progress_calls: list[tuple[float, dict[str, int]]] = []
        self.processes: list[subprocess.Popen[bytes]] = []
        self.cmdlines: list[list[str]] = []
        self.environs: list[dict[str, str]] = []
        self.unregistered: list[subprocess.Popen[bytes]] = []
        self.stop = threading.Event()
        self.sids: list[int] = []

    def log(self, level: str, message: str) -> None:
        self.logs.append((level, message))

    def progress(self, values: dict[str, int]) -> None:
        import time

        self.progress_calls.append((time.monotonic(), dict(values)))

    def register_process(self, proc: subprocess.Popen[bytes]) -> None:
        self.processes.append(proc)
        try:
            self.sids.append(os.getsid(proc.pid))
        except OSError:
            self.sids.append(-1)
        # One entry in each list per process; empty when it had already exited (or was reaped).
        cmdline: list[str] = []
        environ: dict[str, str] = {}
        try:
            with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
                cmdline = [a.decode() for a in f.read().split(b"\0") if a]
            with open(f"/proc/{proc.pid}/environ", "rb") as f:
                pairs = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            environ = dict(p.split("=", 1) for p in pairs if "=" in p)
        except OSError:
            cmdline, environ = [], {}
        self.cmdlines.append(cmdline)
        self.environs.append(environ)

    def unregister_process(self, proc: subprocess.Popen[bytes]) -> None:
        self.unregistered.append(proc)

    def stopped(self) -> bool:
        return self.stop.is_set()

    def messages(self) -> str:
        return "\n".join(m for _, m in self.logs)


@pytest.fixture
def hooks() -> RecordingHooks:
    return RecordingHooks()


@pytest.fixture(autouse=True)
def _fresh_client_cache() -> Iterator[None]:
    pgclients.clear_cache()
    yield
    pgclients.clear_cache()


def catalog_source(catalog: TenantCatalog, *, database: str | None = None) -> BackupSource:
    """The source as an external-style login: the tenant user with its password over TLS."""
    return BackupSource(
        host=catalog.cluster.host,
        port=catalog.cluster.port,
        database=database or catalog.database,
        user=catalog.role,
        sslmode=catalog.cluster.sslmode,
        password=catalog.password,
    )


def add_blob_table(catalog: TenantCatalog, mib: int) -> None:
    """An incompressible ``bytea`` table of about ``mib`` MiB (inlined data makes big dumps)."""
    with catalog.cluster.superuser_conn(catalog.database) as conn:
        conn.execute(f'SET ROLE "{catalog.role}"')
        conn.execute("CREATE TABLE ducklake_inlined_data_blob (id int PRIMARY KEY, data bytea)")
        with conn.cursor() as cur, cur.copy("COPY ducklake_inlined_data_blob FROM STDIN") as cp:
            for i in range(mib * 4):
                cp.write_row((i, os.urandom(256 * 1024)))


def pid_gone(proc: subprocess.Popen[bytes]) -> bool:
    """Exited and reaped (no zombie left behind)."""
    if proc.returncode is None:
        return False
    return not os.path.exists(f"/proc/{proc.pid}/stat") or _not_our_child(proc.pid)


def _not_our_child(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[1]) != os.getpid()  # ppid differs: pid reused by someone else
    except OSError:
        return True


__all__ = ["StoreClusters"]
