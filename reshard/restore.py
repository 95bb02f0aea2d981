"""Stream a backup object from S3 into stock ``pg_restore`` (docs/backup.md "Restore tests").

Invariants:

- **Bounded memory, no local copy.** The object is read from S3 one chunk at a time
  (``DUCKGRES_RESTORE_CHUNK_BYTES``, 1 MiB) and each chunk is written to ``pg_restore``'s stdin
  before the next is read: nothing is written to disk and at most one chunk is held, whatever
  the object's size. ``pg_restore`` reads a custom-format archive from a pipe sequentially.
- **The password only in the child's environment.** ``pg_restore`` gets ``PATH``, the locale
  and ``PGPASSWORD`` (``reshard.backup.pg_dump_env``); every connection parameter is one quoted
  conninfo value (``--dbname``), the host pinned to the address that was checked.
- **A deadline and a stop.** The stream checks its deadline and ``should_stop`` between chunks;
  either kills ``pg_restore`` and raises :class:`RestoreError`. ``pg_restore`` stopping early
  (``--exit-on-error``) ends the stream at the next write.
- **Hostile output stays bounded.** What ``pg_restore`` prints is the archive's text as much as
  ours: only its last :data:`STDERR_TAIL_BYTES` are kept, decoded with replacement, with
  control characters removed, and scrubbed of every secret this process knows (the scratch
  login's password among them).
"""

from __future__ import annotations

import contextlib
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import IO

from duckgres_admin.base.scrub import process_scrubber
from duckgres_admin.lib.s3 import S3, S3Error
from reshard.backup import BackupSource, pg_dump_env, skips_transaction_timeout, source_conninfo
from reshard.pgclients import PgClient, knows_require_auth

CHUNK_BYTES = 1024 * 1024
STDERR_TAIL_BYTES = 8192
KILL_WAIT_SECONDS = 10


class RestoreError(RuntimeError):
    """The restore did not complete; the message is fit for a record and a log line."""


@dataclass(frozen=True)
class Restored:
    object_bytes: int
    seconds: float


def pg_restore_argv(client: PgClient, target: BackupSource, *, server_major: int) -> list[str]:
    """Stock ``pg_restore`` of a custom-format archive read from stdin into ``target``."""
    conninfo = source_conninfo(
        target, require_auth=knows_require_auth(client), application_name="duckgres-restore"
    )
    argv = [client.pg_restore, "--no-owner", "--no-acl", "--clean", "--if-exists"]
    if not skips_transaction_timeout(client.major, server_major):
        argv.append("--exit-on-error")
    return [*argv, "--format=custom", f"--dbname={conninfo}"]


def _tail_reader(stream: IO[bytes] | None, tail: deque[bytes]) -> threading.Thread:
    def read() -> None:
        assert stream is not None
        while True:
            block = stream.read(4096)
            if not block:
                return
            tail.append(block)
            while sum(len(b) for b in tail) > STDERR_TAIL_BYTES and len(tail) > 1:
                tail.popleft()

    thread = threading.Thread(target=read, name="pg-restore-stderr", daemon=True)
    thread.start()
    return thread


def clean_output(raw: bytes, *secrets: str) -> str:
    """The bounded, printable, scrubbed text of what a child printed."""
    text = raw[-STDERR_TAIL_BYTES:].decode("utf-8", errors="replace")
    text = "".join(ch if ch.isprintable() or ch == "\n" else " " for ch in text)
    joined = " | ".join(line.strip() for line in text.splitlines() if line.strip())
    return process_scrubber(*secrets).scrub(joined)


def _feed(
    proc: subprocess.Popen[bytes],
    chunks: Iterator[bytes],
    deadline: float,
    should_stop: Callable[[], bool],
    after_chunk: Callable[[int], None] | None = None,
) -> None:
    assert proc.stdin is not None
    written = 0
    try:
        for chunk in chunks:
            if time.monotonic() > deadline:
                raise RestoreError("the restore ran past its deadline")
            if should_stop():
                raise RestoreError("the restore was stopped")
            try:
                proc.stdin.write(chunk)
            except BrokenPipeError:
                return  # pg_restore stopped reading: its exit status says why
            written += len(chunk)
            if after_chunk is not None:
                after_chunk(written)
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.close()


def stream_restore(
    s3: S3,
    bucket: str,
    key: str,
    client: PgClient,
    target: BackupSource,
    *,
    server_major: int,
    timeout_seconds: float,
    should_stop: Callable[[], bool] = lambda: False,
    chunk_bytes: int = CHUNK_BYTES,
    lock_timeout_seconds: float = 60.0,
    register: Callable[[subprocess.Popen[bytes]], None] | None = None,
    unregister: Callable[[subprocess.Popen[bytes]], None] | None = None,
    after_chunk: Callable[[int], None] | None = None,
) -> Restored:
    """Restore ``s3://bucket/key`` into the existing database ``target.database`` (objects of
    the archive that exist are dropped first: ``--clean --if-exists``, so a retry after a
    partial restore starts over). ``register``/``unregister`` hand the child to a caller that
    kills it on stop; ``after_chunk`` sees the bytes written so far."""
    started = time.monotonic()
    deadline = started + timeout_seconds
    try:
        size, chunks = s3.stream_object(bucket, key, chunk_bytes)
    except S3Error as exc:
        raise RestoreError(f"could not read the backup: {exc}") from None
    env = pg_dump_env(target)
    # Every statement pg_restore sends waits for a lock at most this long.
    env["PGOPTIONS"] = f"-c lock_timeout={max(1, int(lock_timeout_seconds * 1000))}"
    proc = subprocess.Popen(
        pg_restore_argv(client, target, server_major=server_major),
        stdin=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env=env,
        close_fds=True,
    )
    if register is not None:
        register(proc)
    tail: deque[bytes] = deque()
    reader = _tail_reader(proc.stderr, tail)
    try:
        _feed(proc, chunks, deadline, should_stop, after_chunk)
        code = proc.wait(timeout=max(1.0, deadline - time.monotonic()))
    except S3Error as exc:
        raise RestoreError(f"reading the backup failed after it started: {exc}") from None
    except subprocess.TimeoutExpired:
        raise RestoreError("pg_restore ran past the restore's deadline") from None
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=KILL_WAIT_SECONDS)
        reader.join(timeout=KILL_WAIT_SECONDS)
        if unregister is not None:
            unregister(proc)
    if code != 0:
        said = clean_output(b"".join(tail), target.password) or "no output"
        raise RestoreError(f"pg_restore exited with status {code}: {said}")
    return Restored(size, time.monotonic() - started)
