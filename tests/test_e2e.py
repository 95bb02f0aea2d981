"""End to end: the API (in ``live_server``, so the password stash lives in this process), a
real Celery worker subprocess, the local launcher and a real runner child process, against
the real config store (the pytest-django test database), the two metadata-store clusters and
an S3 endpoint over HTTP (moto server).

Each test asserts whichever terminal outcome the run reached, consistently: succeeded (the
binding names the target, rows equal, source dropped, the backup restores with stock
pg_restore) or failed and rolled back (binding unchanged; for cnpg->cnpg only a step this build
does not have is an acceptable cause). Both: warehouse ``ready``, op log complete and ordered,
step timings recorded, runner exit 0, and no secret anywhere.
"""

from __future__ import annotations

import json
import re
import secrets
import subprocess
from pathlib import Path
from typing import Any

import pytest
from django.conf import settings as django_settings

from duckgres_admin.models import (
    BackupVerification,
    ReshardOperation,
    ReshardStepTiming,
    Warehouse,
)
from reshard.backups import restore_test
from reshard.operation.sequences import CNPG_TO_CNPG, CNPG_TO_EXTERNAL
from tests.fixtures.api_client import ApiClient
from tests.fixtures.secrets_scan import scan, unique_password
from tests.fixtures.stores import TenantCatalog

pytestmark = [pytest.mark.e2e, pytest.mark.timeout(300)]

NOT_IMPLEMENTED = re.compile(r"not (yet )?implemented|not available in this build", re.IGNORECASE)


@pytest.fixture
def api(live_server, settings) -> ApiClient:
    """The API under test; the runner pulls passwords from this very process."""
    port = int(live_server.url.rsplit(":", 1)[1])
    settings.DUCKGRES_ADVERTISE_ADDRESS = "127.0.0.1"
    settings.DUCKGRES_ADVERTISE_PORT = port
    settings.DUCKGRES_ADVERTISE_SCHEME = "http"
    return ApiClient.internal(live_server.url, django_settings.DUCKGRES_INTERNAL_SECRET)


def _binding(org: str) -> dict[str, Any]:
    wh = Warehouse.objects.get(org_id=org)
    return {
        "kind": wh.metadata_store_kind,
        "store": wh.metadata_store_id,
        "host": wh.metadata_store_host,
        "port": wh.metadata_store_port,
        "database": wh.metadata_store_database,
        "user": wh.metadata_store_user,
        "ref": wh.metadata_store_password_ref,
        "state": wh.state,
        "compaction": wh.compaction_enabled,
    }


def _messages(entries: list[dict[str, Any]]) -> str:
    return "\n".join(f"[{e['source']}/{e['level']}] {e['message']}" for e in entries)


def _assert_terminal_and_consistent(
    api: ApiClient,
    op: dict[str, Any],
    org: str,
    binding_before: dict[str, Any],
    sequence: tuple[str, ...],
    worker: Any,
    *,
    moved_binding: dict[str, Any],
    honest_failure: bool,
) -> list[dict[str, Any]]:
    """The op is terminal and everything agrees with it. Failed: rolled back, binding
    unchanged (``honest_failure``: the cause is a step this build does not have yet).
    Succeeded: the binding reads ``moved_binding``. Both: warehouse ``ready``, op log complete
    and ordered, step timings recorded, runner exit code 0."""
    op_id = int(op["id"])
    entries = api.log_entries(op_id)
    text = _messages(entries)
    context = (
        f"op: {json.dumps(op, default=str)[:1500]}\n--- op log ---\n{text}\n"
        f"--- runner logs ---\n{worker.runner_logs()}\n--- worker log (tail) ---\n"
        f"{worker.log_text()[-3000:]}"
    )
    print(f"e2e outcome: op {op_id} {op['state']} at step {op['step']}: {op['error']!r}")
    assert op["state"] in ("failed", "succeeded"), context
    failed = op["state"] == "failed"
    for key in ("blocked_at", "unblocked_at", "started_at", "finished_at"):
        assert op[key], (key, context)
    assert op["runner_epoch"] == 1, context
    assert op["runner_id"] == f"duckgres-reshard-op-{op_id}", context

    # The warehouse is ready and writable again, on the right binding.
    after = _binding(org)
    assert after["state"] == "ready", context
    wh = api.get(f"warehouses/{org}")
    assert wh.status == 200
    assert wh.body["state"] == "ready"
    assert wh.body["writable"] is True
    if failed:
        # The first unbuilt step fails with an honest message, after `blocking` completed.
        assert op["step"] in sequence[1:], context
        if honest_failure:
            assert NOT_IMPLEMENTED.search(op["error"]), context
        assert {k: v for k, v in after.items() if k != "state"} == {
            k: v for k, v in binding_before.items() if k != "state"
        }, context
    else:
        assert op["error"] == "", context
        assert {k: after[k] for k in moved_binding} == moved_binding, context
        assert after["compaction"] == binding_before["compaction"], context

    # Step timings, in order, all of this runner's epoch, each closed.
    timings = list(ReshardStepTiming.objects.filter(operation_id=op_id).order_by("id"))
    steps = [t.step for t in timings]
    reached = sequence.index(op["step"]) + 1 if failed else len(sequence)
    assert steps == list(sequence[:reached]), (steps, context)
    outcomes = ["ok"] * (reached - 1) + ["failed" if failed else "ok"]
    assert [t.outcome for t in timings] == outcomes, context
    assert all(t.ended_at is not None and t.ended_at >= t.started_at for t in timings), context
    assert all(t.runner_epoch == 1 for t in timings), context

    # The op log tells the whole story, in order: created, claimed, [failure], report, marker.
    def index_of(pattern: str) -> int:
        for i, entry in enumerate(entries):
            if re.search(pattern, entry["message"]):
                return i
        raise AssertionError(f"no op-log line matches {pattern!r}\n{context}")

    created = index_of(r"operation created by internal-secret")
    claimed = index_of(r"operation claimed by duckgres-reshard-op-\d+ \(epoch 1\)")
    report = index_of(rf"==== reshard report \({op['state']}\) ====")
    persisted = index_of(r"runner log persisted")
    assert created < claimed < report < persisted, context
    assert entries[created]["source"] == "api"
    assert entries[claimed]["source"] == "runner"
    if failed:
        failure = index_of(rf"step {op['step']} failed: .*rolling back")
        assert claimed < failure < report, context
        assert entries[failure]["level"] == "error"
    report_text = "\n".join(e["message"] for e in entries[report:persisted])
    assert "maintenance mode (connections blocked):" in report_text, context
    assert "total runtime:" in report_text, context
    assert "blocking" in report_text, context
    ids = [e["id"] for e in entries]
    assert ids == sorted(ids)
    assert len(ids) == len(set(ids))

    # The runner process exited 0 (the op is terminal) and left its process log.
    exit_file = Path(worker.state_dir) / f"op-{op_id}.exit"
    assert exit_file.exists(), context
    assert exit_file.read_text().strip() == "0", context
    assert f"op-{op_id}.log" in worker.runner_logs(), context
    return entries


def test_cnpg_to_cnpg_through_api_worker_and_runner(
    request,
    transactional_db,
    store_clusters,
    tenant_catalog,
    make_store,
    make_warehouse,
    api,
    s3_bucket,
    monkeypatch,
    settings,
):
    catalog = tenant_catalog(store_clusters.source, rows=5)
    rows_before = catalog.row_counts()
    source = make_store(store_clusters.source)
    target = make_store(store_clusters.target)
    warehouse = make_warehouse(
        store=source,
        catalog=catalog,
        compaction_enabled=True,
        data_bucket=s3_bucket.bucket,
        data_region=s3_bucket.region,
    )
    binding_before = _binding(warehouse.org_id)
    # Started after the env: secrets exist; its runners reach the S3 endpoint.
    worker = request.getfixturevalue("celery_worker_factory")(extra_env=s3_bucket.env())

    resp = api.start_reshard(
        warehouse.org_id, {"target": {"type": "cnpg", "cnpg_shard": target.name}}
    )
    assert resp.status == 202, resp.raw[:1000]
    assert resp.body["state"] == "pending"
    assert resp.body["launcher"] == "local"
    assert resp.body["from_shard"] == source.name
    assert resp.body["to_shard"] == target.name
    op_id = int(resp.body["id"])

    op = api.wait_terminal(op_id, timeout=180)
    moved = {
        "kind": "cnpg",
        "store": target.name,
        "database": catalog.database,
        "user": catalog.role,
        "ref": catalog.password_ref,
    }
    _assert_terminal_and_consistent(
        api,
        op,
        warehouse.org_id,
        binding_before,
        CNPG_TO_CNPG,
        worker,
        moved_binding=moved,
        honest_failure=True,
    )
    assert ReshardOperation.objects.filter(org_id=warehouse.org_id).count() == 1
    if op["state"] == "failed":
        # Nothing moved: the source catalog is intact and its tenant can still log in.
        assert catalog.row_counts() == rows_before
        with catalog.tenant_conn() as conn:
            assert conn.execute("SELECT count(*) FROM ducklake_snapshot").fetchone() == (5,)
        with store_clusters.target.superuser_conn() as conn:
            assert conn.execute(
                "SELECT count(*) FROM pg_database WHERE datname = %s", (catalog.database,)
            ).fetchone() == (0,)
        return
    # The catalog moved: same rows on the target, the tenant logs in there with its password,
    # and the source database is gone (the tenant role stays NOLOGIN on the source).
    moved_catalog = TenantCatalog(
        store_clusters.target,
        catalog.role,
        catalog.database,
        catalog.password,
        catalog.password_var,
    )
    assert moved_catalog.row_counts() == rows_before
    with moved_catalog.tenant_conn() as conn:
        assert conn.execute("SELECT count(*) FROM ducklake_snapshot").fetchone() == (5,)
    drop_lines = [e for e in api.log_entries(op_id) if "drop" in e["message"].lower()]
    assert op["source_dropped_at"], _messages(drop_lines)
    with store_clusters.source.superuser_conn() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_database WHERE datname = %s", (catalog.database,)
        ).fetchone() == (0,)
    # The pre-flip backup landed in S3 and restores with stock pg_restore.
    prefix = f"s3://{s3_bucket.bucket}/"
    assert op["backup_s3_uri"].startswith(prefix), op
    assert op["backup_bytes"] > 0, op
    dump = s3_bucket.get(op["backup_s3_uri"][len(prefix) :])
    assert dump.startswith(b"PGDMP")
    assert _restored_row_counts(store_clusters.target, dump) == rows_before
    _restore_test_passes(warehouse, op_id, s3_bucket, source.name, monkeypatch, settings)


def _restore_test_passes(
    warehouse: Any, op_id: int, s3_bucket: Any, store: str, monkeypatch: Any, settings: Any
) -> None:
    """The runner recorded what the backup holds; the restore test streams the real backup
    into a scratch database on the (now empty) source store and agrees (docs/backup.md)."""
    fingerprint = ReshardOperation.objects.get(pk=op_id).catalog_fingerprint
    assert fingerprint, "the verified copy records the backup's DuckLake fingerprint"
    assert fingerprint["snapshot_id"] is not None
    for name, value in s3_bucket.env().items():
        monkeypatch.setenv(name, value)
    settings.DUCKGRES_S3_ENDPOINT_URL = s3_bucket.endpoint_url
    settings.DUCKGRES_S3_ADDRESSING_STYLE = "path"
    settings.DUCKGRES_AWS_REGION = s3_bucket.region
    settings.DUCKGRES_RESTORE_TEST_STORE = store
    report = restore_test.run()
    assert len(report.tested) == 1, report
    assert report.tested[0].endswith(": passed"), report
    row = BackupVerification.objects.get(op_id=op_id)
    assert (row.snapshot_id, row.data_files) == (
        fingerprint["snapshot_id"],
        fingerprint["data_files"],
    )


def _restored_row_counts(cluster: Any, dump: bytes) -> dict[str, int]:
    """Restore a custom-format dump with stock pg_restore into a scratch database, with the
    flags of the restore command the runner logs (--no-owner --clean --if-exists)."""
    scratch = f"restore_{secrets.token_hex(4)}"
    with cluster.superuser_conn() as conn:
        conn.execute(f'CREATE DATABASE "{scratch}"')
    try:
        done = subprocess.run(
            ["pg_restore", "-h", cluster.host, "-p", str(cluster.port), "-U", "postgres",
             "--no-owner", "--clean", "--if-exists", "--format=custom", "--exit-on-error",
             "-d", scratch],
            input=dump, capture_output=True, timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr.decode(errors="replace")
        return TenantCatalog(cluster, "postgres", scratch, "", "").row_counts()
    finally:
        with cluster.superuser_conn() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


def _pg_log_path(cluster_name: str) -> Path:
    return Path(f"/var/log/postgresql/postgresql-15-{cluster_name}.log")


def test_external_target_password_is_never_at_rest(
    request,
    transactional_db,
    store_clusters,
    tenant_catalog,
    make_store,
    make_warehouse,
    api,
    caplog,
    s3_bucket,
):
    """Safeguard 39: a unique 40-character password of an external target travels API ->
    in-process stash -> runner pull -> copy and cutover, and no form of it lands in the config
    store, the op log, process logs, Celery messages, the backup or the server logs."""
    from celery.signals import before_task_publish

    password = unique_password()
    catalog = tenant_catalog(store_clusters.source, rows=3)
    external = tenant_catalog(store_clusters.target, password=password, with_tables=False)
    source = make_store(store_clusters.source)
    warehouse = make_warehouse(
        store=source, catalog=catalog, data_bucket=s3_bucket.bucket, data_region=s3_bucket.region
    )
    binding_before = _binding(warehouse.org_id)

    # Statement logging for this test's tenant roles only (role-level settings, superuser).
    logs = {c.name: _pg_log_path(c.name) for c in store_clusters}
    offsets = {name: (p.stat().st_size if p.exists() else 0) for name, p in logs.items()}
    for cat in (catalog, external):
        with cat.cluster.superuser_conn() as conn:
            conn.execute(f"ALTER ROLE \"{cat.role}\" SET log_statement = 'all'")

    published: list[tuple[str, str]] = []

    def record(sender: Any = None, body: Any = None, headers: Any = None, **kw: Any) -> None:
        published.append(
            (
                f"celery message {sender}",
                json.dumps(
                    {"body": body, "headers": headers, "props": kw.get("properties")},
                    default=repr,
                ),
            )
        )

    before_task_publish.connect(record, weak=False)
    caplog.set_level("DEBUG")
    try:
        worker = request.getfixturevalue("celery_worker_factory")(extra_env=s3_bucket.env())
        resp = api.start_reshard(
            warehouse.org_id,
            {
                "target": {
                    "type": "external",
                    "endpoint": f"{external.cluster.host}:{external.cluster.port}",
                    "user": external.role,
                    "database": external.database,
                    "sslmode": external.cluster.sslmode,  # verify-full with the test CA
                    "password_secret_ref": external.password_ref,
                    "password": password,
                }
            },
        )
        assert resp.status == 202, resp.raw[:1000]
        op_id = int(resp.body["id"])
        assert resp.body["password_url"].endswith(f"/api/v1/reshards/{op_id}/password")
        assert resp.body["target_port"] == external.cluster.port
        op = api.wait_terminal(op_id, timeout=180)
    finally:
        before_task_publish.disconnect(record)

    moved = {
        "kind": "external",
        "host": external.cluster.host,
        "port": external.cluster.port,
        "database": external.database,
        "user": external.role,
        "ref": external.password_ref,
    }
    # Any honest failure is fine here (e.g. the mandatory backup without S3): what matters is
    # that the secret went everywhere it had to and nowhere else.
    entries = _assert_terminal_and_consistent(
        api,
        op,
        warehouse.org_id,
        binding_before,
        CNPG_TO_EXTERNAL,
        worker,
        moved_binding=moved,
        honest_failure=False,
    )
    # The secret really travelled: the runner pulled it from this process's stash.
    assert any(
        "runner fetched the ephemeral external target password" in e["message"] for e in entries
    ), _messages(entries)
    assert published, "no Celery message was published during the run"

    # Scan every sink.
    db = django_settings.DATABASES["default"]
    dump = subprocess.run(
        ["pg_dump", "-h", "127.0.0.1", "-p", str(db.get("PORT") or 5432), "-U", "postgres",
         "--no-owner", "-d", str(db["NAME"])],
        capture_output=True, check=True, timeout=120,
    ).stdout  # fmt: skip
    assert b"duckgres_reshard_operation_log" in dump
    sources: list[tuple[str, bytes | str]] = [("pg_dump of the config store", dump)]
    sources.append(("op log (API)", json.dumps(entries)))
    sources += [(f"runner process log {n}", t) for n, t in worker.runner_logs().items()]
    sources.append(("celery worker log", worker.log_text()))
    sources += published
    sources.append(("API process log records", caplog.text))
    sources.append(("op JSON", json.dumps(op)))
    server_logs: dict[str, bytes] = {}
    for name, path in logs.items():
        if path.exists():
            with path.open("rb") as fh:
                fh.seek(offsets[name])
                server_logs[name] = fh.read()
            sources.append((f"PostgreSQL server log {name}", server_logs[name]))
    # The statement log really covered the API's credentialed probe of the external target.
    assert external.role.encode() in server_logs.get(external.cluster.name, b""), (
        "statement logging did not capture the external target's sessions"
    )
    sources += [(f"s3 object {key}", s3_bucket.get(key)) for key in s3_bucket.object_keys()]
    broker = _redis_dump(str(django_settings.CELERY_BROKER_URL))
    sources.append(("redis broker db", broker))
    hits = scan(password, sources)
    assert hits == [], f"the password leaked into: {hits}"
    # Sanity: the scan is not vacuous (the secret is findable where it must be).
    assert scan(password, [("env", json.dumps({"x": password}))])


def _redis_dump(url: str) -> bytes:
    import redis

    client = redis.Redis.from_url(url)
    try:
        chunks: list[Any] = []
        for key in client.scan_iter(count=1000):
            kind = client.type(key)
            if kind == b"string":
                chunks.append(client.get(key) or b"")
            elif kind == b"list":
                chunks.extend(client.lrange(key, 0, -1))
            elif kind == b"hash":
                for k, v in client.hgetall(key).items():
                    chunks += [k, v]
            elif kind == b"set":
                chunks.extend(client.smembers(key))
            elif kind == b"zset":
                chunks.extend(client.zrange(key, 0, -1))
            chunks.append(key)
        return b"\n".join(chunks)
    finally:
        client.close()
