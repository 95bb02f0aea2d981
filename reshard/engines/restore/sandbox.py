"""The restore test's sandbox: one tenant archive streamed into ``pg_restore`` by a process that
holds nothing else (issue 25 item 5; safeguard reshard-139; docs/backup.md "Restore tests").

With the pod launcher the restore test does not run ``pg_restore`` of a tenant-written archive
inside the default worker (launcher ServiceAccount, every secret of the control plane). The
worker prepares everything (the scratch database and its rightless login, the size guard) and
hands only the stream to ``manage.py restore_stream`` in a pod of the runner namespace
(``reshard.launchers.sandbox_pod``). This module is both ends of that hand-over.

Invariants:

- **The sandbox holds one object's worth of authority.** Its environment is the job (plain
  JSON: where the object is, its recorded identity, the scratch target; no secret), the scratch
  login's password and an S3 session that may read that one object
  (``s3scope.for_object``). No config store, no shared secret, no signing key, no broker, no
  API token (settings ``IS_SANDBOX``).
- **It decides nothing about the backup it cannot see.** It reports one of three outcomes by
  its exit code — :data:`EXIT_RESTORED`, :data:`EXIT_ARCHIVE` (``pg_restore`` refused the archive
  or the bytes do not match the record: the backup's fault) or :data:`EXIT_ATTEMPT` (S3, the
  client, the deadline: not the backup's) — and a bounded, scrubbed message. Reading the
  restored state and recording the result stay with the worker, which trusts only the exit code
  for the outcome; any other code, or none, is an attempt that failed.
- **The stop stays with the worker.** The size guard and the deadline are the worker's: it ends
  the scratch role's sessions and deletes the pod (``stream_restore``'s own watchdog still
  bounds the child inside the sandbox by the job's timeout).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import asdict, dataclass, fields

JOB_VAR = "DUCKGRES_RESTORE_JOB"
PASSWORD_VAR = "DUCKGRES_RESTORE_PASSWORD"  # the scratch login's (secret-bearing)
EXIT_RESTORED = 0
EXIT_ARCHIVE = 3
EXIT_ATTEMPT = 4
MESSAGE_LIMIT = 2000
# The non-secret settings a sandbox process reads (S3, the PostgreSQL clients, the store CA).
PASSED_SETTINGS: tuple[str, ...] = (
    "DJANGO_SETTINGS_MODULE",
    "DUCKGRES_AWS_REGION",
    "DUCKGRES_S3_ENDPOINT_URL",
    "DUCKGRES_S3_ADDRESSING_STYLE",
    "DUCKGRES_LOG_LEVEL",
    "DUCKGRES_PG_BIN_DIRS",
    "DUCKGRES_STORE_SSLROOTCERT",
    "DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT",
)


_TYPES: dict[str, type | tuple[type, ...]] = {"int": int, "float": (int, float), "str": str}


class JobError(ValueError):
    """The job variable is missing or malformed (names the field, never a value)."""


@dataclass(frozen=True)
class Job:
    """What the sandbox restores, and where; every field plain, none secret."""

    bucket: str
    key: str
    etag: str
    sha256: str
    size: int
    version_id: str
    host: str
    port: int
    database: str
    user: str
    sslmode: str
    server_major: int
    timeout_seconds: float

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"), sort_keys=True)

    @classmethod
    def from_json(cls, raw: str) -> Job:
        try:
            data = json.loads(raw)
        except ValueError:
            raise JobError(f"{JOB_VAR} is not JSON") from None
        if not isinstance(data, dict):
            raise JobError(f"{JOB_VAR} is not a JSON object")
        values: dict[str, object] = {}
        for f in fields(cls):
            value = data.get(f.name)
            want = _TYPES[str(f.type)]
            if isinstance(value, bool) or not isinstance(value, want):
                raise JobError(f"{JOB_VAR}: field {f.name!r} is missing or not a {f.type}")
            values[f.name] = float(value) if isinstance(value, int) and f.type == "float" else value
        return cls(**values)  # type: ignore[arg-type]


def run(environ: Mapping[str, str]) -> tuple[int, str]:
    """The sandbox's work: ``(exit code, message)``. Never raises."""
    from duckgres_admin.base.scrub import process_scrubber
    from duckgres_admin.lib.s3 import S3, S3Error
    from reshard.engines.clients import BackupSource
    from reshard.engines.restore.stream import Expected, RestoreError, stream_restore

    password = environ.get(PASSWORD_VAR, "")
    scrub = process_scrubber(password).scrub
    try:
        job = Job.from_json(environ.get(JOB_VAR, ""))
        if not password:
            raise JobError(f"{PASSWORD_VAR} is not set")
        target = BackupSource(job.host, job.port, job.database, job.user, job.sslmode, password)
        restored = stream_restore(
            S3(),
            job.bucket,
            job.key,
            target,
            server_major=job.server_major,
            timeout_seconds=job.timeout_seconds,
            if_match=job.etag,
            expected=Expected(job.sha256, job.size, job.version_id),
        )
    except RestoreError as exc:
        code = EXIT_ARCHIVE if exc.archive_fault else EXIT_ATTEMPT
        return code, scrub(str(exc))[:MESSAGE_LIMIT]
    except (JobError, S3Error, OSError) as exc:
        return EXIT_ATTEMPT, scrub(str(exc))[:MESSAGE_LIMIT]
    return EXIT_RESTORED, (
        f"restored {restored.object_bytes} bytes in {restored.seconds:.1f} s "
        f"(pg_restore {restored.client_major})"
    )
