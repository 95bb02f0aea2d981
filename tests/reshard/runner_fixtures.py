"""Fixtures and helpers for the runner tests (``tests/reshard/test_runner*.py``).

Runners run as real subprocesses (``sys.executable manage.py reshard_runner``) against the
pytest-django TEST database (``process_env`` from ``tests.fixtures.processes``), so every test
using them needs ``transactional_db``. The metadata stores are the CI clusters 5433/5434
(``store_clusters``/``tenant_catalog`` from ``tests.fixtures.stores``).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.models import (
    MetadataStore,
    ReshardLogEntry,
    ReshardOperation,
    ReshardStepTiming,
    Warehouse,
)
from reshard.runner.context import RunContext
from reshard.runner.env import StepEnv
from reshard.runner.fencing import Fencer, claim
from reshard.runner.oplog import OpLogWriter
from tests.fixtures.processes import ROOT, process_env
from tests.fixtures.rows import new_op, new_store, new_warehouse
from tests.fixtures.stores import StoreClusters, TenantCatalog, TenantCatalogFactory


@dataclass
class RunnerProcess:
    op_id: int
    proc: subprocess.Popen[bytes]
    log_path: Path
    state_dir: Path
    pod_uid: str

    def wait(self, timeout: float = 90) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(
                f"runner for op {self.op_id} did not exit within {timeout}s:\n{self.output()}"
            ) from None

    def output(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def exit_file(self) -> Path:
        return self.state_dir / f"op-{self.op_id}.exit"


def start_runner(
    op_id: int, state_dir: Path, *, env_extra: dict[str, str] | None = None, **extra_env: str
) -> RunnerProcess:
    """Start ``manage.py reshard_runner`` for ``op_id`` like the local launcher would."""
    state_dir.mkdir(parents=True, exist_ok=True)
    pod_uid = f"local-{secrets.token_hex(4)}-{int(time.time())}"
    env = process_env(
        DUCKGRES_RESHARD_OP_ID=str(op_id),
        POD_NAME=f"duckgres-reshard-op-{op_id}",
        POD_UID=pod_uid,
        DUCKGRES_RESHARD_LOCAL_STATE_DIR=str(state_dir),
        **(env_extra or {}),
        **extra_env,
    )
    log_path = state_dir / f"runner-{op_id}-{secrets.token_hex(3)}.log"
    with open(log_path, "wb") as sink:
        proc = subprocess.Popen(
            [sys.executable, "manage.py", "reshard_runner"],
            cwd=ROOT,
            env=env,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    return RunnerProcess(op_id, proc, log_path, state_dir, pod_uid)


def run_runner(
    op_id: int,
    state_dir: Path,
    timeout: float = 90,
    *,
    env_extra: dict[str, str] | None = None,
    **extra_env: str,
) -> RunnerProcess:
    runner = start_runner(op_id, state_dir, env_extra=env_extra, **extra_env)
    runner.wait(timeout)
    return runner


def op_log(op_id: int) -> list[str]:
    return list(
        ReshardLogEntry.objects.filter(operation_id=op_id)
        .order_by("id")
        .values_list("message", flat=True)
    )


def step_rows(op_id: int) -> list[tuple[str, str, int]]:
    return list(
        ReshardStepTiming.objects.filter(operation_id=op_id)
        .order_by("id")
        .values_list("step", "outcome", "runner_epoch")
    )


def wait_until(predicate: Callable[[], bool], timeout: float = 30, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout}s waiting for {what or predicate}")


def reload(op: ReshardOperation) -> ReshardOperation:
    return ReshardOperation.objects.get(id=op.id)


def warehouse_of(op: ReshardOperation) -> Warehouse:
    return Warehouse.objects.get(org_id=op.org_id)


@dataclass
class CnpgWorld:
    """A ready warehouse bound to a tenant catalog on the source cluster, a target store on
    the target cluster and a pending cnpg→cnpg operation."""

    source_store: MetadataStore
    target_store: MetadataStore
    catalog: TenantCatalog
    warehouse: Warehouse
    op: ReshardOperation


@pytest.fixture
def cnpg_world(
    transactional_db: None,
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
) -> CnpgWorld:
    catalog = tenant_catalog(store_clusters.source)
    source = new_store(store_clusters.source)
    target = new_store(store_clusters.target)
    warehouse = new_warehouse(
        store=source,
        catalog=catalog,
        compaction_enabled=True,
        status_message="",
    )
    op = new_op(warehouse, to_store=target)
    return CnpgWorld(source, target, catalog, warehouse, op)


@pytest.fixture
def runner_state_dir(tmp_path: Path) -> Path:
    path = tmp_path / "runners"
    path.mkdir()
    return path


def env_without(*names: str) -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in names}


class TcpProxy:
    """A loopback TCP forwarder to the config store whose connections a test can cut."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = int(self.listener.getsockname()[1])
        self._lock = threading.Lock()
        self._open: list[socket.socket] = []
        self._cut = False
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            try:
                upstream = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            upstream.settimeout(None)
            with self._lock:
                if self._cut:
                    client.close()
                    upstream.close()
                    continue
                self._open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(a, b), daemon=True).start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            # shutdown() before close(): on Linux a close() while another thread is blocked in
            # recv() on the same socket sends no FIN, and the server session would linger.
            for end in (src, dst):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
            for end in (src, dst):
                with contextlib.suppress(OSError):
                    end.close()

    def cut(self) -> None:
        """Close every forwarded connection and refuse new ones."""
        with self._lock:
            self._cut = True
            sockets = list(self._open)
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        for end in sockets:
            with contextlib.suppress(OSError):
                end.shutdown(socket.SHUT_RDWR)
        for end in sockets:
            end.close()

    def dsn(self, base_dsn: str) -> str:
        params = conninfo_to_dict(base_dsn)
        params.update(host="127.0.0.1", port=str(self.port))
        return make_conninfo("", **params)


@pytest.fixture
def claimed_env(transactional_db: None) -> Iterator[Callable[..., StepEnv]]:
    """Factory: claim ``op`` in this process and return the runner's ``StepEnv`` for it (for
    in-process tests of steps, fencing and the heartbeat). Op-log writers are closed after."""
    writers: list[OpLogWriter] = []

    def factory(op: ReshardOperation, runner_id: str = "runner-under-test") -> StepEnv:
        ctx = RunContext(op_id=op.id, runner_id=runner_id, scrubber=process_scrubber())
        epoch = claim(op.id, runner_id)
        assert epoch is not None
        ctx.epoch = epoch
        ctx.note_write()
        log = OpLogWriter(op.id, ctx.scrubber)
        log.bind(epoch=epoch)
        writers.append(log)
        return StepEnv(ctx=ctx, op=reload(op), fence=Fencer(ctx), log=log)

    yield factory
    for writer in writers:
        writer.close()


# --- the step machine end to end (tests/reshard/test_steps*.py) ----------------------------------
@dataclass
class RunnerS3:
    endpoint_url: str
    bucket: str

    def env(self) -> dict[str, str]:
        return {
            "DUCKGRES_S3_ENDPOINT_URL": self.endpoint_url,
            "DUCKGRES_AWS_REGION": "us-east-1",
            "DUCKGRES_S3_ADDRESSING_STYLE": "path",
            "AWS_ACCESS_KEY_ID": "testing",
            "AWS_SECRET_ACCESS_KEY": "testing",
        }

    def client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint_url,
            region_name="us-east-1",
            aws_access_key_id="testing",
            aws_secret_access_key="testing",
        )

    def open_uploads(self, prefix: str = "_reshard_catalog_backups/") -> list[str]:
        """Keys of the open multipart uploads under ``prefix``, read from the S3 server."""
        answer = self.client().list_multipart_uploads(Bucket=self.bucket, Prefix=prefix)
        return sorted(str(u["Key"]) for u in answer.get("Uploads", []) or [])

    def keys(self) -> list[str]:
        answer = self.client().list_objects_v2(Bucket=self.bucket)
        return [str(o["Key"]) for o in answer.get("Contents", [])]


@pytest.fixture(scope="session")
def runner_moto_server() -> Iterator[str]:
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def runner_s3(runner_moto_server: str) -> RunnerS3:
    import boto3

    bucket = f"rs-{secrets.token_hex(6)}"
    boto3.client(
        "s3",
        endpoint_url=runner_moto_server,
        region_name="us-east-1",
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
    ).create_bucket(Bucket=bucket)
    return RunnerS3(runner_moto_server, bucket)


def catalog_checksums(cluster: Any, database: str) -> dict[str, str]:
    """md5 of every ``ducklake_*`` table's rows (ordered), read as the superuser."""
    from psycopg import sql

    with cluster.superuser_conn(database) as conn:
        names = [
            str(r[0])
            for r in conn.execute(
                "SELECT tablename FROM pg_tables WHERE schemaname = 'public' "
                "AND tablename LIKE 'ducklake\\_%' ORDER BY 1"
            )
        ]
        sums: dict[str, str] = {}
        for name in names:
            query = sql.SQL(
                "SELECT md5(coalesce(string_agg(t::text, ',' ORDER BY t::text), '')) FROM {} t"
            ).format(sql.Identifier(name))
            row = conn.execute(query).fetchone()
            sums[name] = str(row[0]) if row else ""
    return sums


def database_exists(cluster: Any, database: str) -> bool:
    with cluster.superuser_conn() as conn:
        row = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", [database]).fetchone()
    return row is not None


def role_can_login(cluster: Any, role: str) -> bool | None:
    with cluster.superuser_conn() as conn:
        row = conn.execute("SELECT rolcanlogin FROM pg_roles WHERE rolname = %s", [role]).fetchone()
    return None if row is None else bool(row[0])


@contextlib.contextmanager
def password_url(password: str) -> Iterator[str]:
    """A tiny HTTP server standing in for the stash's route: the first GET gets
    ``{"password": …}``, every later one 404, as the API hands a password out once (safeguard
    reshard-79)."""
    import json
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    body = json.dumps({"password": password}).encode()
    served = threading.Lock()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if not served.acquire(blocking=False):
                gone = b'{"error": "password not available"}'
                self.send_response(404)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(gone)))
                self.end_headers()
                self.wfile.write(gone)
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/api/v1/reshards/1/password"
    finally:
        server.shutdown()
        server.server_close()


@dataclass
class ExternalTargetWorld:
    """A cnpg→external op: the source catalog on 5433 (cnpg store), the external target an
    empty tenant database on 5434 reached with the target tenant's credentials."""

    source_store: MetadataStore
    catalog: TenantCatalog
    target: TenantCatalog
    warehouse: Warehouse
    op: ReshardOperation


@pytest.fixture
def external_target_world(
    transactional_db: None,
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
) -> ExternalTargetWorld:
    catalog = tenant_catalog(store_clusters.source)
    target = tenant_catalog(store_clusters.target, with_tables=False)
    source = new_store(store_clusters.source)
    warehouse = new_warehouse(store=source, catalog=catalog, compaction_enabled=False)
    op = new_op(
        warehouse,
        target_kind="external",
        target_endpoint=store_clusters.target.host,
        target_port=store_clusters.target.port,
        target_sslmode=store_clusters.target.sslmode,
        target_user=target.role,
        target_database=target.database,
        target_password_secret_ref=target.password_ref,
    )
    return ExternalTargetWorld(source, catalog, target, warehouse, op)


@dataclass
class ExternalSourceWorld:
    target_store: MetadataStore
    catalog: TenantCatalog
    warehouse: Warehouse
    op: ReshardOperation


@pytest.fixture
def external_source_world(
    transactional_db: None,
    store_clusters: StoreClusters,
    tenant_catalog: TenantCatalogFactory,
) -> ExternalSourceWorld:
    catalog = tenant_catalog(store_clusters.source)
    target = new_store(store_clusters.target)
    warehouse = new_warehouse(catalog=catalog, metadata_store_kind="external")
    op = new_op(warehouse, to_store=target)
    return ExternalSourceWorld(target, catalog, warehouse, op)
