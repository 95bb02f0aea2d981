"""Stream a backup object from S3 into stock ``pg_restore`` (docs/backup.md "Restore tests",
docs/restore.md).

Invariants:

- **Bounded memory, no local copy.** The object is read from S3 one chunk at a time (1 MiB) and
  each chunk is written to ``pg_restore``'s stdin before the next is read: nothing is written to
  disk and at most one chunk is held, whatever the object's size. ``pg_restore`` reads a
  custom-format archive from a pipe sequentially.
- **The password only in the child's environment.** ``pg_restore`` gets ``PATH``, the locale
  and ``PGPASSWORD`` (``reshard.engines.clients.pg_dump_env``); every connection parameter is one
  quoted conninfo value (``--dbname``), the host pinned to the address that was checked.
- **A deadline and a stop, whatever the child does.** A watchdog thread kills ``pg_restore``
  at the deadline or when ``should_stop`` turns true, independent of the feeding loop (a write
  into a full pipe blocks while a statement runs; the archive's own preamble sets
  ``statement_timeout`` and ``lock_timeout`` to 0, so no server-side timeout can be relied on).
  A killed child is reported as such, never as the archive's fault.
- **The right client.** An archive is readable only by a ``pg_restore`` at least as new as the
  ``pg_dump`` that wrote it: the client's major is the larger of the target server's and the
  one the archive's header names (:func:`archive_dump_major`). A client newer than 17 talking to
  an older server sends one ``SET transaction_timeout`` the server refuses; without
  ``--exit-on-error`` that one refusal is tolerated (exit 1 with exactly that error), any other
  is a failure.
- **Hostile output stays bounded.** What ``pg_restore`` prints is the archive's text as much as
  ours: only its last :data:`STDERR_TAIL_BYTES` are kept, decoded with replacement, with
  control characters removed, and scrubbed of every secret this process knows (the login's
  password among them). The archive header is parsed with bounds on every field.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import re
import secrets
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.lib.s3 import S3, S3Error
from duckgres_admin.models import Installation, ReshardOperation
from reshard.engines.clients import (
    BackupSource,
    NoPgClient,
    PgClient,
    StderrTail,
    choose_client,
    knows_require_auth,
    needs_require_auth,
    pg_dump_env,
    source_conninfo,
)
from reshard.engines.restore.command import skips_transaction_timeout

CHUNK_BYTES = 1024 * 1024
STDERR_TAIL_BYTES = 8192
KILL_WAIT_SECONDS = 10
WATCH_INTERVAL_SECONDS = 0.25
APPLICATION_NAME = "duckgres-restore"
_TRANSACTION_TIMEOUT_REFUSAL = 'unrecognized configuration parameter "transaction_timeout"'


LOGIN_ROLE_PREFIX = "duckgres_restore_"
_log = logging.getLogger("duckgres.reshard.restore")


def installation() -> Installation:
    """This installation's row (``duckgres_admin.models.installation``), written by migration
    0021. Should it be missing (deleted by hand, or a test database flushed), a new random tag is
    drawn and recorded — logged, since names made under the old one are no longer recognised."""
    row = Installation.objects.filter(pk=1).first()
    if row is None:
        row, created = Installation.objects.get_or_create(
            pk=1, defaults={"tag": secrets.token_hex(6)}
        )
        if created:
            _log.warning("installation row was missing: drew the new installation tag %s", row.tag)
    return row


def installation_tag() -> str:
    """The random tag naming this installation on shared stores: the names a restore or a
    restore test creates carry it, so installations sharing a store — or test processes sharing
    one server — never take, or sweep, each other's, whatever their config stores' addresses."""
    return installation().tag


def installation_tags() -> tuple[str, ...]:
    """The current tag, then the address-derived one an upgraded installation used before
    (names made with it may still be on a store)."""
    row = installation()
    return (row.tag, row.previous_tag) if row.previous_tag else (row.tag,)


def login_role_name(op: ReshardOperation) -> str:
    """The login role an in-place restore writes through (docs/restore.md "Onto the current
    store"): ``duckgres_restore_<installation>_op<id>``, with the tag the operation was created
    under (an operation created before migration 0021 keeps its address-derived tag)."""
    row = installation()
    tag = row.tag
    if row.previous_tag and op.created_at is not None and op.created_at < row.created_at:
        tag = row.previous_tag
    return f"{LOGIN_ROLE_PREFIX}{tag}_op{op.id}"


class RestoreError(RuntimeError):
    """The restore did not complete; the message is fit for a record and a log line.

    ``archive_fault``: ``pg_restore`` ran to its end and refused the archive (a corrupt or
    truncated object, or its content failing on the server); False for the deadline, a stop,
    S3 or a missing client — problems of the attempt, not of the backup."""

    def __init__(self, message: str, *, archive_fault: bool = False) -> None:
        super().__init__(message)
        self.archive_fault = archive_fault


@dataclass(frozen=True)
class Restored:
    object_bytes: int
    seconds: float
    client_major: int


def archive_dump_major(head: bytes) -> int | None:
    """The major version of the ``pg_dump`` that wrote a custom-format archive, read from its
    header (magic, version, sizes, compression, creation time, then three strings: database,
    server version, pg_dump version); None when the bytes are not such a header."""
    try:
        if not head.startswith(b"PGDMP") or len(head) < 11:
            return None
        vmaj, vmin, int_size = head[5], head[6], head[8]
        if not 1 <= int_size <= 8:
            return None
        pos = 11

        def read_int() -> int:
            nonlocal pos
            if pos + 1 + int_size > len(head):
                raise IndexError
            sign, value = head[pos], int.from_bytes(head[pos + 1 : pos + 1 + int_size], "little")
            pos += 1 + int_size
            return -value if sign else value

        def read_str() -> str | None:
            nonlocal pos
            length = read_int()
            if length < 0:
                return None
            if length > 256 or pos + length > len(head):
                raise IndexError
            text = head[pos : pos + length].decode("utf-8", "replace")
            pos += length
            return text

        if (vmaj, vmin) >= (1, 15):
            pos += 1  # the compression algorithm (one byte)
        else:
            read_int()  # the compression level
        for _ in range(7):  # the creation time
            read_int()
        read_str()  # database name
        read_str()  # server version
        dumped = read_str() or ""
    except IndexError:
        return None
    match = re.match(r"(\d+)", dumped)
    return int(match.group(1)) if match else None


def restore_client(
    server_major: int, head: bytes, bin_dirs: str | None = None, *, require_auth: bool = False
) -> PgClient:
    """The ``pg_restore`` for this archive and server (module doc); ``NoPgClient`` if none.
    ``require_auth``: the target is exempt from channel binding (``pgclients``)."""
    major = max(server_major, archive_dump_major(head) or 0)
    return choose_client(major, bin_dirs, require_auth=require_auth)


def pg_restore_argv(client: PgClient, target: BackupSource, *, server_major: int) -> list[str]:
    """Stock ``pg_restore`` of a custom-format archive read from stdin into ``target``."""
    conninfo = source_conninfo(
        target, require_auth=knows_require_auth(client), application_name=APPLICATION_NAME
    )
    argv = [client.pg_restore, "--no-owner", "--no-acl", "--clean", "--if-exists"]
    if target.role:
        argv.append(f"--role={target.role}")
    if not skips_transaction_timeout(client.major, server_major):
        argv.append("--exit-on-error")
    return [*argv, "--format=custom", f"--dbname={conninfo}"]


def clean_output(raw: bytes, *secrets: str) -> str:
    """The bounded, printable, scrubbed text of what a child printed."""
    text = raw[-STDERR_TAIL_BYTES:].decode("utf-8", errors="replace")
    text = "".join(ch if ch.isprintable() or ch == "\n" else " " for ch in text)
    joined = " | ".join(line.strip() for line in text.splitlines() if line.strip())
    return process_scrubber(*secrets).scrub(joined)


class _Watchdog:
    """Kills the child at the deadline or on a stop, whatever the feeding loop is doing."""

    def __init__(
        self, proc: subprocess.Popen[bytes], deadline: float, should_stop: Callable[[], bool]
    ) -> None:
        self.proc, self.deadline, self.should_stop = proc, deadline, should_stop
        self.reason = ""
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="pg-restore-watch", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._done.wait(WATCH_INTERVAL_SECONDS):
            if self.proc.poll() is not None:
                return
            if time.monotonic() > self.deadline:
                self.reason = "the restore ran past its deadline"
            elif self.should_stop():
                self.reason = "the restore was stopped"
            if self.reason:
                with contextlib.suppress(OSError):
                    self.proc.kill()
                return

    def stop(self) -> None:
        self._done.set()
        self._thread.join(timeout=KILL_WAIT_SECONDS)


def _feed(
    proc: subprocess.Popen[bytes],
    chunks: Iterator[bytes],
    after_chunk: Callable[[int], None] | None,
) -> None:
    assert proc.stdin is not None
    written = 0
    try:
        for chunk in chunks:
            try:
                proc.stdin.write(chunk)
            except (BrokenPipeError, ValueError):
                return  # pg_restore stopped reading (or was killed): its exit says why
            written += len(chunk)
            if after_chunk is not None:
                after_chunk(written)
    finally:
        with contextlib.suppress(BrokenPipeError, ValueError):
            proc.stdin.close()


def _tolerated(code: int, output: str, client: PgClient, server_major: int) -> bool:
    """Exit 1 with exactly the one refused ``SET transaction_timeout`` (module doc)."""
    return (
        code == 1
        and skips_transaction_timeout(client.major, server_major)
        and _TRANSACTION_TIMEOUT_REFUSAL in output
        and "errors ignored on restore: 1" in output
    )


@dataclass(frozen=True)
class Expected:
    """The identity a backup's operation recorded when it wrote the object (docs/backup.md
    "Authenticated backups"): what a reader requires of the bytes it streams."""

    sha256: str
    size: int
    version_id: str = ""


class _Verified:
    """The object's chunks, hashed as they pass, with the last one held back until the digest
    and the size are checked: on a mismatch ``pg_restore`` never gets the end of the archive
    (so its post-data section never runs) and the restore fails naming both digests."""

    def __init__(self, uri: str, chunks: Iterator[bytes], expected: Expected) -> None:
        self.uri, self._chunks, self.expected = uri, chunks, expected
        self._digest = hashlib.sha256()
        self.size = 0

    def __iter__(self) -> Iterator[bytes]:
        held: bytes | None = None
        for chunk in self._chunks:
            self._digest.update(chunk)
            self.size += len(chunk)
            if held is not None:
                yield held
            held = chunk
        got = self._digest.hexdigest()
        if got != self.expected.sha256 or self.size != self.expected.size:
            raise RestoreError(
                f"backup {self.uri} does not match what its operation recorded: read sha256 "
                f"{got} ({self.size} bytes), recorded sha256 {self.expected.sha256} "
                f"({self.expected.size} bytes); nothing restored from it is trusted",
                archive_fault=True,
            )
        if held is not None:
            yield held


def stream_restore(
    s3: S3,
    bucket: str,
    key: str,
    target: BackupSource,
    *,
    server_major: int,
    timeout_seconds: float,
    should_stop: Callable[[], bool] = lambda: False,
    chunk_bytes: int = CHUNK_BYTES,
    if_match: str = "",
    expected: Expected | None = None,
    register: Callable[[subprocess.Popen[bytes]], None] | None = None,
    unregister: Callable[[subprocess.Popen[bytes]], None] | None = None,
    after_chunk: Callable[[int], None] | None = None,
    bin_dirs: str | None = None,
) -> Restored:
    """Restore ``s3://bucket/key`` into the existing database ``target.database`` (objects of
    the archive that exist are dropped first: ``--clean --if-exists``, so a retry after a
    partial restore starts over). ``target.role``: ``--role`` after connecting. ``if_match``:
    the object must still have this ETag. ``expected``: the recorded identity — that version is
    read, a size that differs is refused before a byte reaches ``pg_restore``, and the digest
    is checked while streaming (:class:`_Verified`). ``register``/``unregister`` hand the child
    to a caller that kills it on stop; ``after_chunk`` sees the bytes written so far."""
    started = time.monotonic()
    uri = f"s3://{bucket}/{key}"
    version = expected.version_id if expected is not None else ""
    try:
        stream = s3.stream_object(bucket, key, chunk_bytes, if_match=if_match, version_id=version)
    except S3Error as exc:
        raise RestoreError(f"could not read the backup: {exc}") from None
    with contextlib.closing(stream):
        chunks: Iterator[bytes] = iter(stream)
        if expected is not None:
            if stream.size != expected.size:
                raise RestoreError(
                    f"backup {uri} does not match what its operation recorded: its size is "
                    f"{stream.size} bytes, recorded {expected.size} (sha256 "
                    f"{expected.sha256}); nothing of it was restored",
                    archive_fault=True,
                )
            chunks = iter(_Verified(uri, chunks, expected))
        try:
            head = next(chunks, b"")
            client = restore_client(
                server_major,
                head,
                bin_dirs,
                require_auth=needs_require_auth(target.host, target.port),
            )
        except S3Error as exc:
            raise RestoreError(f"could not read the backup: {exc}") from None
        except NoPgClient as exc:
            raise RestoreError(str(exc)) from None
        code, output = _run_child(
            client, target, server_major, _prepend(head, chunks),
            deadline=started + timeout_seconds, should_stop=should_stop,
            register=register, unregister=unregister, after_chunk=after_chunk,
        )  # fmt: skip
    if code != 0 and not _tolerated(code, output, client, server_major):
        raise RestoreError(
            f"pg_restore exited with status {code}: {output or 'no output'}", archive_fault=True
        )
    return Restored(stream.size, time.monotonic() - started, client.major)


def _prepend(head: bytes, rest: Iterator[bytes]) -> Iterator[bytes]:
    if head:
        yield head
    yield from rest


def _run_child(
    client: PgClient,
    target: BackupSource,
    server_major: int,
    chunks: Iterator[bytes],
    *,
    deadline: float,
    should_stop: Callable[[], bool],
    register: Callable[[subprocess.Popen[bytes]], None] | None,
    unregister: Callable[[subprocess.Popen[bytes]], None] | None,
    after_chunk: Callable[[int], None] | None,
) -> tuple[int, str]:
    """Run ``pg_restore`` on ``chunks`` under the watchdog; its exit code and cleaned output."""
    try:
        proc = subprocess.Popen(
            pg_restore_argv(client, target, server_major=server_major),
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=pg_dump_env(target),
            close_fds=True,
            start_new_session=True,
        )
    except OSError as exc:
        raise RestoreError(f"cannot start {client.pg_restore}: {exc}") from None
    tail = StderrTail(proc.stderr, STDERR_TAIL_BYTES, name="pg_restore")
    watchdog = _Watchdog(proc, deadline, should_stop)
    try:
        if register is not None:
            register(proc)
        _feed(proc, chunks, after_chunk)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()) + KILL_WAIT_SECONDS)
    except S3Error as exc:
        raise RestoreError(f"reading the backup failed after it started: {exc}") from None
    except subprocess.TimeoutExpired:
        raise RestoreError("pg_restore ran past the restore's deadline") from None
    finally:
        watchdog.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=KILL_WAIT_SECONDS)
        if unregister is not None:
            unregister(proc)
    if watchdog.reason:
        raise RestoreError(watchdog.reason)
    return code, clean_output(tail.raw(KILL_WAIT_SECONDS), target.password)
