"""The restore test: are the backups restorable? (docs/backup.md "Restore tests").

A beat-scheduled run (``reshard.backup_restore_test``) takes, for each warehouse with a data
bucket, its newest backup that no restore test has checked yet, streams it from S3 into stock
``pg_restore`` (``reshard.engines.restore.stream``: bounded memory, no temp file) into a scratch
database on the store named by ``DUCKGRES_RESTORE_TEST_STORE``, reads the restored DuckLake state
and compares it with the fingerprint its operation recorded when it verified the copy
(``catalog_fingerprint``). The result is one ``BackupVerification`` row per object; the
listing's ``verified`` and the metric of the newest verified backup's age read those rows.

Invariants:

- **One run at a time.** The run holds the config-store advisory lock
  ``RESTORE_TEST_LOCK_KEY`` (``duckgres_admin.platform.lockkeys``); a second run does nothing.
- **Nothing is left behind.** The scratch database and its role are both
  ``duckgres_restore_test_<installation>_op<id>`` (:func:`installation_prefix`), dropped
  (``WITH (FORCE)``) when the test ends, whatever the result — only when this run created them
  (``CREATE`` fails when the name exists). A run killed in the middle leaves them, and the next
  run drops them before it starts: a database of that name only when the role of the same name
  owns it, and only with this installation's prefix (another installation's run may be live).
- **The archive's code never runs with rights.** The scratch role has no privileges (no
  membership but the database owner's) and a login password made fresh by this run, known only
  to this process and ``pg_restore``'s environment; it owns the scratch database, which nobody
  else may connect to (``REVOKE ALL … FROM PUBLIC``). ``pg_restore`` logs in **as it**, owner
  and privileges not restored (``--no-owner --no-acl``), and the state is read logged in as
  it: a tenant's functions, checks or views run as that role — one that runs ``RESET ROLE``
  returns to it, since it is the session's own login — never as the provisioner.
- **A result is the backup's, not the attempt's.** ``failed`` is recorded only when
  ``pg_restore`` refused the archive or the restored state differs; the scratch store, S3, the
  deadline or a missing client failing records nothing (the backup is tried again next run).
- **Bounded.** At most ``DUCKGRES_RESTORE_TEST_MAX_PER_RUN`` restores per run, each under
  ``DUCKGRES_RESTORE_TEST_TIMEOUT_SECONDS``; every statement on the scratch store has a
  statement and lock timeout.
- **An archive cannot fill the scratch store** (:class:`ScratchGuard`). While ``pg_restore``
  runs, the provisioner reads the scratch database's size every ``SIZE_POLL_SECONDS``; at
  ``STOP_FRACTION`` of ``DUCKGRES_RESTORE_TEST_MAX_DATABASE_BYTES`` — or at the deadline — it
  ends the scratch role's sessions at once and has ``pg_restore`` killed, and the backup is
  recorded ``failed`` naming the cap (the deadline records nothing, as before). Where the
  provisioner may set it, the scratch role's ``temp_file_limit`` is the same cap, so temporary
  files an archive's code makes are bounded by the server itself.
- **Never on a store that serves tenants, unless told.** A scratch store that shares its
  server (host and port) with any store or external binding that a warehouse is bound to is
  refused (:func:`serving_refusal`) unless ``DUCKGRES_RESTORE_TEST_ALLOW_SERVING_STORE``.
- **The archive never reaches ``pg_restore`` in this process with the pod launcher.** The stream
  runs in the sandbox pod (``reshard.engines.restore.sandbox``, ``reshard.launchers.sandbox_pod``),
  which holds the job, the scratch login and an S3 session for the one object; everything else stays
  here.
- **A backup without a fingerprint** (made before operations recorded one, or by a run whose
  verification never finished) passes on a weaker check: it restores, and the three DuckLake
  tables are there; ``detail`` says the fingerprint was missing.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
from django.conf import settings
from django.db.models import Max, Q
from psycopg import sql

from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.lib import pgadmin, secretrefs
from duckgres_admin.lib.s3 import S3, S3Error
from duckgres_admin.models import (
    ACTIVE_STATES,
    BackupVerification,
    MetadataStore,
    ReshardOperation,
    VerificationResult,
    Warehouse,
)
from duckgres_admin.platform.lockkeys import RESTORE_TEST_LOCK_KEY
from reshard.backups import inventory
from reshard.engines import verify
from reshard.engines.backup import KEY_PREFIX
from reshard.engines.clients import BackupSource, server_major
from reshard.engines.restore import sandbox
from reshard.engines.restore.stream import (
    Expected,
    RestoreError,
    installation_tag,
    installation_tags,
    stream_restore,
)
from reshard.launchers import sandbox_pod
from reshard.launchers.base import LauncherError
from reshard.operation import oplog

_log = logging.getLogger("duckgres.reshard.restore_test")

SCRATCH_PREFIX = "duckgres_restore_test_"
STATEMENT_TIMEOUT_SECONDS = 60.0
MAX_WAREHOUSES_PER_RUN = 1000
# The size guard (module doc): how often it reads the scratch database's size, and at which
# fraction of the cap it stops the restore (the margin absorbs what is written between reads).
SIZE_POLL_SECONDS = 0.5
STOP_FRACTION = 0.9


@dataclass
class RestoreTestReport:
    enabled: bool = False
    ran: bool = False  # False: disabled, or another run holds the lock
    tested: list[str] = field(default_factory=list)  # "<uri>: passed|failed"
    swept: list[str] = field(default_factory=list)  # leftover scratch databases dropped
    errors: list[str] = field(default_factory=list)
    bounded: bool = False  # more backups were waiting than one run may test


@dataclass(frozen=True)
class Candidate:
    warehouse: Warehouse
    backup: inventory.Backup
    op: ReshardOperation


@dataclass(frozen=True)
class Only:
    """An on-demand run (docs/backup.md "On demand"): only this org's backup ``key``, tested
    again even when it already has a result (its row is replaced)."""

    org_id: str
    key: str


def installation_prefix() -> str:
    """``duckgres_restore_test_<tag>_``: the tag is this installation's random one
    (``reshard.engines.restore.stream.installation_tag``), so installations sharing a
    scratch store — or test processes sharing one server — never take, or sweep, each other's
    scratch databases."""
    return f"{SCRATCH_PREFIX}{installation_tag()}_"


def sweep_prefixes() -> tuple[str, ...]:
    """The prefixes a sweep recognises: this installation's tag, and the address-derived one an
    upgraded installation named its scratch databases with before."""
    return tuple(f"{SCRATCH_PREFIX}{tag}_" for tag in installation_tags())


def scratch_name(op_id: int) -> str:
    return f"{installation_prefix()}op{op_id}"


def serving_refusal(store: MetadataStore) -> str | None:
    """Why ``store`` may not be the scratch store (None: it may): its server serves a warehouse
    through any registered store of the same host and port, or an external binding there."""
    if settings.DUCKGRES_RESTORE_TEST_ALLOW_SERVING_STORE:
        return None
    same_server = MetadataStore.objects.filter(host=store.host, port=store.port)
    bound = Warehouse.objects.filter(
        Q(metadata_store_kind="cnpg", metadata_store__in=same_server)
        | Q(
            metadata_store_kind="external",
            metadata_store_host=store.host,
            metadata_store_port=store.port,
        )
    ).order_by("org_id")
    first = bound.first()
    if first is None:
        return None
    return (
        f"DUCKGRES_RESTORE_TEST_STORE={store.name!r} is on {store.host}:{store.port}, which "
        f"serves {bound.count()} warehouse(s) (e.g. {first.org_id}): a restore test runs "
        "tenant-controlled archives there; name a store whose server serves no warehouse, or "
        "set DUCKGRES_RESTORE_TEST_ALLOW_SERVING_STORE=true to accept that risk"
    )


def _store(report: RestoreTestReport) -> MetadataStore | None:
    """The configured scratch store; a name that is not a cnpg store, or a store whose server
    serves warehouses (unless allowed), is an error of the run."""
    name: str = settings.DUCKGRES_RESTORE_TEST_STORE
    if not name:
        return None
    report.enabled = True
    store = MetadataStore.objects.filter(name=name).first()
    problem: str | None = None
    if store is None or store.kind != "cnpg":
        problem = (
            f"DUCKGRES_RESTORE_TEST_STORE={name!r} "
            + ("names no metadata store" if store is None else "names an external store")
            + ": name a cnpg store, whose provisioner login creates and drops the scratch "
            "databases"
        )
    else:
        problem = serving_refusal(store)
    if problem:
        report.errors.append(problem)
        _log.warning("restore test: %s", problem)
        return None
    return store


def _admin_conn(store: MetadataStore, password: str, dbname: str = "postgres") -> Any:
    return pgadmin.connect(
        pgadmin.Endpoint(store.host, store.port, store.sslmode),
        dbname=dbname,
        user=store.provisioner_user,
        password=password,
        application_name="duckgres-restore-test",
        statement_timeout=STATEMENT_TIMEOUT_SECONDS,
    )


RELOCK_SECONDS = 10.0


def _drop_scratch(conn: Any, name: str, *, database: bool = True) -> None:
    if database:
        conn.execute(pgadmin.drop_database(name, conn.info.server_version))
    conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


def sweep(store: MetadataStore, password: str) -> list[str]:
    """Drop the scratch databases (and their roles) a killed run left on the store: only those
    a run makes — named ``duckgres_restore_test_…`` and owned by the role of the same name; a
    database of that name someone else owns is not ours to drop. A role of this installation's
    prefix that owns no database (a run killed between creating the two) is dropped too. The
    caller holds the run lock, so no run of this installation is creating one."""
    prefixes = list(sweep_prefixes())
    with _admin_conn(store, password) as conn:
        orphans = [
            str(row[0])
            for row in conn.execute(
                "SELECT r.rolname FROM pg_catalog.pg_roles r "
                "WHERE EXISTS (SELECT 1 FROM unnest(%s::text[]) p WHERE starts_with(r.rolname, p)) "
                "AND NOT EXISTS (SELECT 1 FROM pg_catalog.pg_database d WHERE d.datdba = r.oid)",
                (prefixes,),
            )
        ]
        for name in orphans:
            _drop_scratch(conn, name, database=False)
        names = [
            str(row[0])
            for row in conn.execute(
                "SELECT d.datname FROM pg_catalog.pg_database d "
                "JOIN pg_catalog.pg_roles r ON r.oid = d.datdba "
                "WHERE EXISTS (SELECT 1 FROM unnest(%s::text[]) p WHERE starts_with(d.datname, p)) "
                "AND r.rolname = d.datname",
                (prefixes,),
            )
        ]
        for name in names:
            _drop_scratch(conn, name)
    return names


def _verifier(conn: Any, name: str, password: str) -> str:
    """A client-side SCRAM verifier: the password itself never reaches SQL or a server log."""
    verifier = conn.pgconn.encrypt_password(password.encode(), name.encode(), b"scram-sha-256")
    return str(verifier.decode())


def _create_scratch(conn: Any, name: str, password: str, made: list[str]) -> None:
    """A role with no rights, owning a database nobody else may connect to, that logs in with
    a password only this run knows: ``pg_restore`` and the verification log in **as it**, so
    the archive's code (a tenant's functions, checks, views) runs as that role — even one that
    resets the role returns to it, never to the provisioner — and no other login can reach
    what it restored. One session at most (``pg_restore``'s, then the read's): an archive that
    sets the role's password finds no free slot. ``made`` records what was created, for the
    caller's cleanup."""
    ident = sql.Identifier(name)
    conn.execute(
        sql.SQL("CREATE ROLE {} LOGIN CONNECTION LIMIT 1 PASSWORD {}").format(
            ident, sql.Literal(_verifier(conn, name, password))
        )
    )
    made.append("role")
    _limit_temp_files(conn, name)
    conn.execute(sql.SQL("GRANT {} TO CURRENT_USER").format(ident))
    conn.execute(sql.SQL("CREATE DATABASE {} OWNER {} TEMPLATE template0").format(ident, ident))
    made.append("database")
    conn.execute(sql.SQL("REVOKE ALL ON DATABASE {} FROM PUBLIC").format(ident))


def _limit_temp_files(conn: Any, name: str) -> None:
    """The scratch role's ``temp_file_limit`` (kB) = the size cap, where the provisioner may
    set that parameter (a superuser's ``GRANT SET ON PARAMETER temp_file_limit TO <it>``, 15+);
    otherwise a warning naming that grant, and only the database's size is guarded."""
    row = conn.execute("SELECT " + pgadmin.may_set_sql(conn, "temp_file_limit")).fetchone()
    if not row or not row[0]:
        _log.warning(
            "restore test: the provisioner may not set temp_file_limit on the scratch store, so "
            "an archive's temporary files are not bounded (its database still is); a superuser "
            "can allow it: GRANT SET ON PARAMETER temp_file_limit TO <provisioner>"
        )
        return
    limit_kb = max(1, int(settings.DUCKGRES_RESTORE_TEST_MAX_DATABASE_BYTES) // 1024)
    conn.execute(
        sql.SQL("ALTER ROLE {} SET temp_file_limit = {}").format(
            sql.Identifier(name), sql.Literal(f"{limit_kb}kB")
        )
    )


class CapExceeded(Exception):
    """The restored database grew to the size guard's stop point."""


class ScratchGuard:
    """Guards one ``pg_restore`` (module doc): a thread of its own with its own provisioner
    connection reads the scratch database's size every ``SIZE_POLL_SECONDS``; at the stop point
    or the deadline it ends every session of the scratch role at once, and
    :meth:`should_stop` then has the restore's watchdog kill ``pg_restore``. A guard that loses
    its connection stops the restore too (``lost``): an unguarded restore does not go on."""

    def __init__(self, store: MetadataStore, password: str, scratch: str, deadline: float) -> None:
        self.store, self.password, self.scratch, self.deadline = store, password, scratch, deadline
        self.cap = int(settings.DUCKGRES_RESTORE_TEST_MAX_DATABASE_BYTES)
        self.stop_at = int(self.cap * STOP_FRACTION)
        self.seen = 0
        self.over_cap = False
        self.lost = ""
        self._tripped = threading.Event()
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="restore-test-guard", daemon=True)

    def __enter__(self) -> ScratchGuard:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._done.set()
        self._thread.join(timeout=STATEMENT_TIMEOUT_SECONDS)

    def should_stop(self) -> bool:
        return self._tripped.is_set()

    def _watch(self) -> None:
        try:
            with _admin_conn(self.store, self.password) as conn:
                while not self._done.wait(SIZE_POLL_SECONDS):
                    row = conn.execute(
                        "SELECT pg_catalog.pg_database_size(%s)", (self.scratch,)
                    ).fetchone()
                    self.seen = int(row[0]) if row and row[0] is not None else 0
                    self.over_cap = self.seen >= self.stop_at
                    if self.over_cap or time.monotonic() > self.deadline:
                        self._tripped.set()
                        conn.execute(
                            "SELECT count(pg_catalog.pg_terminate_backend(pid)) "
                            "FROM pg_catalog.pg_stat_activity WHERE usename = %s",
                            (self.scratch,),
                        )
                        return
        except psycopg.Error as exc:
            if not self._done.is_set():
                self.lost = " ".join(str(exc).split())
                self._tripped.set()

    def cap_message(self) -> str:
        return (
            f"the restored database reached {self.seen} bytes, {STOP_FRACTION:.0%} of the cap "
            f"DUCKGRES_RESTORE_TEST_MAX_DATABASE_BYTES={self.cap}: the archive expands past what "
            "a restore test may write; its sessions were ended and pg_restore stopped (raise the "
            "cap if this catalog is really that large)"
        )


def _relock_scratch(conn: Any, name: str, password: str) -> None:
    """After ``pg_restore``: NOLOGIN with a new password (one the archive may have set is void;
    a login past its password check but not yet in is refused by the NOLOGIN it then reads),
    every session of the role seen gone (a termination is asynchronous), then LOGIN again for
    the read."""
    ident = sql.Identifier(name)
    conn.execute(
        sql.SQL("ALTER ROLE {} NOLOGIN PASSWORD {}").format(
            ident, sql.Literal(_verifier(conn, name, password))
        )
    )
    deadline = time.monotonic() + RELOCK_SECONDS
    quiet = 0
    while quiet < 2:  # seen gone twice, a moment apart: a login may still be starting
        ended = conn.execute(
            "SELECT count(pg_catalog.pg_terminate_backend(pid)) FROM pg_catalog.pg_stat_activity "
            "WHERE usename = %s",
            (name,),
        ).fetchone()
        quiet = quiet + 1 if not ended or not ended[0] else 0
        if quiet:
            time.sleep(0.1)
            continue
        if time.monotonic() > deadline:
            raise psycopg.OperationalError(
                f"{ended[0]} session(s) of {name} did not end within {RELOCK_SECONDS:.0f} s"
            )
        time.sleep(0.1)
    conn.execute(sql.SQL("ALTER ROLE {} LOGIN").format(ident))


def candidates(
    now: dt.datetime,
    client_for: Callable[[Warehouse], S3],
    report: RestoreTestReport,
    only: Only | None = None,
) -> Iterator[Candidate]:
    """Per warehouse (least recently tested first), its newest backup with no test result;
    with ``only``, that one backup of that one warehouse, whatever its result."""
    last = dict(
        BackupVerification.objects.values("org_id")
        .annotate(at=Max("checked_at"))
        .values_list("org_id", "at")
    )
    with_bucket = Warehouse.objects.exclude(Q(data_bucket="") | Q(data_bucket__isnull=True))
    if only is not None:
        with_bucket = with_bucket.filter(org_id=only.org_id)
    warehouses = list(with_bucket.order_by("org_id")[:MAX_WAREHOUSES_PER_RUN])
    epoch = dt.datetime.min.replace(tzinfo=dt.UTC)
    warehouses.sort(key=lambda wh: (last.get(wh.org_id) or epoch, wh.org_id))
    for wh in warehouses:
        try:
            objects, truncated = client_for(wh).list_objects(
                wh.data_bucket, KEY_PREFIX, limit=inventory.LIST_MAX_OBJECTS
            )
        except S3Error as exc:
            report.errors.append(f"{wh.org_id}: s3://{wh.data_bucket}/{KEY_PREFIX}: {exc}")
            continue
        listing = inventory.belonging(wh, objects, truncated, now)
        # A backup of an active operation may still lack its fingerprint: tested once it ended.
        untested = [
            b
            for b in listing.backups
            if b.op_state not in ACTIVE_STATES
            and (b.key == only.key if only is not None else b.verified is None)
        ]
        if not untested:
            if only is not None:
                report.errors.append(
                    f"{wh.org_id}: {only.key} is no longer a backup of this warehouse whose "
                    "operation has ended: nothing tested"
                )
            continue
        op = ReshardOperation.objects.filter(pk=untested[0].op_id, org_id=wh.org_id).first()
        if op is not None:
            yield Candidate(wh, untested[0], op)


def _check(state: verify.DuckLakeState, fingerprint: Any) -> tuple[bool, str]:
    try:
        restored = verify.check_restore(state, fingerprint)
    except verify.VerifyError as exc:
        return False, str(exc)
    if restored is not None:
        return True, restored.restore_line("operation's")
    return True, (
        "restored; the operation recorded no DuckLake fingerprint (it predates them or never "
        "verified its copy), so only the presence of the DuckLake tables was checked"
    )


def _restore_and_read(
    candidate: Candidate, store: MetadataStore, password: str, s3: S3, scratch: str, login: str
) -> verify.DuckLakeState:
    with _admin_conn(store, password) as conn:
        major = server_major(int(str(conn.execute("SHOW server_version_num").fetchone()[0])))
    target = BackupSource(store.host, store.port, scratch, scratch, store.sslmode, login)
    timeout = float(settings.DUCKGRES_RESTORE_TEST_TIMEOUT_SECONDS)
    with ScratchGuard(store, password, scratch, time.monotonic() + timeout) as guard:
        try:
            if settings.DUCKGRES_RESHARD_LAUNCHER == "pod":
                _in_sandbox(candidate, target, major, timeout, guard.should_stop)
            else:
                stream_restore(
                    s3,
                    candidate.warehouse.data_bucket,
                    candidate.backup.key,
                    target,
                    server_major=major,
                    timeout_seconds=timeout,
                    should_stop=guard.should_stop,
                    if_match=candidate.backup.etag,
                    expected=Expected(
                        candidate.backup.sha256, candidate.backup.size, candidate.backup.version_id
                    ),
                )
        except RestoreError:
            if not guard.over_cap:
                raise
        if guard.lost:
            raise Inconclusive(f"the scratch store's size guard failed: {guard.lost}")
        if guard.over_cap:
            raise CapExceeded(guard.cap_message())
    reader = secrets.token_urlsafe(32)
    with _admin_conn(store, password) as conn:
        _relock_scratch(conn, scratch, reader)
    with pgadmin.connect(
        pgadmin.Endpoint(store.host, store.port, store.sslmode),
        dbname=scratch,
        user=scratch,
        password=reader,
        application_name="duckgres-restore-test",
        statement_timeout=STATEMENT_TIMEOUT_SECONDS,
    ) as conn:
        return verify.read_state(conn)


def _in_sandbox(
    candidate: Candidate,
    target: BackupSource,
    major: int,
    timeout: float,
    should_stop: Callable[[], bool],
) -> None:
    """The stream in the sandbox pod (``reshard.engines.restore.sandbox``): the archive never
    reaches ``pg_restore`` inside this process."""
    backup = candidate.backup
    job = sandbox.Job(
        bucket=candidate.warehouse.data_bucket,
        key=backup.key,
        etag=backup.etag,
        sha256=backup.sha256,
        size=backup.size,
        version_id=backup.version_id,
        host=target.host,
        port=target.port,
        database=target.database,
        user=target.user,
        sslmode=target.sslmode,
        server_major=major,
        timeout_seconds=timeout,
    )
    try:
        message = sandbox_pod.restore(
            job, target.password, candidate.warehouse, candidate.op.id, should_stop=should_stop
        )
    except LauncherError as exc:
        raise Inconclusive(str(exc)) from None
    _log.info("restore test of s3://%s/%s in its sandbox pod: %s", job.bucket, job.key, message,
              extra={"op_id": candidate.op.id})  # fmt: skip


def test_one(
    candidate: Candidate, store: MetadataStore, password: str, s3: S3
) -> BackupVerification | None:
    """Restore one backup into a fresh scratch database, check it, record the result, drop it.

    A result is recorded only when the backup itself decided it: ``pg_restore`` refused the
    archive, or the restored state differs. A problem of the attempt (the scratch store, S3,
    the deadline, no client) records nothing — the backup is tried again next run — and raises
    :class:`Inconclusive`."""
    wh, backup, op = candidate.warehouse, candidate.backup, candidate.op
    scratch = scratch_name(op.id)
    login = secrets.token_urlsafe(32)
    started = time.monotonic()
    made: list[str] = []
    try:
        with _admin_conn(store, password) as conn:
            _create_scratch(conn, scratch, login, made)
        state = _restore_and_read(candidate, store, password, s3, scratch, login)
        ok, detail = _check(state, op.catalog_fingerprint)
    except CapExceeded as exc:
        ok, detail, state = False, str(exc), None
    except RestoreError as exc:
        if not exc.archive_fault:
            raise Inconclusive(str(exc)) from None
        ok, detail, state = False, str(exc), None
    except psycopg.Error as exc:
        raise Inconclusive(f"the scratch store failed: {' '.join(str(exc).split())}") from None
    finally:
        if made:  # only what this run created: a database of that name may be another run's
            with contextlib.suppress(psycopg.Error), _admin_conn(store, password) as conn:
                _drop_scratch(conn, scratch, database="database" in made)
    detail = process_scrubber(password, login).scrub(detail)[:2000]
    row, _ = BackupVerification.objects.update_or_create(
        bucket=wh.data_bucket,
        key=backup.key,
        defaults={
            "org_id": wh.org_id,
            "op_id": op.id,
            "result": VerificationResult.PASSED if ok else VerificationResult.FAILED,
            "detail": detail,
            "store": store.name,
            "object_bytes": backup.size,
            "object_modified": backup.last_modified,
            "snapshot_id": state.snapshot_id if state else None,
            "data_files": state.data_files if state else None,
            "restore_seconds": round(time.monotonic() - started, 3),
            "checked_at": dt.datetime.now(dt.UTC),
        },
    )
    uri = f"s3://{wh.data_bucket}/{backup.key}"
    message = f"restore test of {uri} on store {store.name}: {row.result}: {detail}"
    _log.log(logging.INFO if ok else logging.WARNING, message, extra={"op_id": op.id})
    with contextlib.suppress(Exception):
        oplog.append(op.id, message, level="info" if ok else "warn", source="janitor")
    return row


class Inconclusive(Exception):
    """The attempt failed for a reason that says nothing about the backup."""


def _test_each(
    report: RestoreTestReport,
    store: MetadataStore,
    password: str,
    make_client: Callable[[Warehouse], S3],
    now: dt.datetime,
    only: Only | None = None,
) -> None:
    limit: int = settings.DUCKGRES_RESTORE_TEST_MAX_PER_RUN
    for candidate in candidates(now, make_client, report, only):
        if len(report.tested) >= limit or not inventory.lock_held(RESTORE_TEST_LOCK_KEY):
            report.bounded = True
            return
        uri = f"s3://{candidate.warehouse.data_bucket}/{candidate.backup.key}"
        try:
            row = test_one(candidate, store, password, make_client(candidate.warehouse))
        except (Inconclusive, S3Error, OSError) as exc:
            report.errors.append(f"{uri}: {exc}")
            _log.warning("restore test of %s was inconclusive (tried again next run): %s", uri, exc)
            continue
        if row is not None:
            report.tested.append(f"s3://{row.bucket}/{row.key}: {row.result}")


def run(
    *,
    now: dt.datetime | None = None,
    client_for: Callable[[Warehouse], S3] | None = None,
    only: Only | None = None,
) -> RestoreTestReport:
    """One bounded, fleet-wide run (module doc), or with ``only`` the test of that one backup.
    Never raises for S3 or store problems."""
    report = RestoreTestReport()
    store = _store(report)
    if store is None:
        return report
    make_client = client_for or inventory.warehouse_client
    with inventory.run_lock(RESTORE_TEST_LOCK_KEY) as taken:
        if not taken:
            _log.info("restore test: another run holds the lock; this run does nothing")
            return report
        report.ran = True
        try:
            password = secretrefs.resolve(store.provisioner_password_ref)
            report.swept = sweep(store, password)
            if settings.DUCKGRES_RESHARD_LAUNCHER == "pod":
                report.swept += sandbox_pod.sweep()
        except (secretrefs.SecretRefError, psycopg.Error) as exc:
            report.errors.append(f"store {store.name}: {exc}")
            _log.warning("restore test: the scratch store %s is unusable: %s", store.name, exc)
            return report
        _test_each(report, store, password, make_client, now or dt.datetime.now(dt.UTC), only)
    return report
