"""The restore test's sandbox (``reshard.engines.restore.sandbox``, ``manage.py restore_stream``;
safeguard reshard-139): a real process, started with nothing but what the sandbox pod gets, streams
a real custom-format archive from a real S3 server (moto over HTTP) into stock ``pg_restore`` on a
real metadata-store cluster, as the scratch login."""

from __future__ import annotations

import hashlib
import os
import secrets
import subprocess
import sys
from typing import Any

import pytest
from psycopg import sql

from reshard.engines.backup import backup_key
from reshard.engines.restore import sandbox
from tests.fixtures.backup import pg_dump_custom
from tests.fixtures.backups_listing import bucket
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.stores import StoreClusters

assert bucket  # a fixture, used by name below

pytestmark = pytest.mark.django_db
ROOT = sandbox.__file__.rsplit("/reshard/", 1)[0]
# Everything a control-plane process holds that a sandbox must not (and need not) have.
CONTROL_PLANE_ONLY = (
    "DUCKGRES_CONFIG_STORE",
    "DJANGO_SECRET_KEY",
    "DUCKGRES_INTERNAL_SECRET",
    "DUCKGRES_RUNNER_SECRET",
    "DUCKGRES_DATAPLANE_SECRET",
    "DUCKGRES_BROKER_URL",
)


def scratch(store_clusters: StoreClusters) -> tuple[str, str]:
    """A fresh scratch database owned by a fresh rightless login (as the restore test makes)."""
    name = f"duckgres_sandbox_t_{secrets.token_hex(4)}"
    password = secrets.token_urlsafe(24)
    with store_clusters.target.superuser_conn() as conn:
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(
                sql.Identifier(name), sql.Literal(password)
            )
        )
        conn.execute(sql.SQL("CREATE DATABASE {} OWNER {}").format(*[sql.Identifier(name)] * 2))
    return name, password


def run_sandbox(
    job: sandbox.Job, password: str, bucket: S3Bucket
) -> subprocess.CompletedProcess[str]:
    env = {n: os.environ[n] for n in sandbox.PASSED_SETTINGS if n in os.environ}
    env |= {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": ROOT,
        "DJANGO_SETTINGS_MODULE": "duckgres_admin.settings",
        "DUCKGRES_S3_ENDPOINT_URL": bucket.endpoint_url,
        "DUCKGRES_AWS_REGION": bucket.region,
        "DUCKGRES_S3_ADDRESSING_STYLE": "path",
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
        sandbox.JOB_VAR: job.to_json(),
        sandbox.PASSWORD_VAR: password,
    }
    assert not set(CONTROL_PLANE_ONLY) & set(env)
    return subprocess.run(
        [sys.executable, "manage.py", "restore_stream"], cwd=ROOT, env=env,
        capture_output=True, text=True, timeout=300,
    )  # fmt: skip


def job_for(
    name: str, key: str, dump: bytes, bucket: S3Bucket, store_clusters: StoreClusters, **over: Any
) -> sandbox.Job:
    target = store_clusters.target
    fields: dict[str, Any] = dict(
        bucket=bucket.bucket, key=key, etag="", sha256=hashlib.sha256(dump).hexdigest(),
        size=len(dump), version_id="", host=target.host, port=target.port, database=name,
        user=name, sslmode=target.sslmode, server_major=15, timeout_seconds=120.0,
    )  # fmt: skip
    fields.update(over)
    return sandbox.Job(**fields)


@pytest.mark.safeguard("reshard-139")
def test_the_sandbox_restores_with_nothing_of_the_control_plane(
    bucket: S3Bucket, store_clusters: StoreClusters, tenant_catalog: Any
) -> None:
    catalog = tenant_catalog(store_clusters.source, rows=4)
    dump = pg_dump_custom(catalog)
    key = backup_key(9001)
    bucket.client().put_object(Bucket=bucket.bucket, Key=key, Body=dump)
    name, password = scratch(store_clusters)
    done = run_sandbox(job_for(name, key, dump, bucket, store_clusters), password, bucket)
    assert done.returncode == sandbox.EXIT_RESTORED, done.stdout + done.stderr
    assert done.stdout.strip().splitlines()[-1].startswith(f"restored {len(dump)} bytes")
    with store_clusters.target.superuser_conn(name) as conn:
        tables = {
            r[0]
            for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")
        }
    assert "ducklake_snapshot" in tables
    assert password not in done.stdout + done.stderr


@pytest.mark.safeguard("reshard-139")
def test_bytes_that_differ_from_the_record_are_the_archives_fault_and_a_bad_job_the_attempts(
    bucket: S3Bucket, store_clusters: StoreClusters, tenant_catalog: Any
) -> None:
    dump = pg_dump_custom(tenant_catalog(store_clusters.source, rows=2))
    key = backup_key(9002)
    bucket.client().put_object(Bucket=bucket.bucket, Key=key, Body=dump)
    name, password = scratch(store_clusters)
    forged = job_for(name, key, dump, bucket, store_clusters, sha256="0" * 64)
    done = run_sandbox(forged, password, bucket)
    assert done.returncode == sandbox.EXIT_ARCHIVE, done.stdout + done.stderr
    assert "does not match what its operation recorded" in done.stdout
    missing = job_for(name, key + ".gone", dump, bucket, store_clusters)
    gone = run_sandbox(missing, password, bucket)
    assert gone.returncode == sandbox.EXIT_ATTEMPT, gone.stdout + gone.stderr
    assert "could not read the backup" in gone.stdout


def test_a_malformed_job_names_the_field() -> None:
    with pytest.raises(sandbox.JobError, match="field 'key' is missing or not a str"):
        sandbox.Job.from_json('{"bucket": "b", "port": 5432}')
    assert sandbox.run({}) == (sandbox.EXIT_ATTEMPT, f"{sandbox.JOB_VAR} is not JSON")
