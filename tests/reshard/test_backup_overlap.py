"""The backup beside the copy (issue 15 item 6; safeguards reshard-95, reshard-96): the pre-flip
backup runs in its own thread beside the cutover, the copy and the verification, and is joined
at the end of ``verifying``: nothing irreversible (the source drop, cnpg→external's orphaning
and flip) happens before it ended, the direction gate still fails cnpg→external without one, a
cancel or rollback stops it without leaving an open upload, and a takeover that resumes at
``copying`` starts the backup again.

Real runner processes with the test-only pause and kill points of ``reshard.engines.testhooks``
(``backup_part_uploaded``: a part stored, the upload still open), a real S3 server (moto over
HTTP) and the real store clusters."""

from __future__ import annotations

import signal
from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.models import ReshardOperation, Warehouse
from reshard.engines import uploads
from tests.fixtures.faults import backdate
from tests.fixtures.runner import (
    CnpgWorld,
    ExternalTargetWorld,
    RunnerS3,
    external_target_world,
    op_log,
    password_url,
    reload,
    run_runner,
    runner_moto_server,
    runner_s3,
    start_runner,
    step_rows,
    wait_until,
    warehouse_of,
)

__all__ = ["external_target_world", "runner_moto_server", "runner_s3"]

pytestmark = pytest.mark.faults

MANDATORY = "pre-flip catalog backup is mandatory"


def _env(org_id: str, s3: RunnerS3, **points: str) -> dict[str, str]:
    """The warehouse's bucket, the runner's S3 environment and the test hooks asked for."""
    Warehouse.objects.filter(org_id=org_id).update(data_bucket=s3.bucket)
    hooks = {"DUCKGRES_RESHARD_TEST_HOOKS": "1"} if points else {}
    names = {"pause": "DUCKGRES_RESHARD_TEST_PAUSE_AT", "kill": "DUCKGRES_RESHARD_TEST_KILL_AT"}
    for what, point in points.items():
        hooks[names[what]] = point
    return {**s3.env(), **hooks, "DUCKGRES_RESHARD_TEST_PAUSE_SECONDS": "8"}


def _index(lines: list[str], prefix: str) -> int:
    return next(i for i, line in enumerate(lines) if line.startswith(prefix))


@pytest.mark.safeguard("reshard-95")
def test_the_copy_runs_while_the_backup_upload_is_open_and_the_drop_waits_for_it(
    cnpg_world: CnpgWorld, runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    world = cnpg_world
    prefix = uploads.op_prefix(world.op.id)
    runner = start_runner(
        world.op.id,
        runner_state_dir,
        env_extra=_env(world.op.org_id, runner_s3, pause="backup_part_uploaded"),
    )
    seen: dict[str, Any] = {}

    def copying_beside_the_open_upload() -> bool:
        op = reload(world.op)
        if op.step in ("copying", "verifying") and runner_s3.open_uploads(prefix):
            seen.update(step=op.step, dropped=op.source_drop_committed_at, uri=op.backup_s3_uri)
            return True
        return runner.proc.poll() is not None

    wait_until(copying_beside_the_open_upload, 90, "the copy beside the open backup upload")
    assert seen, f"the runner ended first: {runner.output()}"
    assert (seen["dropped"], seen["uri"]) == (None, ""), "nothing recorded before the join"
    assert runner.wait(120) == 0, runner.output()
    op = reload(world.op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, "\n".join(lines))
    assert op.backup_s3_uri.startswith(f"s3://{runner_s3.bucket}/")
    assert op.backup_bytes > 0
    assert op.progress["bytes_dumped"] == op.backup_bytes
    assert op.progress["tables_done"] == op.tables_copied, "neither writer erased the other"
    assert runner_s3.open_uploads(prefix) == []
    started = _index(lines, "catalog backup started beside the cutover")
    copy = _index(lines, "copying the catalog from")
    verified = _index(lines, "DuckLake verification passed")
    complete = _index(lines, "catalog backup complete: s3://")
    commit = lines.index("commit point reached: all subsequent failures roll forward")
    assert started < copy < verified < complete < commit, "joined after verifying, before drop"
    assert any(line.startswith("catalog backup finished ") for line in lines)


def test_with_the_overlap_off_the_backup_runs_alone_inside_its_step(
    cnpg_world: CnpgWorld, runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    world = cnpg_world
    prefix = uploads.op_prefix(world.op.id)
    runner = start_runner(
        world.op.id,
        runner_state_dir,
        env_extra={
            **_env(world.op.org_id, runner_s3, pause="backup_part_uploaded"),
            "DUCKGRES_RESHARD_BACKUP_OVERLAP": "false",
        },
    )
    wait_until(lambda: bool(runner_s3.open_uploads(prefix)), 90, "the open backup upload")
    assert reload(world.op).step == "backup_catalog"
    assert runner.wait(120) == 0, runner.output()
    op = reload(world.op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, "\n".join(lines))
    assert _index(lines, "catalog backup complete: s3://") < _index(lines, "copying the catalog")
    assert not any(line.startswith("catalog backup started beside") for line in lines)


@pytest.mark.safeguard("reshard-95")
def test_a_failed_mandatory_backup_fails_cnpg_to_external_before_the_orphaning_and_flip(
    external_target_world: ExternalTargetWorld, runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    world = external_target_world
    env = _env(world.op.org_id, runner_s3)
    # A bucket the S3 server does not have: the dump starts, the upload cannot.
    Warehouse.objects.filter(org_id=world.op.org_id).update(data_bucket="no-such-bucket-here")
    with password_url(world.target.password) as url:
        runner = run_runner(
            world.op.id, runner_state_dir, env_extra=env, DUCKGRES_RESHARD_PASSWORD_URL=url
        )
    op = reload(world.op)
    lines = op_log(op.id)
    assert runner.proc.returncode == 0, runner.output()
    assert op.state == "failed", "\n".join(lines)
    assert op.error.startswith(MANDATORY), op.error
    steps = [s for s, _, _ in step_rows(op.id)]
    assert steps[-1] == "verifying", steps
    assert "orphaning_source" not in steps
    assert "cutover" not in steps
    assert op.external_verified_at is None
    wh = warehouse_of(op)
    assert (wh.state, wh.metadata_store_kind) == ("ready", "cnpg"), "still bound to the source"


@pytest.mark.safeguard("reshard-95")
def test_a_cancel_beside_the_backup_stops_it_and_leaves_no_open_upload(
    external_target_world: ExternalTargetWorld, runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    world = external_target_world
    prefix = uploads.op_prefix(world.op.id)
    env = _env(world.op.org_id, runner_s3, pause="backup_part_uploaded")
    with password_url(world.target.password) as url:
        runner = start_runner(
            world.op.id, runner_state_dir, env_extra=env, DUCKGRES_RESHARD_PASSWORD_URL=url
        )
        wait_until(
            lambda: (
                reload(world.op).step in ("copying", "verifying") or runner.proc.poll() is not None
            ),
            90,
            "the copy beside the backup",
        )
        assert runner_s3.open_uploads(prefix), "the backup is still open beside the copy"
        ReshardOperation.objects.filter(id=world.op.id).update(cancel_requested=True)
        assert runner.wait(120) == 0, runner.output()
    op = reload(world.op)
    lines = op_log(op.id)
    assert (op.state, op.error) == ("cancelled", "cancelled by operator"), "\n".join(lines)
    assert op.backup_s3_uri == ""
    assert runner_s3.open_uploads(prefix) == [], "the abandoned backup aborted its upload"
    stored = runner_s3.keys()
    assert [k for k in stored if k.startswith(prefix)] == []
    assert any(line.startswith("stopping the catalog backup running beside") for line in lines)
    assert warehouse_of(op).metadata_store_kind == "cnpg"


@pytest.mark.safeguard("reshard-96")
def test_a_takeover_resuming_at_copying_backs_up_again_before_the_drop(
    cnpg_world: CnpgWorld, runner_state_dir: Path, runner_s3: RunnerS3
) -> None:
    world = cnpg_world
    prefix = uploads.op_prefix(world.op.id)
    env = _env(world.op.org_id, runner_s3, pause="backup_part_uploaded", kill="copy_table_done")
    first = run_runner(world.op.id, runner_state_dir, env_extra=env)
    assert first.proc.returncode == -signal.SIGKILL, first.output()
    assert reload(world.op).backup_s3_uri == "", "killed beside the backup: none recorded"
    backdate(world.op.id)
    second = run_runner(world.op.id, runner_state_dir, env_extra=_env(world.op.org_id, runner_s3))
    assert second.proc.returncode == 0, second.output()
    op = reload(world.op)
    lines = op_log(op.id)
    assert op.state == "succeeded", (op.error, "\n".join(lines))
    assert "no catalog backup was recorded before this takeover: starting one" in lines
    assert op.backup_s3_uri.startswith(f"s3://{runner_s3.bucket}/{prefix}")
    complete = max(i for i, line in enumerate(lines) if line.startswith("catalog backup complete"))
    commit = lines.index("commit point reached: all subsequent failures roll forward")
    assert complete < commit
