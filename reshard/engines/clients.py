"""Choosing the ``pg_dump``/``pg_restore`` client for a source server (spec reshard §6).

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
from dataclasses import dataclass

from django.conf import settings

from duckgres_admin.lib import pgadmin

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
