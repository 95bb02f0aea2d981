"""The restore line in the op log works as printed (safeguard reshard-71).

After a successful move the source database is gone and its tenant role is ``NOLOGIN``: a
command restoring "into the source as the tenant" cannot work when an operator needs it. The
line restores into a NEW database on the server the backup came from, as the login the operator
supplies (``PGUSER``/``PGPASSWORD``), and states its prerequisites before the command.

The end-to-end test takes the line exactly as a finished cnpg→cnpg operation (a real runner
process, the store clusters 5433/5434, a moto S3 server over HTTP) logged it, and runs the part
after the prerequisites verbatim with ``bash -c`` in an operator's shell: only what the line
names (``PGUSER``/``PGPASSWORD`` of the store's provisioner, a login with CREATEDB; the CA as
``PGSSLROOTCERT``; AWS keys; a ``PATH`` with ``aws``, ``psql`` and ``pg_restore``).
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from django.conf import settings
from psycopg import sql

from duckgres_admin.models import MetadataStore, Warehouse
from reshard.engines.restore.command import (
    Recorded,
    RestoreTarget,
    restore_command,
    restore_line,
    restore_owner_role,
    restore_prerequisites,
    restored_database_name,
)
from tests.fixtures.runner import (
    CnpgWorld,
    RunnerS3,
    catalog_checksums,
    cnpg_world,
    database_exists,
    op_log,
    reload,
    role_can_login,
    run_runner,
    runner_moto_server,
    runner_s3,
    runner_state_dir,
)
from tests.fixtures.stores import StoreCluster

__all__ = ["cnpg_world", "runner_moto_server", "runner_s3", "runner_state_dir"]  # fixtures

pytestmark = pytest.mark.safeguard("reshard-71")

PREFIX = "restore command ("


def _restore_line(lines: list[str]) -> str:
    found = [line for line in lines if line.startswith(PREFIX)]
    assert len(found) == 1, "\n".join(lines)
    return found[0]


def _printed_command(line: str) -> str:
    """Everything after the prerequisites, exactly as logged."""
    assert "): " in line, line
    return line.split("): ", 1)[1]


def _aws_bin_dir() -> str:
    """The directory of the ``aws`` CLI: the virtualenv's (requirements-dev.txt), else PATH's."""
    venv = Path(sys.executable).parent
    if (venv / "aws").is_file():
        return str(venv)
    found = shutil.which("aws")
    if not found:
        pytest.fail("the aws CLI is missing: install requirements-dev.txt (awscli)")
    return str(Path(found).parent)


def _operator_env(cluster: StoreCluster, home: Path) -> dict[str, str]:
    """An operator's shell: the login the line asks for, the CA, AWS keys, the tools. Nothing
    of this process's environment (no PG* or DUCKGRES_* variable, no AWS config file)."""
    home.mkdir(exist_ok=True)
    env = {
        "PATH": f"{_aws_bin_dir()}:/usr/bin:/bin",
        "HOME": str(home),
        "LANG": "C.UTF-8",
        "PGUSER": cluster.provisioner_user,
        "PGPASSWORD": cluster.provisioner_password,
        "AWS_ACCESS_KEY_ID": "testing",
        "AWS_SECRET_ACCESS_KEY": "testing",
    }
    rootcert = settings.DUCKGRES_STORE_SSLROOTCERT
    if rootcert and rootcert != "system":
        env["PGSSLROOTCERT"] = rootcert
    return env


def _drop(cluster: StoreCluster, name: str) -> None:
    with cluster.superuser_conn() as conn:
        drop = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(drop.format(sql.Identifier(name)))


def _drop_role(cluster: StoreCluster, name: str) -> None:
    with cluster.superuser_conn() as conn:
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))


@pytest.mark.safeguard("reshard-110")
def test_the_logged_restore_line_works_as_printed_after_a_finished_move(
    cnpg_world: CnpgWorld, runner_state_dir: Path, runner_s3: RunnerS3, tmp_path: Path
) -> None:
    world = cnpg_world
    source = world.catalog.cluster
    # The production default: verify-full against the stores' CA (when the test CA exists).
    rootcert = settings.DUCKGRES_STORE_SSLROOTCERT
    sslmode = "verify-full" if rootcert and rootcert != "system" else source.sslmode
    MetadataStore.objects.filter(pk=world.source_store.pk).update(sslmode=sslmode)
    Warehouse.objects.filter(id=world.warehouse.id).update(data_bucket=runner_s3.bucket)
    before = catalog_checksums(source, world.catalog.database)
    assert before

    runner = run_runner(world.op.id, runner_state_dir, env_extra=runner_s3.env())
    op = reload(world.op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, "\n".join(lines), runner.output())
    # The situation an operator restores in: the source database is gone, its role NOLOGIN.
    assert not database_exists(source, world.catalog.database)
    assert role_can_login(source, world.catalog.role) is False

    line = _restore_line(lines)
    restored = restored_database_name(world.catalog.database, op.id)
    home = tmp_path / "operator"  # the operator's HOME and working directory
    env = _operator_env(source, home)
    try:
        done = subprocess.run(
            ["bash", "-c", _printed_command(line)], cwd=home, env=env,
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert done.returncode == 0, f"{line}\n--- stderr ---\n{done.stderr}"
        assert (home / "catalog.dump").read_bytes().startswith(b"PGDMP")
        # The new database holds the catalog exactly as it was before the move.
        assert catalog_checksums(source, restored) == before
        # The prerequisites are on the line, before the command; no password anywhere in it.
        needs = line[len(PREFIX) : line.index("): ")]
        assert needs.startswith(
            "needs PGUSER and PGPASSWORD of a login with CREATEDB and CREATEROLE on "
            f"{source.host}:{source.port}"
        ), line
        assert "psql and pg_restore of PostgreSQL 15 to 16, sha256sum and openssl on PATH" in (
            needs
        ), line
        assert ("PGSSLROOTCERT" in needs) == (sslmode == "verify-full"), line
        for secret in (world.catalog.password, source.provisioner_password, "testing"):
            assert secret not in line
        assert f"sslmode={sslmode}" in line
        bucket, _, key = op.backup_s3_uri.removeprefix("s3://").partition("/")
        assert f"--bucket {bucket} --key {key}" in line
        assert op.backup_sha256 in line, "the recorded digest is checked before pg_restore"
        with source.superuser_conn(restored) as conn:
            owner = conn.execute(
                "SELECT pg_get_userbyid(datdba) FROM pg_database WHERE datname = %s", [restored]
            ).fetchone()
        # Restored as a fresh rightless role, never as the operator's CREATEDB login.
        assert owner == (restore_owner_role(restored),)
        with source.superuser_conn() as conn:
            rights = conn.execute(
                "SELECT rolsuper, rolcreaterole, rolcreatedb, rolbypassrls FROM pg_roles "
                "WHERE rolname = %s",
                [restore_owner_role(restored)],
            ).fetchone()
        assert rights == (False, False, False, False)

        # A second run stops at CREATE DATABASE: the restored database is never overwritten.
        again = subprocess.run(
            ["bash", "-c", _printed_command(line)], cwd=home, env=env,
            capture_output=True, text=True, timeout=180, check=False,
        )  # fmt: skip
        assert again.returncode != 0
        assert "already exists" in again.stderr, again.stderr
        assert catalog_checksums(source, restored) == before
    finally:
        _drop(source, restored)
        _drop_role(source, restore_owner_role(restored))


@pytest.mark.safeguard("reshard-110")
def test_the_printed_line_refuses_an_object_the_tenant_replaced(
    cnpg_world: CnpgWorld, runner_state_dir: Path, runner_s3: RunnerS3, tmp_path: Path
) -> None:
    """Issue 25 items 1-2: after the move the tenant overwrites its backup object with another
    archive (its bucket is the tenant's). Pasted as printed, the line stops at the digest check
    before pg_restore reads a byte: no database and no restore role is created."""
    world = cnpg_world
    source = world.catalog.cluster
    Warehouse.objects.filter(id=world.warehouse.id).update(data_bucket=runner_s3.bucket)
    runner = run_runner(world.op.id, runner_state_dir, env_extra=runner_s3.env())
    op = reload(world.op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, "\n".join(lines), runner.output())
    hostile = subprocess.run(
        ["pg_dump", "--format=custom", "--no-owner", "-h", source.host, "-p", str(source.port),
         "-U", "postgres", "postgres"],
        capture_output=True, timeout=60, check=True,
        env={"PATH": "/usr/bin:/bin", "PGSSLMODE": "require"},
    ).stdout  # fmt: skip
    bucket, _, key = op.backup_s3_uri.removeprefix("s3://").partition("/")
    runner_s3.client().put_object(Bucket=bucket, Key=key, Body=hostile)
    restored = restored_database_name(world.catalog.database, op.id)
    home = tmp_path / "operator"
    try:
        done = subprocess.run(
            ["bash", "-c", _printed_command(_restore_line(lines))], cwd=home,
            env=_operator_env(source, home), capture_output=True, text=True, timeout=180,
            check=False,
        )  # fmt: skip
        assert done.returncode != 0, done.stdout
        assert "FAILED" in done.stderr or "FAILED" in done.stdout, done.stderr
        assert not database_exists(source, restored)
        assert role_can_login(source, restore_owner_role(restored)) is None
    finally:
        _drop(source, restored)
        _drop_role(source, restore_owner_role(restored))


def test_the_restore_line_states_the_pg_restore_majors_that_work() -> None:
    target = RestoreTarget("db.example.com", 6543, "cat_restored_op7", "verify-full")
    assert restore_prerequisites(target, 15, server_major=15) == (
        "PGUSER and PGPASSWORD of a login with CREATEDB and CREATEROLE on db.example.com:6543; "
        "PGSSLROOTCERT = the CA file of that server; "
        "AWS credentials with s3:GetObject (and s3:GetObjectVersion) on the backup; "
        "psql and pg_restore of PostgreSQL 15 to 16, sha256sum and openssl on PATH"
    )
    assert restore_prerequisites(target, 18, server_major=18).endswith(
        "psql and pg_restore of PostgreSQL 18 or newer, sha256sum and openssl on PATH"
    )
    # pg_dump 18 of a PostgreSQL 16 source: no pg_restore avoids SET transaction_timeout there,
    # so the command does not stop at that error, and the line says it is expected.
    skew = restore_prerequisites(target, 18, server_major=16)
    assert skew.endswith(
        'one error, unrecognized configuration parameter "transaction_timeout", is expected '
        "from that pg_restore on this PostgreSQL 16 server"
    )
    assert "--exit-on-error" not in restore_command(
        Recorded("b", "k", "0" * 64), target, 18, server_major=16
    )
    assert "--exit-on-error" in restore_command(
        Recorded("b", "k", "0" * 64), target, 18, server_major=18
    )
    assert "--exit-on-error" in restore_command(
        Recorded("b", "k", "0" * 64), target, 15, server_major=15
    )
    # require: no CA needed on the line; the line is "restore command (needs …): <command>".
    plain = RestoreTarget("h", 5432, "d", "require")
    assert "PGSSLROOTCERT" not in restore_prerequisites(plain, 15, server_major=15)
    assert restore_line("cmd", "x") == "restore command (needs x): cmd"


def test_the_restored_database_name_fits_postgresql_identifiers() -> None:
    assert restored_database_name("tenant_db", 42) == "tenant_db_restored_op42"
    long = restored_database_name("é" * 40, 12345)
    assert long.endswith("_restored_op12345")
    assert len(long.encode()) <= 63
    assert long.encode().decode() == long  # cut on a character boundary
