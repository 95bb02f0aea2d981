"""The backup's compression setting ``DUCKGRES_RESHARD_BACKUP_COMPRESSION`` (issue 15 item 4):
every allowed value writes an archive the stock ``pg_restore`` restores; anything else refuses to
start, naming the variable and the allowed values; the runner receives it (env contract)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.models import ReshardOperation
from reshard.engines import backup as backup_mod
from reshard.engines.backup import BackupDestination, run_backup
from reshard.launchers.envcontract import ALLOWLIST
from reshard.launchers.local import runner_env
from tests.fixtures.backup import PG15_BIN, MotoS3, catalog_source, restore_into_scratch
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.settings_probe import start

VARIABLE = "DUCKGRES_RESHARD_BACKUP_COMPRESSION"
ALLOWED = "none, gzip:1, gzip:2, gzip:3, gzip:4, gzip:5, gzip:6, gzip:7, gzip:8, gzip:9"


def archive_compression(body: bytes) -> str:
    """The ``Compression:`` line of ``pg_restore --list`` (stock pg_restore reads the header)."""
    with tempfile.NamedTemporaryFile(suffix=".dump") as f:
        f.write(body)
        f.flush()
        out = subprocess.run(
            [f"{PG15_BIN}/pg_restore", "--list", f.name],
            capture_output=True, text=True, check=True,
        )  # fmt: skip
    return next(
        line.split(":", 1)[1].strip() for line in out.stdout.splitlines() if "Compression:" in line
    )


@pytest.mark.safeguard("reshard-85")
@pytest.mark.parametrize(("value", "level"), [("none", 0), ("gzip:6", 6), ("gzip:9", 9)])
def test_a_non_default_compression_restores_with_stock_pg_restore(
    moto_s3: MotoS3,
    hooks: RecordingHooks,
    tenant_catalog: Any,
    settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    value: str,
    level: int,
) -> None:
    catalog = tenant_catalog(rows=200)
    settings.DUCKGRES_RESHARD_BACKUP_COMPRESSION = value
    spawned: list[list[str]] = []
    real_popen = subprocess.Popen

    def recording_popen(argv: Any, *args: Any, **kwargs: Any) -> Any:
        spawned.append(list(argv))
        return real_popen(argv, *args, **kwargs)

    monkeypatch.setattr(subprocess, "Popen", recording_popen)
    result = run_backup(86, catalog_source(catalog), BackupDestination(moto_s3.bucket), hooks)

    dumps = [a for a in spawned if a[0].endswith("/pg_dump") and "--format=custom" in a]
    assert len(dumps) == 1
    assert [a for a in dumps[0] if a.startswith("--compress")] == [f"--compress={level}"]
    body = moto_s3.get(result.key)
    assert len(body) == result.bytes
    assert archive_compression(body) == str(level)
    # The logged restore command's pg_restore flags, stock pg_restore 15: identical rows.
    assert restore_into_scratch(catalog.cluster, body) == catalog.row_counts()
    assert moto_s3.open_uploads() == []


@pytest.mark.safeguard("reshard-85")
@pytest.mark.parametrize("bad", ["zstd:3", "lz4", "gzip:0", "gzip:10", "6", "GZIP:6", "gzip: 6"])
def test_a_bad_compression_refuses_to_start_naming_the_variable_and_the_allowed_values(
    bad: str,
) -> None:
    result = start({VARIABLE: bad})
    assert result.returncode != 0
    assert f"{VARIABLE}={bad!r} is not one of: {ALLOWED}" in result.stderr


def test_the_default_is_gzip_1_and_an_unset_value_keeps_it() -> None:
    result = start({VARIABLE: ""})
    assert result.returncode == 0, result.stderr
    assert backup_mod.compression_flag("gzip:1") == "--compress=1"
    assert backup_mod.compression_flag("gzip:6") == "--compress=6"
    assert backup_mod.compression_flag("none") == "--compress=0"
    with pytest.raises(ValueError, match=f"{VARIABLE}='zstd' is not one of: {ALLOWED}"):
        backup_mod.compression_flag("zstd")


def test_the_runner_receives_the_setting(tmp_path: Path) -> None:
    assert VARIABLE in ALLOWLIST
    op = ReshardOperation(id=86)
    env = runner_env(op, {VARIABLE: "gzip:9", "PATH": "/bin"}, directory=tmp_path, uid="u")
    assert env[VARIABLE] == "gzip:9"
