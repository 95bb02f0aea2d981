"""Streamed catalog backup: ``pg_dump`` stdout → S3 multipart upload (spec reshard §4.10).

Interface (wired into the ``backup_catalog`` step by the runner, spec §4.4 G)::

    result = run_backup(op_id, source, destination, hooks, mandatory=..., restore_to=...)
    # → BackupResult(uri, bytes, key, part_size, parts, restore_command, ...)
    # raises BackupError(message) on every failure; the caller applies the direction gate.

Guarantees:
- the password reaches ``pg_dump`` only as ``PGPASSWORD`` in its environment, never in argv;
- ``pg_dump`` gets a minimal environment (``PATH``, locale, ``PGPASSWORD``), never the runner's
  own (no config-store DSN, no AWS keys, no ``PG*`` variable of the runner) (safeguard
  reshard-69);
- every connection parameter is passed in one conninfo string built with ``make_conninfo``
  (``--dbname=<conninfo>``): a database, role or host name is only ever a quoted value, so a
  name containing ``host=… sslmode=disable`` can never redirect the connection (safeguard
  reshard-65). The same TLS policy as every store connection (``lib.pgadmin.tls_params``:
  TLS mandatory, ``verify-full`` by default, the configured CA, ``channel_binding=require`` and
  ``require_auth=scram-sha-256`` when the client's libpq knows it — either makes libpq refuse a
  cleartext password request; where channel binding is exempt only a ``require_auth`` client is
  used, else the backup is refused; safeguards reshard-68, reshard-123), and the password only
  to an endpoint its secret reference is bound to (safeguard reshard-124);
- ``pg_dump`` waits for its table locks at most ``lock_wait_seconds`` (``--lock-wait-timeout``;
  safeguard reshard-66);
- the restore command written to the op log quotes every part for a POSIX shell
  (``shlex.quote``), its connections again one conninfo value each (safeguards reshard-65,
  reshard-69); it works as printed after the operation (safeguard reshard-71): it restores into
  a NEW database on the server the backup came from, as a login the operator supplies through
  ``PGUSER``/``PGPASSWORD``, and the line states its prerequisites (no password in it);
- memory is bounded: three part buffers at most (two uploading, one filling), recycled;
- every failure path kills and reaps ``pg_dump``, terminates its server session (a killed
  client leaves its backend waiting for a lock, holding the ones it has: it is found by the
  ``application_name`` the dump connects with, ``duckgres-reshard-op-<id>-pg_dump``) and aborts
  the multipart upload (or deletes the completed object), so no partial object, no open upload
  and no orphaned session is left behind;
- the uploaded size is checked with ``HEAD`` against the bytes ``pg_dump`` produced (the ETag
  of ``CompleteMultipartUpload`` is never used: Ceph RGW returns it empty);
- no tagging, no metadata: ``s3:PutObject`` (+ multipart) is the only permission needed.

Messages never include the password; the caller still passes them through its scrubber.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import fcntl
import hashlib
import math
import mmap
import queue
import subprocess
import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Protocol

from django.conf import settings

from duckgres_admin.lib.pgadmin import (
    Endpoint,
    connect,
)
from duckgres_admin.lib.s3 import S3, ObjectHead, S3Error, Uploaded, session_name_for_op
from duckgres_admin.platform.names import runner_name
from reshard.engines import testhooks
from reshard.engines.clients import (
    BackupSource,
    NoPgClient,
    PgClient,
    StderrTail,
    choose_client,
    knows_require_auth,
    needs_require_auth,
    pg_dump_env,
    server_major,
    source_conninfo,
)
from reshard.engines.restore.command import (
    Recorded,
    RestoreTarget,
    restore_command,
    restore_line,
    restore_prerequisites,
    restored_database_name,
)

__all__ = [
    "BackupDestination",
    "BackupError",
    "BackupHooks",
    "BackupResult",
    "SourceFacts",
    "abort_stale_uploads",
    "backup_key",
    "compression_flag",
    "gated_failure",
    "part_size_for",
    "pg_dump_argv",
    "read_source_facts",
    "run_backup",
]

MIB = 1 << 20
MIN_PART_SIZE = 16 * MIB
MAX_PART_SIZE = 5 * 1024 * MIB  # the S3 per-part limit
UNREADABLE_SIZE_PART = 64 * MIB
KEY_PREFIX = "_reshard_catalog_backups/"
CONCURRENCY = 2  # parts in flight; plus one filling → at most 3 buffers
PROGRESS_INTERVAL_SECONDS = 2.0
STOP_POLL_SECONDS = 0.2
PIPE_SIZE = 1 * MIB  # best effort F_SETPIPE_SZ: fewer wakeups per part
_F_SETPIPE_SZ = 1031
READ_CHUNK = 1 * MIB
ABORT_ATTEMPTS = 3
PREPARE_WAIT_SECONDS = 120.0  # the S3 client + CreateMultipartUpload (botocore bounds each call)
STALE_WAIT_SECONDS = 15.0
# pg_dump's lock wait when the caller passes none (the runner passes its step's deadline).
DEFAULT_LOCK_WAIT_SECONDS = 900.0

# DUCKGRES_RESHARD_BACKUP_COMPRESSION → pg_dump's --compress. The integer form means zlib at
# that level (0 = none) for every pg_dump from 15 (which knows no other) to 18, and every stock
# pg_restore reads such an archive. lz4/zstd are not offered: pg_dump 15 lacks them and their
# archives need a pg_restore 16+ built with the library (the restore line allows 15).
COMPRESSION_LEVELS: dict[str, int] = {"none": 0, **{f"gzip:{n}": n for n in range(1, 10)}}

EMPTY_ARCHIVE = "pg_dump produced an empty archive — refusing to record a useless backup"
ANNOUNCE_SUFFIX_MANDATORY = " — HARD prerequisite for the destructive cnpg→external direction"


class BackupError(RuntimeError):
    """The backup failed; nothing was left in S3. The message names what failed."""


class BackupHooks(Protocol):
    """What the backup needs from the run context."""

    def log(self, level: str, message: str) -> None:
        """``level``: ``info`` | ``warn`` | ``error`` (op log + process log)."""

    def progress(self, values: dict[str, int]) -> None:
        """``{"bytes_dumped": n, "backup_parts": k}``; called at most every 2 s."""

    def register_process(self, proc: subprocess.Popen[bytes]) -> None:
        """The ``pg_dump`` child: fencing may ``kill()`` it at any time."""

    def unregister_process(self, proc: subprocess.Popen[bytes]) -> None: ...

    def stopped(self) -> bool:
        """True once the runner must stop (SIGTERM, fenced): the backup aborts promptly."""


@dataclass(frozen=True)
class BackupDestination:
    """The warehouse's ``data_bucket`` / ``data_region`` / ``data_role_arn``."""

    bucket: str
    region: str = ""
    role_arn: str = ""


@dataclass(frozen=True)
class SourceFacts:
    """Read from the source before the dump (the dry run computes the same)."""

    server_major: int
    db_size: int | None  # None: unreadable → 64 MiB parts


@dataclass(frozen=True)
class BackupResult:
    uri: str
    bytes: int
    key: str
    part_size: int
    parts: int
    restore_command: str
    peak_buffered_bytes: int = 0
    pg_dump_version: str = ""
    restore_prerequisites: str = ""
    sha256: str = ""  # of the bytes written, computed while they streamed
    etag: str = ""  # as the store reports it after the completion (no quotes)
    version_id: str = ""  # '' in an unversioned bucket

    def log_lines(self) -> list[str]:
        """The op-log lines of a successful backup (spec §4.4 G, §4.10 step 7): the restore
        line is ``restore command (needs <prerequisites>): <command>``."""
        key = self.uri.removeprefix("s3://").partition("/")[2]
        return [
            f"catalog backup complete: {self.uri} ({self.bytes} bytes, sha256 {self.sha256}"
            + (f", version {self.version_id}" if self.version_id else "")
            + ")",
            "to restore it, start a restore operation (checked, fenced, rolled back on failure): "
            f"duckgres restore start <org> --backup {key} --to-shard <store> "
            "(docs/restore.md); by hand, the line below",
            restore_line(self.restore_command, self.restore_prerequisites),
        ]


MANDATORY_PREFIX = (
    "pre-flip catalog backup is mandatory for the destructive cnpg→external direction"
)
OPTIONAL_SUFFIX = " — continuing without a backup"


def gated_failure(error: BackupError | str, *, mandatory: bool) -> str:
    """The direction gate's text (spec §4.4 G): for cnpg→external (``mandatory``) the step's
    error, else the warning logged before the step continues without a backup."""
    if mandatory:
        return f"{MANDATORY_PREFIX}: {error}"
    return f"catalog backup failed: {error}{OPTIONAL_SUFFIX}"


# --- pure helpers ------------------------------------------------------------------------------
def part_size_for(db_size: int | None, max_parts: int) -> int:
    """``max(16 MiB, ceil_to_MiB(2 * db_size / max_parts))`` capped at 5 GiB; unknown: 64 MiB."""
    if db_size is None:
        return UNREADABLE_SIZE_PART
    want = math.ceil(2 * max(db_size, 0) / max(max_parts, 1) / MIB) * MIB
    return min(MAX_PART_SIZE, max(MIN_PART_SIZE, want))


def backup_key(op_id: int, now: dt.datetime | None = None) -> str:
    stamp = (now or dt.datetime.now(dt.UTC)).astimezone(dt.UTC).strftime("%Y%m%dT%H%M%SZ")
    return f"{KEY_PREFIX}op-{op_id}-{stamp}.dump"


def format_mib(size: int) -> str:
    return str(size // MIB) if size % MIB == 0 else f"{size / MIB:.2f}"


def pg_dump_application_name(op_id: int) -> str:
    return runner_name(op_id, "-pg_dump")


def compression_flag(compression: str | None = None) -> str:
    """``--compress=<0-9>`` for a ``DUCKGRES_RESHARD_BACKUP_COMPRESSION`` value (default: the
    setting, validated when the settings load)."""
    value = settings.DUCKGRES_RESHARD_BACKUP_COMPRESSION if compression is None else compression
    try:
        return f"--compress={COMPRESSION_LEVELS[value]}"
    except KeyError:
        allowed = ", ".join(COMPRESSION_LEVELS)
        raise ValueError(
            f"DUCKGRES_RESHARD_BACKUP_COMPRESSION={value!r} is not one of: {allowed}"
        ) from None


def pg_dump_argv(
    client: PgClient,
    source: BackupSource,
    *,
    lock_wait_seconds: float = DEFAULT_LOCK_WAIT_SECONDS,
    application_name: str = "pg_dump",
    compression: str | None = None,
) -> list[str]:
    """Spec §4.10 step 4 with every connection parameter in ``--dbname=<conninfo>``: no
    ``--file``, no password, a bounded lock wait, the configured compression."""
    conninfo = source_conninfo(
        source, require_auth=knows_require_auth(client), application_name=application_name
    )
    argv = [
        client.pg_dump,
        "--format=custom",
        compression_flag(compression),
        "--no-owner",
        "--schema=public",
        f"--lock-wait-timeout={max(1, int(lock_wait_seconds * 1000))}",
        f"--dbname={conninfo}",
    ]
    if source.role:
        argv.append(f"--role={source.role}")
    return argv


def read_source_facts(source: BackupSource) -> SourceFacts:
    """Server major (required) and database size (optional) over one short connection."""
    try:
        with connect(
            Endpoint(source.host, source.port, source.sslmode),
            dbname=source.database,
            user=source.user,
            password=source.password,
            application_name="duckgres-reshard-backup",
        ) as conn:
            row = conn.execute("SELECT current_setting('server_version_num')::int").fetchone()
            major = server_major(int(str(row[0]))) if row else 0
            size: int | None
            try:
                srow = conn.execute("SELECT pg_database_size(current_database())").fetchone()
                size = int(str(srow[0])) if srow and srow[0] is not None else None
            except Exception:  # noqa: BLE001 - any failure: size unknown, 64 MiB parts
                size = None
    except Exception as exc:  # reported as the backup's failure
        raise BackupError(
            f"cannot read the server version of {source.redacted()}: {type(exc).__name__}: {exc}"
        ) from exc
    return SourceFacts(major, size)


# --- the upload loop ---------------------------------------------------------------------------
class _PartReader:
    """A seekable, sized, read-only file over a slice of a part buffer (no copy of the part).

    botocore hashes and sends it by reading small chunks, and rewinds it on retries."""

    def __init__(self, view: memoryview) -> None:
        self._view = view
        self._pos = 0

    def __len__(self) -> int:
        return len(self._view)

    def read(self, size: int = -1) -> bytes:
        total = len(self._view)
        end = total if size is None or size < 0 else min(total, self._pos + size)
        chunk = bytes(self._view[self._pos : end])
        self._pos = end
        return chunk

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: len(self._view)}[whence]
        self._pos = max(0, min(len(self._view), base + offset))
        return self._pos

    def tell(self) -> int:
        return self._pos


@dataclass(frozen=True)
class _Prepared:
    s3: S3
    upload_id: str


class _Backup:
    def __init__(
        self,
        *,
        prepared: Future[_Prepared],
        bucket: str,
        key: str,
        part_size: int,
        max_parts: int,
        hooks: BackupHooks,
        source: BackupSource,
        application_name: str = "pg_dump",
    ) -> None:
        # The S3 client and the upload id come from a helper thread, overlapping pg_dump's start.
        self.application_name = application_name
        self.prepared = prepared
        self.bucket = bucket
        self.key = key
        self.uri = f"s3://{bucket}/{key}"
        self.part_size = part_size
        self.max_parts = max_parts
        self.hooks = hooks
        self.source = source
        self.proc: subprocess.Popen[bytes] | None = None
        self.stderr: StderrTail | None = None
        self.pool: ThreadPoolExecutor | None = None
        self.futures: list[Future[Uploaded]] = []
        self.free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()
        self.buffers: list[mmap.mmap] = []
        self.lock = threading.Lock()
        self.in_flight_bytes = 0
        self.peak_buffered = 0
        self.total = 0
        self.parts_started = 0
        self.parts_done = 0
        # The object's identity (docs/backup.md "Authenticated backups"): every byte pg_dump
        # wrote, hashed as it lands in a part buffer (hashlib releases the GIL on such chunks).
        self.digest = hashlib.sha256()
        self.stop = threading.Event()  # our own: set on failure or when hooks.stopped()
        self.finished = threading.Event()
        self.last_progress = 0.0

    # -- buffers ----------------------------------------------------------------------------------
    def _take_buffer(self) -> mmap.mmap:
        """A free part buffer; allocates up to CONCURRENCY + 1, else waits for an upload."""
        try:
            return self.free.get_nowait()
        except queue.Empty:
            pass
        if len(self.buffers) < CONCURRENCY + 1:
            # Anonymous mappings: pages are touched only as data arrives (a small last part
            # costs only its size) and unmapped on close (no heap retention after the backup).
            buf = mmap.mmap(-1, self.part_size)
            self.buffers.append(buf)
            return buf
        while True:
            self._check()
            try:
                return self.free.get(timeout=STOP_POLL_SECONDS)
            except queue.Empty:
                continue

    def _note_buffered(self, filling: int) -> None:
        with self.lock:
            self.peak_buffered = max(self.peak_buffered, self.in_flight_bytes + filling)

    # -- checks -----------------------------------------------------------------------------------
    def _check(self) -> None:
        """Raise on the first failed part upload, or when the runner must stop."""
        if self.stop.is_set() or self.hooks.stopped():
            raise BackupError(f"backup to {self.uri} interrupted: the runner is stopping")
        pending: list[Future[Any]] = [self.prepared, *self.futures]
        for fut in pending:
            if fut.done():
                exc = fut.exception()
                if isinstance(exc, BackupError):
                    raise exc
                if exc is not None:
                    raise BackupError(f"upload backup to {self.uri}: {exc}") from exc

    def _progress(self, force: bool = False) -> None:
        now = time.monotonic()
        if force or now - self.last_progress >= PROGRESS_INTERVAL_SECONDS:
            self.last_progress = now
            self.hooks.progress({"bytes_dumped": self.total, "backup_parts": self.parts_done})

    # -- part upload (worker threads) -------------------------------------------------------------
    def _upload(self, number: int, buf: mmap.mmap, length: int) -> Uploaded:
        try:
            upload = self.prepared.result()  # waits for the upload id (first parts only)
            if self.stop.is_set():
                raise BackupError("cancelled")
            with memoryview(buf) as view:
                result = upload.s3.upload_part(
                    self.bucket, self.key, upload.upload_id, number, _PartReader(view[:length])
                )
            with self.lock:
                self.parts_done += 1
            testhooks.kill_point("backup_part_uploaded")  # tests only: an upload left open
            return result
        finally:
            with self.lock:
                self.in_flight_bytes -= length
            # Give the uploaded part's pages back: resident memory then follows the bytes
            # actually buffered, not the high-water mark of three full buffers.
            with contextlib.suppress(OSError, ValueError, AttributeError):
                buf.madvise(mmap.MADV_DONTNEED)
            self.free.put(buf)

    def _submit(self, buf: mmap.mmap, length: int) -> None:
        assert self.pool is not None
        self.parts_started += 1
        with self.lock:
            self.in_flight_bytes += length
            self.peak_buffered = max(self.peak_buffered, self.in_flight_bytes)
        self.futures.append(self.pool.submit(self._upload, self.parts_started, buf, length))

    # -- stop watcher -----------------------------------------------------------------------------
    def _watch_stop(self) -> None:
        """Kill ``pg_dump`` as soon as the runner must stop, even while a read is blocked."""
        while not self.finished.wait(STOP_POLL_SECONDS):
            if self.hooks.stopped():
                self.stop.set()
                self._kill()
                return

    def _kill(self) -> None:
        proc = self.proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.kill()

    # -- main -------------------------------------------------------------------------------------
    def run(self, argv: list[str], env: dict[str, str]) -> list[Uploaded]:
        self.pool = ThreadPoolExecutor(max_workers=CONCURRENCY, thread_name_prefix="backup-part")
        watcher = threading.Thread(target=self._watch_stop, name="backup-stop", daemon=True)
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                env=env,
                bufsize=0,
                # No controlling terminal: libpq can never sit in a /dev/tty password prompt.
                start_new_session=True,
            )
            self.hooks.register_process(self.proc)
            self.stderr = StderrTail(self.proc.stderr)
            watcher.start()
            assert self.proc.stdout is not None
            stdout = self.proc.stdout
            with contextlib.suppress(OSError):
                fcntl.fcntl(stdout.fileno(), _F_SETPIPE_SZ, PIPE_SIZE)
            self._pump(stdout)
            self._check()  # a stop kills pg_dump: report the stop, not its exit status
            rc = self._reap()
            if rc != 0:
                stderr = self.stderr.text() if self.stderr else ""
                raise BackupError(
                    f"pg_dump of {self.source.redacted()} failed with exit status {rc}"
                    + (f": {stderr}" if stderr else "")
                )
            self.prepared.result()
            for fut in self.futures:
                fut.result()  # wait; a failed part raises into the handler below
            self._check()
            if self.total == 0:
                raise BackupError(EMPTY_ARCHIVE)
            return [f.result() for f in self.futures]
        except BaseException as exc:
            self.stop.set()
            self._cleanup_failed()
            if isinstance(exc, BackupError):
                raise
            if isinstance(exc, S3Error):
                raise BackupError(f"upload backup to {self.uri}: {exc}") from exc
            if isinstance(exc, Exception):
                raise BackupError(f"backup to {self.uri}: {type(exc).__name__}: {exc}") from exc
            raise
        finally:
            self.finished.set()
            if self.pool is not None:
                self.pool.shutdown(wait=True, cancel_futures=True)
            if self.proc is not None:
                self.hooks.unregister_process(self.proc)
            for buf in self.buffers:
                with contextlib.suppress(BufferError):  # a view still alive: GC unmaps it
                    buf.close()

    def _pump(self, stdout: Any) -> None:
        buf: mmap.mmap | None = None
        view: memoryview | None = None
        filled = 0
        try:
            while True:
                self._check()
                if buf is None:
                    buf = self._take_buffer()
                    view = memoryview(buf)
                    filled = 0
                assert view is not None
                n = stdout.readinto(view[filled : min(self.part_size, filled + READ_CHUNK)])
                if not n:
                    break
                if filled == 0 and self.parts_started >= self.max_parts:
                    raise BackupError(
                        f"backup exceeded {self.max_parts} parts of "
                        f"{format_mib(self.part_size)} MiB"
                    )
                self.digest.update(view[filled : filled + n])
                filled += n
                with self.lock:
                    self.total += n
                self._note_buffered(filled)
                if filled == self.part_size:
                    view.release()
                    view = None
                    self._submit(buf, filled)
                    buf = None
                self._progress()
            self._check()
            if buf is not None and filled > 0:
                if view is not None:
                    view.release()
                    view = None
                self._submit(buf, filled)
                buf = None
        finally:
            if view is not None:
                view.release()
            if buf is not None:
                self.free.put(buf)

    def _reap(self, timeout: float = 60.0) -> int:
        assert self.proc is not None
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self._kill()
            return self.proc.wait()

    def _cleanup_failed(self) -> None:
        """Kill and reap pg_dump, let in-flight parts finish, abort the upload."""
        self._kill()
        if self.proc is not None:
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.hooks.log("error", "pg_dump did not exit after SIGKILL within 30 s")
        if self.pool is not None:
            self.pool.shutdown(wait=True, cancel_futures=True)
        self.abort_upload()
        if self.proc is not None:
            terminate_dump_sessions(self.source, self.application_name, self.hooks)

    def abort_upload(self) -> None:
        abort_prepared(self.prepared, self.bucket, self.key, self.hooks)


def terminate_dump_sessions(
    source: BackupSource, application_name: str, hooks: BackupHooks
) -> None:
    """End the server session of a killed ``pg_dump`` (same login, so no extra privilege):
    its backend would otherwise keep waiting for a lock, holding the locks it already has,
    until its lock wait ran out. Best effort, bounded; a failure is logged."""
    try:
        with connect(
            Endpoint(source.host, source.port, source.sslmode),
            dbname=source.database,
            user=source.user,
            password=source.password,
            application_name="duckgres-reshard-backup",
            connect_timeout=5,
            statement_timeout=10,
        ) as conn:
            conn.execute(
                "SELECT pg_catalog.pg_terminate_backend(pid) FROM pg_catalog.pg_stat_activity "
                "WHERE application_name = %s AND usename = session_user "
                "AND pid <> pg_catalog.pg_backend_pid()",
                (application_name,),
            )
    except Exception as exc:  # noqa: BLE001 - reported; the session ends with its lock wait
        hooks.log(
            "warn",
            f"could not end the server session of the killed pg_dump ({application_name}): "
            f"{type(exc).__name__}: {exc}",
        )


def abort_prepared(prepared: Future[_Prepared], bucket: str, key: str, hooks: BackupHooks) -> None:
    """Abort the upload once it exists (waits for the helper); nothing if it never did."""
    try:
        upload = prepared.result(timeout=PREPARE_WAIT_SECONDS)
    except Exception:  # noqa: BLE001 - never created (its error is reported elsewhere)
        return
    last: Exception | None = None
    for attempt in range(ABORT_ATTEMPTS):
        try:
            upload.s3.abort_multipart_upload(bucket, key, upload.upload_id)
            return
        except S3Error as exc:
            last = exc
            time.sleep(0.5 * (attempt + 1))
    hooks.log(
        "error",
        f"could not abort multipart upload {upload.upload_id} of s3://{bucket}/{key}: {last} — "
        "abort it by hand (aws s3api abort-multipart-upload) or rely on the bucket's "
        "AbortIncompleteMultipartUpload lifecycle rule",
    )


def _delete_quietly(s3: S3, bucket: str, key: str, hooks: BackupHooks) -> None:
    try:
        s3.delete_object(bucket, key)
    except S3Error as exc:
        hooks.log("error", f"could not delete s3://{bucket}/{key}: {exc} — delete it by hand")


class _Logger(Protocol):
    def log(self, level: str, message: str) -> None: ...


def abort_stale_uploads(
    s3: S3, bucket: str, op_id: int, hooks: _Logger, *, skip_key: str = ""
) -> int:
    """Abort open uploads left by an earlier runner of this op (killed mid-backup), except
    those of ``skip_key`` (the running attempt's own key)."""
    prefix = f"{KEY_PREFIX}op-{op_id}-"
    aborted = 0
    for key, upload_id in s3.list_multipart_uploads(bucket, prefix):
        if key == skip_key:
            continue
        s3.abort_multipart_upload(bucket, key, upload_id)
        hooks.log(
            "info", f"aborted multipart upload left by an earlier attempt: s3://{bucket}/{key}"
        )
        aborted += 1
    return aborted


def run_backup(
    op_id: int,
    source: BackupSource,
    destination: BackupDestination,
    hooks: BackupHooks,
    *,
    mandatory: bool = False,
    restore_to: RestoreTarget | None = None,
    facts: SourceFacts | None = None,
    max_parts: int | None = None,
    part_size: int | None = None,
    pg_bin_dirs: str | None = None,
    s3: S3 | None = None,
    now: dt.datetime | None = None,
    lock_wait_seconds: float = DEFAULT_LOCK_WAIT_SECONDS,
) -> BackupResult:
    """Dump ``source`` into ``s3://<bucket>/_reshard_catalog_backups/op-<id>-<ts>.dump``.

    ``lock_wait_seconds`` bounds ``pg_dump``'s wait for each table lock (the runner passes what
    is left of its step's deadline).

    ``mandatory`` only changes the announcement (the caller applies the direction gate);
    ``restore_to`` is where the logged restore command creates and fills a new database
    (default: ``<source database>_restored_op<id>`` on the source server); ``facts`` skips the
    version/size read (the dry run has them); ``max_parts`` defaults to
    ``DUCKGRES_RESHARD_MAX_PARTS``; ``part_size`` overrides the computed size (tests and
    benchmarks only); ``s3`` an already-built client.
    """
    if not destination.bucket:
        raise BackupError("no data bucket is configured for this warehouse (data_bucket is empty)")
    limit = int(settings.DUCKGRES_RESHARD_MAX_PARTS if max_parts is None else max_parts)
    key = backup_key(op_id, now)
    uri = f"s3://{destination.bucket}/{key}"

    if s3 is None and destination.role_arn:
        # STS AssumeRole before pg_dump starts: credential problems fail fast
        s3 = _make_s3(destination, op_id)
    given = s3

    # One helper thread, in order: the client (with ambient credentials building it costs
    # ~0.1 s of CPU, overlapped with the version query and pg_dump's start), the multipart
    # upload, then the cleanup of uploads an earlier, killed attempt of this op left open.
    def prepare() -> _Prepared:
        client = given or _make_s3(destination, op_id)
        try:
            return _Prepared(client, client.create_multipart_upload(destination.bucket, key))
        except S3Error as exc:
            raise BackupError(f"upload backup to {uri}: {exc}") from exc

    stale_lines = _Lines()
    helper = ThreadPoolExecutor(max_workers=1, thread_name_prefix="backup-prepare")
    prepared = helper.submit(prepare)
    stale_done = helper.submit(_abort_stale, prepared, destination.bucket, op_id, key, stale_lines)
    handed_over: list[bool] = []
    try:
        return _run(op_id, source, destination, hooks, prepared, handed_over, key,
                    mandatory=mandatory, restore_to=restore_to, facts=facts, limit=limit,
                    part_size=part_size, pg_bin_dirs=pg_bin_dirs,
                    lock_wait_seconds=lock_wait_seconds)  # fmt: skip
    except BaseException:
        if not handed_over:  # failed before the upload loop owned the upload: abort it here
            abort_prepared(prepared, destination.bucket, key, hooks)
        raise
    finally:
        with contextlib.suppress(Exception):
            stale_done.result(timeout=STALE_WAIT_SECONDS)
        helper.shutdown(wait=False)
        for level, message in list(stale_lines.lines):
            hooks.log(level, message)


class _Lines:
    def __init__(self) -> None:
        self.lines: list[tuple[str, str]] = []

    def log(self, level: str, message: str) -> None:
        self.lines.append((level, message))


def _make_s3(destination: BackupDestination, op_id: int) -> S3:
    """The S3 client of the backup, assuming the destination's role for this operation."""
    try:
        return S3(
            region=destination.region,
            role_arn=destination.role_arn,
            session_name=session_name_for_op(op_id),
        )
    except S3Error as exc:
        raise BackupError(f"S3 credentials for the backup: {exc}") from exc


def _abort_stale(
    prepared: Future[_Prepared], bucket: str, op_id: int, key: str, stale_lines: _Lines
) -> None:
    """Abort the uploads an earlier, killed attempt of this op left open (best effort)."""
    try:
        client = prepared.result().s3
    except BackupError:
        return
    try:
        abort_stale_uploads(client, bucket, op_id, stale_lines, skip_key=key)
    except S3Error as exc:
        # Best effort: s3:ListBucketMultipartUploads is not a required permission, and the
        # bucket's AbortIncompleteMultipartUpload rule is the backstop (docs/backup.md).
        stale_lines.log(
            "warn", f"could not clean up earlier backup uploads of this operation: {exc}"
        )


def _run(
    op_id: int,
    source: BackupSource,
    destination: BackupDestination,
    hooks: BackupHooks,
    prepared: Future[_Prepared],
    handed_over: list[bool],
    key: str,
    *,
    mandatory: bool,
    restore_to: RestoreTarget | None,
    facts: SourceFacts | None,
    limit: int,
    part_size: int | None,
    pg_bin_dirs: str | None,
    lock_wait_seconds: float,
) -> BackupResult:
    """Dump the source into the prepared multipart upload, complete and verify it."""
    facts = facts or read_source_facts(source)
    client, app, argv = _pg_dump_command(
        op_id, source, hooks, facts, pg_bin_dirs, lock_wait_seconds
    )
    if part_size is None:
        part_size = part_size_for(facts.db_size, limit)
        if facts.db_size is None:
            hooks.log(
                "warn",
                f"catalog size unreadable: using {format_mib(part_size)} MiB backup parts",
            )
    uri = f"s3://{destination.bucket}/{key}"
    hooks.log(
        "info",
        f"backing up the catalog {source.redacted()} to {uri} with pg_dump {client.version} "
        f"({format_mib(part_size)} MiB parts, at most {limit}); may take several minutes — "
        "size unknown until complete" + (ANNOUNCE_SUFFIX_MANDATORY if mandatory else ""),
    )

    backup = _Backup(
        prepared=prepared,
        bucket=destination.bucket,
        key=key,
        part_size=part_size,
        max_parts=limit,
        hooks=hooks,
        source=source,
        application_name=app,
    )
    handed_over.append(True)  # from here on the upload loop aborts the upload on failure
    parts = backup.run(argv, pg_dump_env(source))
    produced = backup.total
    upload = prepared.result()  # done: run() waited for it
    s3 = upload.s3

    head = _complete_and_verify(
        backup, upload, parts, destination.bucket, key, uri, produced, hooks
    )
    sha256 = backup.digest.hexdigest()
    command, prerequisites = _restore_instructions(
        op_id,
        Recorded(destination.bucket, key, sha256, head.version_id),
        source,
        restore_to,
        client,
        s3,
        facts,
    )
    return BackupResult(
        uri=uri,
        bytes=produced,
        key=key,
        part_size=part_size,
        parts=len(parts),
        restore_command=command,
        peak_buffered_bytes=backup.peak_buffered,
        pg_dump_version=client.version,
        restore_prerequisites=prerequisites,
        sha256=sha256,
        etag=head.etag,
        version_id=head.version_id,
    )


def _pg_dump_command(
    op_id: int,
    source: BackupSource,
    hooks: BackupHooks,
    facts: SourceFacts,
    pg_bin_dirs: str | None,
    lock_wait_seconds: float,
) -> tuple[PgClient, str, list[str]]:
    """The pg_dump client (one that can refuse a cleartext password request: pgclients), its
    application_name and argv."""
    try:
        client = choose_client(
            facts.server_major,
            pg_bin_dirs,
            require_auth=needs_require_auth(source.host, source.port),
        )
    except NoPgClient as exc:
        raise BackupError(str(exc)) from exc
    app = pg_dump_application_name(op_id)
    try:
        argv = pg_dump_argv(
            client, source, lock_wait_seconds=lock_wait_seconds, application_name=app
        )
    except Exception as exc:  # an sslmode refused by the policy, an unparsable value
        raise BackupError(f"cannot build the pg_dump connection: {exc}") from exc
    return client, app, argv


def _complete_and_verify(
    backup: _Backup,
    upload: _Prepared,
    parts: list[Uploaded],
    bucket: str,
    key: str,
    uri: str,
    produced: int,
    hooks: BackupHooks,
) -> ObjectHead:
    """Complete the multipart upload and check its stored size; on failure nothing is left.
    Returns what the store reports of the new object (its ETag and VersionId are recorded)."""
    s3 = upload.s3
    try:
        version_id = s3.complete_multipart_upload(bucket, key, upload.upload_id, parts)
    except S3Error as exc:
        backup.abort_upload()
        _delete_quietly(s3, bucket, key, hooks)  # in case it completed after all
        raise BackupError(f"upload backup to {uri}: {exc}") from exc
    try:
        head = s3.head(bucket, key, version_id=version_id)
    except S3Error as exc:
        _delete_quietly(s3, bucket, key, hooks)
        raise BackupError(f"verify uploaded backup {uri}: {exc}") from exc
    if head is None or head.size != produced:
        _delete_quietly(s3, bucket, key, hooks)
        shown = "missing" if head is None else str(head.size)
        raise BackupError(
            f"uploaded backup size {shown} does not match the {produced} bytes pg_dump produced"
        )
    return ObjectHead(head.size, head.etag, head.version_id or version_id)


def _restore_instructions(
    op_id: int,
    recorded: Recorded,
    source: BackupSource,
    restore_to: RestoreTarget | None,
    client: PgClient,
    s3: S3,
    facts: SourceFacts,
) -> tuple[str, str]:
    """The restore command for the op log and its prerequisites."""
    target = restore_to or RestoreTarget(
        source.host, source.port, restored_database_name(source.database, op_id), source.sslmode
    )
    command = restore_command(
        recorded, target, client.major, s3.endpoint_url or "",
        region=s3.region or "", server_major=facts.server_major,
    )  # fmt: skip
    prerequisites = restore_prerequisites(target, client.major, server_major=facts.server_major)
    return command, prerequisites
