"""The restore command printed in the op log (spec §4.10 step 7; safeguards reshard-71,
reshard-110): one line, safe to paste, that downloads exactly the recorded backup object,
checks its digest before anything reads it, and restores it into a fresh database as a fresh
rightless role; with the prerequisites the operator's shell needs for it."""

from __future__ import annotations

import shlex
from dataclasses import dataclass

from psycopg.conninfo import make_conninfo

# The restore command (safeguard reshard-71): the file it downloads to, the database it creates.
DUMP_FILE = "./catalog.dump"


RESTORED_SUFFIX = "_restored_op{op_id}"


MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: a longer name would be truncated by the server


RESTORE_LINE_PREFIX = "restore command"


@dataclass(frozen=True)
class RestoreTarget:
    """Where the logged restore command creates and fills a NEW database (default: on the
    server the backup came from, named :func:`restored_database_name`). No user: the operator's
    login comes from ``PGUSER``/``PGPASSWORD`` (after a move the source database is gone and its
    tenant role is ``NOLOGIN``)."""

    host: str
    port: int
    database: str  # the database the command creates: it must not exist yet
    sslmode: str = ""


def restored_database_name(source_database: str, op_id: int) -> str:
    """``<source database>_restored_op<id>``, the source part shortened (whole characters) so
    that the name fits PostgreSQL's 63 bytes: the server would truncate a longer one."""
    suffix = RESTORED_SUFFIX.format(op_id=op_id)
    base = source_database
    while base and len((base + suffix).encode()) > MAX_IDENTIFIER_BYTES:
        base = base[:-1]
    return base + suffix


def _quote_identifier(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def skips_transaction_timeout(client_major: int, server_major: int) -> bool:
    """A ``pg_restore`` 17+ sends ``SET transaction_timeout``, unknown to servers before 17."""
    return client_major >= 17 and 0 < server_major < 17


def restore_prerequisites(
    target: RestoreTarget, client_major: int, *, server_major: int = 0
) -> str:
    """What the operator's shell needs for :func:`restore_command` to work as printed."""
    needs = [
        f"PGUSER and PGPASSWORD of a login with CREATEDB and CREATEROLE on "
        f"{target.host}:{target.port}"
    ]
    if (target.sslmode or "verify-full") in ("verify-ca", "verify-full"):
        needs.append("PGSSLROOTCERT = the CA file of that server")
    needs.append("AWS credentials with s3:GetObject (and s3:GetObjectVersion) on the backup")
    # An older pg_restore cannot read the archive; a 17+ one fails on an older server
    # (--exit-on-error and its SET transaction_timeout).
    if server_major and server_major < 17 and client_major < 17:
        majors = f"{client_major}" if client_major >= 16 else f"{client_major} to 16"
    else:
        majors = f"{client_major} or newer"
    needs.append(f"psql and pg_restore of PostgreSQL {majors}, sha256sum and openssl on PATH")
    if skips_transaction_timeout(client_major, server_major):
        needs.append(
            'one error, unrecognized configuration parameter "transaction_timeout", is expected '
            f"from that pg_restore on this PostgreSQL {server_major} server"
        )
    return "; ".join(needs)


def restore_line(command: str, prerequisites: str) -> str:
    """The op-log line: ``restore command (needs …): <command>``; everything after the first
    ``): `` runs as printed."""
    if not prerequisites:
        return f"{RESTORE_LINE_PREFIX}: {command}"
    return f"{RESTORE_LINE_PREFIX} (needs {prerequisites}): {command}"


@dataclass(frozen=True)
class Recorded:
    """The backup object as its operation recorded it (docs/backup.md "Authenticated
    backups"): the restore line fetches exactly this version and checks this digest."""

    bucket: str
    key: str
    sha256: str
    version_id: str = ""

    @property
    def uri(self) -> str:
        return f"s3://{self.bucket}/{self.key}"


RESTORE_PASSWORD_VAR = "DUCKGRES_RESTORE_PASSWORD"  # made fresh by the printed line itself


def restore_owner_role(database: str) -> str:
    """The fresh rightless role the printed line restores as (``<database>_owner``, within
    PostgreSQL's 63 bytes)."""
    suffix = "_owner"
    base = database
    while base and len((base + suffix).encode()) > MAX_IDENTIFIER_BYTES:
        base = base[:-1]
    return base + suffix


def restore_command(
    recorded: Recorded,
    target: RestoreTarget,
    client_major: int,
    endpoint_url: str = "",
    *,
    region: str = "",
    server_major: int = 0,
) -> str:
    """Spec §4.10 step 7, safe to paste (safeguards reshard-71, reshard-110): download exactly
    the recorded object (its VersionId where the bucket versions), **check its SHA-256 before
    anything reads it**, create a fresh role with no rights and a password made by the line
    itself (``openssl rand``, kept in the shell's environment, never in argv or the line),
    create ``target.database`` owned by that role (it must not exist: a second run stops
    there and overwrites nothing), and restore into it **logged in as that role**: a hostile
    function, check or ``RESET ROLE`` in the archive runs with no more rights than that role.
    The operator's own login (``PGUSER``/``PGPASSWORD``, CREATEDB and CREATEROLE) only creates
    the role and the database. Plain ``psql``/``pg_restore`` from ``PATH``; every part quoted
    for a POSIX shell, each connection one conninfo value (``--dbname``) with ``target.sslmode``
    (default ``verify-full``) and ``require_auth=scram-sha-256`` for a client of 16 or newer."""

    def conninfo(dbname: str) -> str:
        return make_conninfo(
            "",
            host=target.host,
            port=str(target.port),
            dbname=dbname,
            sslmode=target.sslmode or "verify-full",
            **({"require_auth": "scram-sha-256"} if client_major >= 16 else {}),
        )

    download = ["aws", "s3api", "get-object", "--bucket", recorded.bucket, "--key", recorded.key]
    if recorded.version_id:
        download += ["--version-id", recorded.version_id]
    if endpoint_url:
        download += ["--endpoint-url", endpoint_url]
    if region:
        download += ["--region", region]
    download.append(DUMP_FILE)
    check = ["printf", "%s  %s\\n", recorded.sha256, DUMP_FILE]
    owner = _quote_identifier(restore_owner_role(target.database))
    database = _quote_identifier(target.database)
    script = "\n".join(
        (
            f"\\getenv pw {RESTORE_PASSWORD_VAR}",
            f"CREATE ROLE {owner} LOGIN NOSUPERUSER NOCREATEDB NOCREATEROLE "
            "NOREPLICATION NOBYPASSRLS PASSWORD :'pw';",
            f"GRANT {owner} TO CURRENT_USER;",
            f"CREATE DATABASE {database} OWNER {owner} TEMPLATE template0;",
            f"REVOKE ALL ON DATABASE {database} FROM PUBLIC;",
        )
    )
    create = [
        "psql", "--no-psqlrc", "-v", "ON_ERROR_STOP=1", f"--dbname={conninfo('postgres')}",
        "--file=-",
    ]  # fmt: skip
    # --clean --if-exists: the archive creates schema public, which the new database has.
    restore = ["pg_restore", "--no-owner", "--no-acl", "--clean", "--if-exists"]
    if not skips_transaction_timeout(client_major, server_major):
        restore.append("--exit-on-error")
    restore += ["--format=custom", f"--dbname={conninfo(target.database)}", DUMP_FILE]
    login = shlex.quote(restore_owner_role(target.database))
    return " && ".join(
        (
            f"{shlex.join(download)} >/dev/null",
            f"{shlex.join(check)} | sha256sum --check --strict -",
            f'export {RESTORE_PASSWORD_VAR}="$(openssl rand -hex 24)"',
            f"printf '%s\\n' {shlex.quote(script)} | {shlex.join(create)}",
            f'PGUSER={login} PGPASSWORD="${RESTORE_PASSWORD_VAR}" {shlex.join(restore)}',
        )
    )
