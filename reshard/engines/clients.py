"""The PostgreSQL client programs the engines run (spec reshard §6): which ``pg_dump``/
``pg_restore`` serves a server, the server it connects to (``BackupSource``: the backup's source,
the restore's target), its one conninfo string and its environment, and the tail of its stderr.

``DUCKGRES_PG_BIN_DIRS`` is a colon-separated list of directories (globs allowed, default
``/usr/lib/postgresql/*/bin``), each holding the clients of one PostgreSQL major. The client
used for a server of major ``S`` is the one whose major equals ``S``, else the newest whose
major is ≥ ``S`` (``pg_dump`` refuses servers newer than itself; see docs/backup.md). No such
client → :class:`NoPgClient` "no pg_dump for PostgreSQL <S> (have: <majors>)".

Each directory's version is read by running ``<dir>/pg_dump --version`` once per process.
:func:`knows_require_auth` tells, once per client and only when asked, whether its libpq knows
``require_auth`` (libpq 16+; the client of a major may run on another major's libpq): the
``pg_dump`` binary is asked to parse a conninfo naming that keyword with a Unix socket directory
that does not exist (nothing is contacted). A client whose libpq does not know it cannot refuse
a server that asks for a cleartext password by itself (docs/backup.md); a client that is not an
ELF binary (a wrapper script) is never run for this and counts as not knowing it.

**Refusing cleartext** (safeguard reshard-123): every conninfo carries ``channel_binding=require``
(libpq 13+; clients of majors older than 13 are ignored), which already makes libpq 15 refuse a
cleartext, MD5 or no-password request. Where channel binding cannot be required (an endpoint in
``DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT``) the caller passes ``require_auth=True`` and only
clients whose libpq knows ``require_auth`` are candidates; none → :class:`NoPgClient` naming what
to install, never a client that would send the password to an impostor.
"""

from __future__ import annotations

import glob
import os
import re
import subprocess
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from django.conf import settings
from psycopg.conninfo import make_conninfo

from duckgres_admin.lib import pgadmin
from duckgres_admin.lib.pgadmin import (
    Endpoint,
    check_secret_endpoint,
    pinned_host,
    socket_params,
    tls_params,
)

_VERSION = re.compile(r"\(PostgreSQL\)\s+(\d+)(?:\.(\d+))?")
_cache: dict[str, PgClient | None] = {}
_cache_lock = threading.Lock()


class NoPgClient(RuntimeError):
    """No configured client can dump a server of this major."""


@dataclass(frozen=True)
class PgClient:
    major: int
    version: str  # e.g. "15.20"
    bin_dir: str
    pg_dump: str  # absolute paths
    pg_restore: str


def server_major(server_version_num: int) -> int:
    """``server_version_num`` (e.g. 150020, 180006, 90624) → major (15, 18, 9)."""
    return server_version_num // 10000


def parse_version(text: str) -> tuple[int, str] | None:
    """``pg_dump (PostgreSQL) 15.20 (Debian …)`` → ``(15, "15.20")``."""
    match = _VERSION.search(text)
    if not match:
        return None
    major = int(match[1])
    minor = match[2]
    return major, f"{major}.{minor}" if minor is not None else str(major)


def _expand(bin_dirs: str) -> list[str]:
    dirs: list[str] = []
    for entry in bin_dirs.split(":"):
        entry = entry.strip()
        if not entry:
            continue
        matches = sorted(glob.glob(entry)) if glob.has_magic(entry) else [entry]
        for path in matches:
            real = os.path.realpath(path)
            if os.path.isdir(real) and real not in dirs:
                dirs.append(real)
    return dirs


def _probe_dir(bin_dir: str) -> PgClient | None:
    with _cache_lock:
        if bin_dir in _cache:
            return _cache[bin_dir]
    pg_dump = os.path.join(bin_dir, "pg_dump")
    client: PgClient | None = None
    if os.access(pg_dump, os.X_OK):
        try:
            out = subprocess.run(
                [pg_dump, "--version"],
                capture_output=True,
                text=True,
                timeout=10,
                stdin=subprocess.DEVNULL,
                check=False,
            )
            parsed = parse_version(out.stdout) if out.returncode == 0 else None
        except (OSError, subprocess.SubprocessError):
            parsed = None
        if parsed is not None:
            client = PgClient(
                major=parsed[0],
                version=parsed[1],
                bin_dir=bin_dir,
                pg_dump=pg_dump,
                pg_restore=os.path.join(bin_dir, "pg_restore"),
            )
    with _cache_lock:
        _cache[bin_dir] = client
    return client


_PROBE_CONNINFO = "require_auth=scram-sha-256 host=/nonexistent-duckgres-probe port=1"
_require_auth: dict[str, bool] = {}


def knows_require_auth(client: PgClient) -> bool:
    """Does this client's libpq accept ``require_auth`` (and ``sslrootcert=system``)? An
    unknown keyword is reported as ``invalid connection option`` before any connection."""
    with _cache_lock:
        if client.pg_dump in _require_auth:
            return _require_auth[client.pg_dump]
    known = False
    try:
        with open(client.pg_dump, "rb") as binary:
            elf = binary.read(4) == b"\x7fELF"
        if elf:
            out = subprocess.run(
                [client.pg_dump, "--schema-only", f"--dbname={_PROBE_CONNINFO}"],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                timeout=10,
                env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C"},
                check=False,
            )
            stderr = out.stderr.decode("utf-8", "replace")
            known = out.returncode != 0 and "invalid connection option" not in stderr
    except (OSError, subprocess.SubprocessError):
        known = False
    with _cache_lock:
        _require_auth[client.pg_dump] = known
    return known


def available_clients(bin_dirs: str | None = None) -> list[PgClient]:
    """Every usable client of the configured directories, newest major first (one per major:
    the first directory listed wins)."""
    spec = settings.DUCKGRES_PG_BIN_DIRS if bin_dirs is None else bin_dirs
    by_major: dict[int, PgClient] = {}
    for bin_dir in _expand(spec):
        client = _probe_dir(bin_dir)
        if (
            client is not None
            and client.major >= pgadmin.CHANNEL_BINDING_MIN_LIBPQ
            and client.major not in by_major
        ):
            by_major[client.major] = client
    return [by_major[m] for m in sorted(by_major, reverse=True)]


def needs_require_auth(host: str, port: int) -> bool:
    """Must the client for ``host:port`` know ``require_auth``? Only where channel binding
    cannot be required (module doc)."""
    return pgadmin.channel_binding_exempt(host, port)


def choose_client(
    major: int, bin_dirs: str | None = None, *, require_auth: bool = False
) -> PgClient:
    """Same major, else the newest client whose major is ≥ ``major``; else :class:`NoPgClient`.
    ``require_auth``: among the clients whose libpq knows ``require_auth`` only."""
    clients = available_clients(bin_dirs)
    candidates = [c for c in clients if knows_require_auth(c)] if require_auth else clients
    for client in candidates:
        if client.major == major:
            return client
    newer = [c for c in candidates if c.major >= major]
    if newer:
        return newer[0]  # newest first
    have = ", ".join(str(c.major) for c in sorted(clients, key=lambda c: c.major)) or "none"
    if require_auth and [c for c in clients if c.major >= major]:
        raise NoPgClient(
            f"no pg_dump for PostgreSQL {major} whose libpq can refuse a cleartext password "
            f"request (require_auth, libpq {pgadmin.REQUIRE_AUTH_MIN_LIBPQ}+; the endpoint is "
            f"exempt from channel binding) (have: {have}, none with require_auth): install the "
            "PostgreSQL 18 client (the image's PG_CLIENTS) and add its bin directory to "
            "DUCKGRES_PG_BIN_DIRS"
        )
    raise NoPgClient(f"no pg_dump for PostgreSQL {major} (have: {have})")


def clear_cache() -> None:
    """Forget probed directories (tests that rewrite a fake client directory)."""
    with _cache_lock:
        _cache.clear()
        _require_auth.clear()


CONNECT_TIMEOUT_SECONDS = 10


# The only variables of the runner's environment pg_dump inherits (besides PGPASSWORD).
INHERITED_ENV = ("PATH", "LANG", "LC_ALL", "LC_CTYPE", "LC_MESSAGES")


@dataclass(frozen=True)
class BackupSource:
    """Where ``pg_dump`` connects. ``role``: ``--role=<tenant>`` (cnpg sources, §4.10 step 4)."""

    host: str
    port: int
    database: str
    user: str
    sslmode: str
    password: str = field(default="", repr=False)
    role: str = ""

    def redacted(self) -> str:
        text = Endpoint(self.host, self.port, self.sslmode).redacted(self.database, self.user)
        return f"{text} as role {self.role}" if self.role else text


def source_conninfo(
    source: BackupSource, *, require_auth: bool, application_name: str = "pg_dump"
) -> str:
    """Every connection parameter of ``pg_dump`` as one conninfo string (no password): the
    database name is a quoted value there, never parsed as connection settings."""
    endpoint = Endpoint(source.host, source.port, source.sslmode)
    check_secret_endpoint(source.password, source.host, source.port)  # reshard-124
    return make_conninfo(
        "",
        **pinned_host(source.host, source.port),  # the checked address is the one dumped
        port=str(source.port),
        user=source.user,
        dbname=source.database,
        connect_timeout=str(CONNECT_TIMEOUT_SECONDS),
        application_name=application_name,
        # A server that stops answering mid-dump or mid-restore is detected by the client's
        # kernel (keepalives, tcp_user_timeout) as on every other store connection (reshard-127):
        # pg_dump and pg_restore then fail instead of waiting for ever.
        **{name: str(value) for name, value in socket_params().items()},
        **tls_params(endpoint, libpq16=require_auth),
    )


def pg_dump_env(source: BackupSource) -> dict[str, str]:
    """``PATH``, the locale and ``PGPASSWORD``: nothing else of the runner's environment."""
    env = {name: os.environ[name] for name in INHERITED_ENV if os.environ.get(name)}
    env.setdefault("PATH", "/usr/bin:/bin")
    if not any(name.startswith(("LANG", "LC_")) for name in env):
        env["LANG"] = "C.UTF-8"
    env["PGPASSWORD"] = source.password
    return env


STDERR_TAIL_BYTES = 16 * 1024


class StderrTail:
    """Drains a child's pipe in a thread (a full stderr pipe would block the child), keeping
    the last ``limit`` bytes (``pg_dump`` here, ``pg_restore`` in
    ``reshard.engines.restore.stream``)."""

    def __init__(self, pipe: Any, limit: int = STDERR_TAIL_BYTES, name: str = "pg_dump") -> None:
        self._pipe = pipe
        self._limit = limit
        self._tail: deque[bytes] = deque()
        self._size = 0
        self._thread = threading.Thread(target=self._run, name=f"{name}-stderr", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            while True:
                chunk = self._pipe.read(4096)
                if not chunk:
                    return
                self._tail.append(chunk)
                self._size += len(chunk)
                while self._size > self._limit and len(self._tail) > 1:
                    self._size -= len(self._tail.popleft())
        except (OSError, ValueError):
            return

    def raw(self, timeout: float = 5.0) -> bytes:
        """The tail once the pipe is drained (or ``timeout`` passed)."""
        self._thread.join(timeout)
        return b"".join(self._tail)[-self._limit :]

    def text(self, timeout: float = 5.0) -> str:
        return self.raw(timeout).decode("utf-8", "replace").strip()
