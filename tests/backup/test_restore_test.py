"""The restore test (docs/backup.md "Restore tests"), against real services: a real S3 server
(moto's, over HTTP), the real metadata-store clusters and stock ``pg_dump``/``pg_restore``.

The backups are stock custom-format dumps of a real DuckLake-shaped catalog, stored under the
key its operation would have written, with the fingerprint the runner records when it verifies
the copy (the end-to-end test, tests/test_e2e.py, runs the same job on a real reshard's backup).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import threading
import time
from typing import Any

import psycopg
import pytest
from django.db import connection

from duckgres_admin.lib.s3 import S3Error
from duckgres_admin.models import BackupVerification, ReshardLogEntry, ReshardOperation
from duckgres_admin.platform.lockkeys import RESTORE_TEST_LOCK_KEY
from reshard.backups import inventory, restore_test
from reshard.control import metrics
from reshard.engines import verify
from reshard.engines.backup import backup_key
from reshard.engines.clients import BackupSource, PgClient
from reshard.engines.restore import stream as restore
from tests.fixtures.backup import pg_dump_custom
from tests.fixtures.backups_listing import bucket, op_in_state, put_backup, warehouse_with_bucket
from tests.fixtures.rows import new_store, new_warehouse
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.stores import StoreCluster, StoreClusters, TenantCatalog

assert bucket  # a fixture, used by name below

pytestmark = pytest.mark.django_db(transaction=True)


def _fingerprint(catalog: TenantCatalog) -> dict[str, Any]:
    with catalog.cluster.superuser_conn(catalog.database) as conn:
        state = verify.read_state(conn)
    return verify.compare(state, state).fingerprint()


def _scratch_databases(cluster: StoreCluster) -> list[str]:
    with cluster.superuser_conn() as conn:
        return [
            str(r[0])
            for r in conn.execute(
                "SELECT datname FROM pg_database WHERE starts_with(datname, %s)",
                (restore_test.installation_prefix(),),
            )
        ]


@pytest.fixture
def world(
    bucket: S3Bucket, store_clusters: StoreClusters, tenant_catalog: Any, settings: Any
) -> dict[str, Any]:
    """A warehouse with one backup (a real dump, its operation's fingerprint recorded) and the
    target cluster configured as the restore test's scratch store."""
    catalog = tenant_catalog(store_clusters.source, rows=7)
    scratch_store = new_store(store_clusters.target)
    settings.DUCKGRES_RESTORE_TEST_STORE = scratch_store.name
    wh = warehouse_with_bucket(bucket.bucket)
    op = op_in_state(wh, "succeeded")
    op.catalog_fingerprint = _fingerprint(catalog)
    op.save(update_fields=["catalog_fingerprint"])
    dump = pg_dump_custom(catalog)
    key = backup_key(op.id)
    put_backup(bucket.client(), bucket.bucket, key, dump)  # as the runner records it
    return {"wh": wh, "op": op, "key": key, "dump": dump, "catalog": catalog}


def _listed(org_id: str) -> dict[str, Any]:
    body = inventory.backups_for_org(org_id, with_plan=False)
    assert len(body["backups"]) == 1, body
    return dict(body["backups"][0])


@pytest.mark.safeguard("reshard-100")
def test_a_good_backup_passes_and_leaves_no_scratch_database(world, store_clusters) -> None:
    assert _listed(world["wh"].org_id)["verified"] is None
    report = restore_test.run()
    assert report.enabled, report
    assert report.ran, report
    assert report.errors == []
    uri = f"s3://{world['wh'].data_bucket}/{world['key']}"
    assert report.tested == [f"{uri}: passed"]
    row = BackupVerification.objects.get(key=world["key"])
    assert (row.result, row.op_id, row.org_id) == ("passed", world["op"].id, world["wh"].org_id)
    assert row.snapshot_id == world["op"].catalog_fingerprint["snapshot_id"] is not None
    assert row.data_files == world["op"].catalog_fingerprint["data_files"]
    assert row.object_bytes == len(world["dump"])
    assert "matches" in row.detail, row.detail
    listed = _listed(world["wh"].org_id)
    assert (listed["verified"], listed["verification_detail"]) == (True, row.detail)
    assert listed["verified_at"]
    assert _scratch_databases(store_clusters.target) == []
    # The backup's operation log says so.
    assert ReshardLogEntry.objects.filter(
        operation_id=world["op"].id, message__contains="restore test of"
    ).exists()
    # A tested backup is not tested again.
    again = restore_test.run()
    assert again.tested == []


@pytest.mark.safeguard("reshard-100")
def test_a_corrupted_object_fails_with_pg_restores_reason(world, bucket, store_clusters) -> None:
    """A backup that was corrupt as written (recorded so): pg_restore's own reason."""
    dump = bytearray(world["dump"])
    middle = len(dump) // 2
    dump[middle : middle + 64] = b"\xff" * 64  # bytes of the compressed data blocks
    truncated = bytes(dump[: int(len(dump) * 0.8)])
    put_backup(bucket.client(), bucket.bucket, world["key"], truncated)
    report = restore_test.run()
    assert report.tested == [f"s3://{world['wh'].data_bucket}/{world['key']}: failed"], report
    row = BackupVerification.objects.get(key=world["key"])
    assert row.result == "failed"
    assert "pg_restore exited with status" in row.detail, row.detail


@pytest.mark.safeguard("reshard-109")
def test_bytes_that_changed_after_they_were_recorded_fail_the_restore_test(
    world, bucket, store_clusters
) -> None:
    """The bytes changed while the size and the ETag the listing shows did not (what storage
    rot or a crafted collision would look like): the digest read while streaming is not the
    recorded one, the test fails naming the key and both digests, and pg_restore never got the
    archive's end."""
    dump = bytearray(world["dump"])
    middle = len(dump) // 2
    dump[middle : middle + 8] = bytes(b ^ 0xFF for b in dump[middle : middle + 8])
    answer = bucket.client().put_object(Bucket=bucket.bucket, Key=world["key"], Body=bytes(dump))
    ReshardOperation.objects.filter(pk=world["op"].id).update(
        backup_etag=str(answer["ETag"]).strip('"')
    )  # the listing cannot tell: only the digest can
    recorded = ReshardOperation.objects.get(pk=world["op"].id).backup_sha256
    report = restore_test.run()
    uri = f"s3://{world['wh'].data_bucket}/{world['key']}"
    assert report.tested == [f"{uri}: failed"], report
    row = BackupVerification.objects.get(key=world["key"])
    assert f"backup {uri} does not match what its operation recorded" in row.detail, row.detail
    assert f"read sha256 {hashlib.sha256(bytes(dump)).hexdigest()}" in row.detail
    assert f"recorded sha256 {recorded}" in row.detail
    assert _scratch_databases(store_clusters.target) == []


def test_an_object_replaced_after_it_was_recorded_is_not_tested(world, bucket) -> None:
    bucket.client().put_object(Bucket=bucket.bucket, Key=world["key"], Body=b"PGDMP other")
    report = restore_test.run()
    assert report.tested == [], report
    assert BackupVerification.objects.count() == 0
    body = inventory.backups_for_org(world["wh"].org_id, with_plan=False)
    assert body["backups"] == []
    assert [c["key"] for c in body["changed_objects"]] == [world["key"]]


@pytest.mark.safeguard("reshard-100")
def test_a_restore_that_differs_from_the_recorded_state_fails(world) -> None:
    op = world["op"]
    op.catalog_fingerprint = {**op.catalog_fingerprint, "snapshot_id": 999_999}
    op.save(update_fields=["catalog_fingerprint"])
    restore_test.run()
    row = BackupVerification.objects.get(key=world["key"])
    assert row.result == "failed"
    assert row.detail.startswith("DuckLake verification failed: snapshot_id: recorded 999999"), (
        row.detail
    )


def test_the_age_metric_of_a_passed_backup(world) -> None:
    restore_test.run()
    row = BackupVerification.objects.get(key=world["key"])
    assert row.object_modified is not None
    later = row.object_modified + dt.timedelta(hours=2)  # the backup's age, not the test's
    metrics.set_backup_verified_ages(later)
    value = metrics.BACKUP_VERIFIED_AGE.labels(org_id=world["wh"].org_id)._value.get()
    assert value == pytest.approx(7200, abs=1)


def test_a_killed_runs_scratch_database_is_swept_first(world, store_clusters) -> None:
    leftover, foreign = restore_test.scratch_name(424242), restore_test.scratch_name(424243)
    alone, elsewhere = restore_test.scratch_name(424244), "duckgres_restore_test_00000000_op1"
    with store_clusters.target.provisioner_conn() as conn:
        restore_test._create_scratch(conn, leftover, "pw", [])  # what a killed run leaves
        for role in (alone, elsewhere):  # killed between the role and its database
            conn.execute(f'CREATE ROLE "{role}" NOLOGIN')
    with store_clusters.target.superuser_conn() as conn:
        conn.execute(f'CREATE DATABASE "{foreign}"')  # not a run's: left alone
    try:
        report = restore_test.run()
        assert report.swept == [leftover]
        assert _scratch_databases(store_clusters.target) == [foreign]
        with store_clusters.target.superuser_conn() as conn:
            row = conn.execute(
                "SELECT count(*) FROM pg_roles WHERE rolname = %s", (leftover,)
            ).fetchone()
        assert row == (0,), "its role went with it"
        with store_clusters.target.superuser_conn() as conn:
            roles = [
                str(r[0])
                for r in conn.execute(
                    "SELECT rolname FROM pg_roles WHERE rolname = ANY(%s) ORDER BY 1",
                    ([alone, elsewhere],),
                )
            ]
        assert roles == [elsewhere], "this installation's role without a database is swept"
        assert report.tested  # the run went on
    finally:
        with store_clusters.target.superuser_conn() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{foreign}"')
            conn.execute(f'DROP ROLE IF EXISTS "{elsewhere}"')


def test_a_second_run_does_nothing_while_one_holds_the_lock(world) -> None:
    params = connection.get_connection_params()
    with psycopg.connect(**{k: v for k, v in params.items() if k != "cursor_factory"}) as other:
        other.execute("SELECT pg_advisory_lock(%s)", [RESTORE_TEST_LOCK_KEY])
        report = restore_test.run()
        assert (report.enabled, report.ran, report.tested) == (True, False, [])
    assert BackupVerification.objects.count() == 0


def test_off_without_a_store_and_loud_with_a_wrong_one(world, settings) -> None:
    settings.DUCKGRES_RESTORE_TEST_STORE = ""
    assert restore_test.run().enabled is False
    settings.DUCKGRES_RESTORE_TEST_STORE = "no-such-store"
    report = restore_test.run()
    assert report.ran is False
    assert report.errors == [
        "DUCKGRES_RESTORE_TEST_STORE='no-such-store' names no metadata store: name a cnpg "
        "store, whose provisioner login creates and drops the scratch databases"
    ]


@pytest.mark.safeguard("reshard-101")
def test_the_stream_holds_one_chunk_at_a_time(world, store_clusters) -> None:
    """The object reaches pg_restore chunk by chunk: never more than one chunk read ahead."""
    s3 = inventory.warehouse_client(world["wh"])
    real = s3.stream_object
    sizes: list[int] = []

    class Counted:
        def __init__(self, stream: Any) -> None:
            self.stream, self.size = stream, stream.size

        def __iter__(self) -> Any:
            for chunk in self.stream:
                sizes.append(len(chunk))
                yield chunk

        def close(self) -> None:
            self.stream.close()

    def recording(bucket: str, key: str, chunk_bytes: int = restore.CHUNK_BYTES, **kw: Any) -> Any:
        return Counted(real(bucket, key, chunk_bytes, **kw))

    s3.stream_object = recording  # type: ignore[method-assign]
    cluster = store_clusters.target
    scratch = restore_test.scratch_name(777001)
    with cluster.provisioner_conn() as conn:
        conn.execute(f'CREATE DATABASE "{scratch}"')
    try:
        with cluster.superuser_conn(scratch) as conn:
            major = int(str(conn.execute("SHOW server_version_num").fetchone()[0])) // 10000
        target = BackupSource(
            cluster.host,
            cluster.port,
            scratch,
            cluster.provisioner_user,
            cluster.sslmode,
            cluster.provisioner_password,
        )
        done = restore.stream_restore(
            s3,
            world["wh"].data_bucket,
            world["key"],
            target,
            server_major=major,
            timeout_seconds=120,
            chunk_bytes=4096,
        )
        assert done.object_bytes == len(world["dump"]) == sum(sizes)
        assert len(sizes) > 1, sizes
        assert max(sizes) <= 4096, sizes
        with cluster.superuser_conn(scratch) as conn:
            state = verify.read_state(conn)
        assert verify.matches_fingerprint(state, world["op"].catalog_fingerprint)
    finally:
        with cluster.superuser_conn() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{scratch}" WITH (FORCE)')


def test_hostile_pg_restore_output_is_bounded_and_printable() -> None:
    raw = b"\x1b[31mred\x00" + b"A" * 20000 + b"\npassword secret-value-123 end\n"
    text = restore.clean_output(raw, "secret-value-123")
    assert "\x1b" not in text
    assert "\x00" not in text
    assert "secret-value-123" not in text
    assert "***" in text
    assert len(text) <= restore.STDERR_TAIL_BYTES


@pytest.mark.safeguard("reshard-100")
@pytest.mark.parametrize("reset", ["", "EXECUTE 'RESET ROLE'; "], ids=["as-is", "reset-role"])
def test_the_archives_code_runs_without_rights(
    bucket: S3Bucket,
    store_clusters: StoreClusters,
    tenant_catalog: Any,
    settings: Any,
    reset: str,
) -> None:
    """A tenant's check calls a function that creates a role unless it runs as the tenant: on
    the scratch store it runs as the scratch role, which may not, so the restore fails and no
    role appears (run as the provisioner, which has CREATEROLE, it would have made one). The
    function may first ``RESET ROLE``: that returns to the session's login — the scratch role
    itself, never the provisioner (a ``pg_restore --role`` over a provisioner login would)."""
    catalog = tenant_catalog(store_clusters.source, rows=2)
    evil = f"duckgres_evil_{catalog.role}"
    with catalog.tenant_conn() as conn:
        conn.execute(
            "CREATE FUNCTION public.sneaky() RETURNS boolean LANGUAGE plpgsql AS $f$ BEGIN "
            f"IF current_user <> '{catalog.role}' THEN {reset}EXECUTE 'CREATE ROLE {evil}'; "
            "END IF; RETURN true; END $f$"
        )
        conn.execute("ALTER TABLE ducklake_metadata ADD CONSTRAINT sneaky CHECK (public.sneaky())")
    settings.DUCKGRES_RESTORE_TEST_STORE = new_store(store_clusters.target).name
    wh = warehouse_with_bucket(bucket.bucket)
    op = op_in_state(wh, "succeeded")
    key = backup_key(op.id)
    put_backup(bucket.client(), bucket.bucket, key, pg_dump_custom(catalog))
    report = restore_test.run()
    assert report.tested == [f"s3://{bucket.bucket}/{key}: failed"], report
    row = BackupVerification.objects.get(key=key)
    assert "permission denied to create role" in row.detail, row.detail
    with store_clusters.target.superuser_conn() as conn:
        assert conn.execute(
            "SELECT count(*) FROM pg_roles WHERE rolname = %s", (evil,)
        ).fetchone() == (0,)
    assert _scratch_databases(store_clusters.target) == []


@pytest.mark.safeguard("reshard-100")
def test_a_scratch_name_taken_by_another_database_leaves_it_and_no_role(
    world: dict[str, Any], store_clusters: StoreClusters
) -> None:
    """The role is created, the database is not (the name is taken): the run drops the role it
    made — never the database it did not — and records nothing."""
    name = restore_test.scratch_name(world["op"].id)
    with store_clusters.target.superuser_conn() as conn:
        conn.execute(f'CREATE DATABASE "{name}"')  # someone else's, owned by postgres
    try:
        report = restore_test.run()
        assert report.tested == [], report
        assert len(report.errors) == 1, report
        assert "already exists" in report.errors[0], report.errors
        assert not BackupVerification.objects.filter(key=world["key"]).exists()
        with store_clusters.target.superuser_conn() as conn:
            role = conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (name,)).fetchone()
            kept = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        assert role is None, "the role this run created is dropped"
        assert kept == (1,), "the database it did not create is left alone"
    finally:
        with store_clusters.target.superuser_conn() as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}"')


@pytest.mark.safeguard("reshard-100")
def test_an_archive_that_sets_its_roles_password_finds_no_free_session(
    bucket: S3Bucket, store_clusters: StoreClusters, tenant_catalog: Any, settings: Any
) -> None:
    """The archive's code sets the scratch role's password to one its author knows and then
    lingers: a login with it finds the role's one session slot taken (``pg_restore``'s), and no
    session of the role outlives the run."""
    catalog = tenant_catalog(store_clusters.source, rows=2)
    known = "known-to-the-archive-0123456789"
    # ducklake_metadata's data is restored (and committed) before ducklake_snapshot's: the
    # first sets the password, the second keeps pg_restore busy with it known.
    sets = (
        f"IF current_user <> '{catalog.role}' THEN EXECUTE format('ALTER ROLE %I PASSWORD %L', "
        f"current_user, '{known}'); END IF; RETURN true;"
    )
    lingers = f"IF current_user <> '{catalog.role}' THEN PERFORM pg_sleep(1); END IF; RETURN true;"
    with catalog.tenant_conn() as conn:
        for fn, body, table in (
            ("sets", sets, "ducklake_metadata"),
            ("lingers", lingers, "ducklake_snapshot"),
        ):
            conn.execute(
                f"CREATE FUNCTION public.{fn}() RETURNS boolean LANGUAGE plpgsql AS "
                f"$f$ BEGIN {body} END $f$"
            )
            conn.execute(f"ALTER TABLE {table} ADD CONSTRAINT {fn} CHECK (public.{fn}())")
    settings.DUCKGRES_RESTORE_TEST_STORE = new_store(store_clusters.target).name
    wh = warehouse_with_bucket(bucket.bucket)
    op = op_in_state(wh, "succeeded")
    key = backup_key(op.id)
    put_backup(bucket.client(), bucket.bucket, key, pg_dump_custom(catalog))
    name = restore_test.scratch_name(op.id)
    seen: list[str] = []
    done = threading.Event()

    def try_login() -> None:
        while not done.is_set():
            try:
                with store_clusters.target.connect(name, known, name) as conn:
                    conn.execute("SELECT pg_sleep(30)")  # an intruder that stays
                    seen.append("an intruder outlived the run")
            except psycopg.Error as exc:
                seen.append(" ".join(str(exc).split()))
            time.sleep(0.05)

    attacker = threading.Thread(target=try_login)
    attacker.start()
    try:
        report = restore_test.run()
    finally:
        done.set()
        attacker.join()
    assert report.tested == [f"s3://{bucket.bucket}/{key}: passed"], report
    # While pg_restore ran, the known password met a full slot; a login in the moment between
    # its end and the new password was ended with the run (never survives it).
    assert any("too many connections for role" in line for line in seen), seen
    assert "an intruder outlived the run" not in seen, seen
    assert _scratch_databases(store_clusters.target) == []


def test_a_restore_past_its_deadline_records_nothing_and_is_tried_again(
    world, settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The attempt's failure is not the backup's: no row, an error in the report."""
    monkeypatch.setattr(restore, "WATCH_INTERVAL_SECONDS", 0.01)
    settings.DUCKGRES_RESTORE_TEST_TIMEOUT_SECONDS = 0
    report = restore_test.run()
    assert report.tested == []
    assert len(report.errors) == 1
    assert "ran past its deadline" in report.errors[0], report.errors
    assert not BackupVerification.objects.exists()
    settings.DUCKGRES_RESTORE_TEST_TIMEOUT_SECONDS = 120
    assert restore_test.run().tested == [f"s3://{world['wh'].data_bucket}/{world['key']}: passed"]


def test_the_archive_header_names_its_pg_dump(world) -> None:
    assert restore.archive_dump_major(world["dump"][:4096]) == 15
    assert restore.archive_dump_major(world["dump"][:20]) is None  # cut inside the header
    assert restore.archive_dump_major(b"PGDMP" + b"\xff" * 50) is None
    assert restore.archive_dump_major(b"not an archive") is None


def test_a_replaced_object_is_refused(world, bucket: S3Bucket) -> None:
    """The ETag read with the listing must still be the object's when it is restored."""
    s3 = inventory.warehouse_client(world["wh"])
    listed, _ = s3.list_objects(world["wh"].data_bucket, world["key"], limit=1)
    etag = listed[0].etag
    assert etag
    bucket.client().put_object(Bucket=bucket.bucket, Key=world["key"], Body=world["dump"] + b"x")
    with pytest.raises(S3Error) as caught:
        s3.stream_object(world["wh"].data_bucket, world["key"], if_match=etag)
    assert caught.value.code in ("PreconditionFailed", "412"), caught.value


def test_only_the_one_refused_transaction_timeout_is_tolerated() -> None:
    """A pg_restore 17+ on an older server: that one refusal is not a failure, anything else is."""
    new = PgClient(
        major=18, version="18.6", bin_dir="/x", pg_dump="/x/pg_dump", pg_restore="/x/pg_restore"
    )
    old = PgClient(
        major=15, version="15.18", bin_dir="/y", pg_dump="/y/pg_dump", pg_restore="/y/pg_restore"
    )
    refused = (
        "pg_restore: error: could not execute query: ERROR: unrecognized configuration parameter "
        '"transaction_timeout" | Command was: SET transaction_timeout = 0; | pg_restore: warning: '
        "errors ignored on restore: 1"
    )
    assert restore._tolerated(1, refused, new, 15)
    assert not restore._tolerated(1, refused.replace("restore: 1", "restore: 2"), new, 15)
    assert not restore._tolerated(1, refused, old, 15), "a same-major client has no excuse"
    assert not restore._tolerated(1, refused, new, 17)
    assert not restore._tolerated(2, refused, new, 15)
    assert "--exit-on-error" not in restore.pg_restore_argv(new, _target(), server_major=15)
    assert "--exit-on-error" in restore.pg_restore_argv(old, _target(), server_major=15)


def _target() -> BackupSource:
    return BackupSource("127.0.0.1", 5434, "db", "user", "require", "pw", role="scratch")


@pytest.mark.safeguard("reshard-130")
def test_a_scratch_store_whose_server_serves_a_warehouse_is_refused_unless_allowed(
    world, store_clusters: StoreClusters, settings: Any
) -> None:
    """Issue 25 item 5: a warehouse bound to any store on the scratch store's server makes the
    run refuse it, naming the setting; nothing is created there. Allowed explicitly, it runs."""
    serving = new_store(store_clusters.target)  # another name, the same server
    tenant = new_warehouse(
        store=serving,
        metadata_store_database="served",
        metadata_store_user="served",
        metadata_store_password_ref="env:DUCKGRES_TEST_PW_served",
    )
    report = restore_test.run()
    assert report.tested == []
    assert len(report.errors) == 1, report.errors
    assert (
        f"DUCKGRES_RESTORE_TEST_STORE={settings.DUCKGRES_RESTORE_TEST_STORE!r} is on "
        f"{store_clusters.target.host}:{store_clusters.target.port}, which serves 1 warehouse(s) "
        f"(e.g. {tenant.org_id})"
    ) in report.errors[0]
    assert "DUCKGRES_RESTORE_TEST_ALLOW_SERVING_STORE=true" in report.errors[0]
    assert not BackupVerification.objects.exists()
    settings.DUCKGRES_RESTORE_TEST_ALLOW_SERVING_STORE = True
    allowed = restore_test.run()
    assert allowed.tested == [f"s3://{world['wh'].data_bucket}/{world['key']}: passed"], allowed


def _failed_under_cap(
    cap: int,
    statements: str,
    bucket: S3Bucket,
    clusters: StoreClusters,
    tenant_catalog: Any,
    settings: Any,
) -> BackupVerification:
    """A catalog plus ``statements`` (run as its tenant), recorded as a backup of a finished
    operation and restore-tested under ``cap`` on the target cluster: it must fail; its row."""
    settings.DUCKGRES_RESTORE_TEST_MAX_DATABASE_BYTES = cap
    settings.DUCKGRES_RESTORE_TEST_STORE = new_store(clusters.target).name
    catalog = tenant_catalog(clusters.source, rows=2)
    with catalog.tenant_conn() as conn:
        conn.execute(statements)
    key = backup_key(op_in_state(warehouse_with_bucket(bucket.bucket), "succeeded").id)
    put_backup(bucket.client(), bucket.bucket, key, pg_dump_custom(catalog))
    report = restore_test.run()
    assert report.tested == [f"s3://{bucket.bucket}/{key}: failed"], report
    return BackupVerification.objects.get(key=key)


@pytest.mark.safeguard("reshard-131")
def test_an_archive_that_expands_past_its_cap_ends_failed_before_the_cap(
    bucket: S3Bucket,
    store_clusters: StoreClusters,
    tenant_catalog: Any,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A small archive (a few hundred kB, compressed) that restores into ~60 MB: the guard
    stops it at its stop point, under the cap, ends the scratch role's sessions, and the backup
    is recorded failed naming the cap; nothing is left on the store."""
    cap = 32 << 20
    monkeypatch.setattr(restore_test, "SIZE_POLL_SECONDS", 0.05)
    monkeypatch.setattr(restore_test, "STOP_FRACTION", 0.5)
    row = _failed_under_cap(
        cap,
        "CREATE TABLE public.padding AS SELECT g, repeat('x', 1000) AS filler "
        "FROM generate_series(1, 60000) g",
        bucket, store_clusters, tenant_catalog, settings,
    )  # fmt: skip
    assert f"DUCKGRES_RESTORE_TEST_MAX_DATABASE_BYTES={cap}" in row.detail, row.detail
    seen = int(row.detail.split("reached ", 1)[1].split(" bytes", 1)[0])
    assert cap // 2 <= seen < cap, row.detail
    assert _scratch_databases(store_clusters.target) == []


@pytest.mark.safeguard("reshard-131")
def test_an_archive_s_temporary_files_are_bounded_by_the_cap(
    bucket: S3Bucket, store_clusters: StoreClusters, tenant_catalog: Any, settings: Any
) -> None:
    """The scratch role's temp_file_limit is the cap (the test's scratch store lets the
    provisioner set it): an archive whose check sorts far more than the cap through temporary
    files fails on the server's own limit, whatever its database's size."""
    row = _failed_under_cap(
        8 << 20,
        "CREATE FUNCTION public.spill() RETURNS boolean LANGUAGE sql SET work_mem = '64kB' "
        "AS $f$ SELECT count(*) > 0 FROM (SELECT g FROM generate_series(1, 2000000) g "
        "ORDER BY g DESC) s $f$; "
        "ALTER TABLE ducklake_metadata ADD CONSTRAINT spill CHECK (public.spill())",
        bucket, store_clusters, tenant_catalog, settings,
    )  # fmt: skip
    assert "temporary file size exceeds temp_file_limit (8192kB)" in row.detail, row.detail
    assert _scratch_databases(store_clusters.target) == []
