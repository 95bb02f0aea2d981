"""The backup's S3 client and source facts, prepared while the block's propagation wait runs
(issue 15 item 5; ``reshard/runner/steps/backup_catalog.py``): the backup step uses them only
for exactly the destination and source it backs up, never waits for them, and without them
behaves as before."""

from __future__ import annotations

from concurrent.futures import Future
from typing import Any

import pytest

from duckgres_admin.models import Warehouse
from reshard.engines import backup as backup_mod
from reshard.engines import clients
from reshard.runner.env import StepEnv
from reshard.runner.steps import backup_catalog, blocking, record_source
from tests.fixtures.runner import CnpgWorld, RunnerS3

pytestmark = pytest.mark.safeguard("reshard-86")


@pytest.fixture
def world_with_bucket(
    cnpg_world: CnpgWorld, runner_s3: RunnerS3, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> CnpgWorld:
    for name, value in runner_s3.env().items():
        if name.startswith("AWS_"):
            monkeypatch.setenv(name, value)
    settings.DUCKGRES_S3_ENDPOINT_URL = runner_s3.endpoint_url
    settings.DUCKGRES_AWS_REGION = "us-east-1"
    settings.DUCKGRES_S3_ADDRESSING_STYLE = "path"
    Warehouse.objects.filter(org_id=cnpg_world.warehouse.org_id).update(
        data_bucket=runner_s3.bucket, data_region="us-east-1"
    )
    return cnpg_world


def recorded_backups(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    real = backup_mod.run_backup

    def recording(*args: Any, **kwargs: Any) -> backup_mod.BackupResult:
        calls.append(kwargs)
        return real(*args, **kwargs)

    monkeypatch.setattr(backup_mod, "run_backup", recording)
    return calls


def block_and_record(env: StepEnv) -> None:
    """``blocking`` without its wait: the block, the preparation, recordSource."""
    blocking.block_warehouse(env)
    backup_catalog.prepare(env)
    record_source.run(env)


def test_the_step_uses_the_client_and_facts_prepared_during_the_wait(
    world_with_bucket: CnpgWorld, claimed_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = claimed_env(world_with_bucket.op)
    block_and_record(env)
    future = env.ctx.backup_prep
    assert isinstance(future, Future)
    prepared = future.result(timeout=60)  # the wait would have let it finish
    assert prepared.s3 is not None
    assert prepared.facts is not None
    assert prepared.facts.server_major >= 15
    assert prepared.source == backup_catalog._source(env)  # the submitted source is the dumped one
    calls = recorded_backups(monkeypatch)

    backup_catalog.run_backup_step(env)

    assert len(calls) == 1
    assert calls[0]["s3"] is prepared.s3
    assert calls[0]["facts"] is prepared.facts
    assert env.ctx.backup_prep is None  # taken once
    bucket = Warehouse.objects.get(org_id=world_with_bucket.warehouse.org_id).data_bucket
    assert env.op.backup_s3_uri.startswith(f"s3://{bucket}/_reshard_catalog_backups/")
    assert env.op.backup_bytes > 0


def test_a_preparation_for_another_region_role_or_source_is_not_used(
    world_with_bucket: CnpgWorld, claimed_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = claimed_env(world_with_bucket.op)
    block_and_record(env)
    real = env.ctx.backup_prep.result(timeout=60)
    source = backup_catalog._source(env)
    wrong = backup_catalog.PreparedBackup(
        region="eu-west-1",  # the warehouse says us-east-1
        role_arn="",
        s3=real.s3,
        # Same server, another login: facts about it are never taken for the dumped source.
        source=clients.BackupSource(**{**source.__dict__, "password": "another-password"}),
        facts=backup_mod.SourceFacts(server_major=99, db_size=1),
    )
    future: Future[backup_catalog.PreparedBackup] = Future()
    future.set_result(wrong)
    env.ctx.backup_prep = future
    calls = recorded_backups(monkeypatch)

    backup_catalog.run_backup_step(env)

    assert calls[0]["s3"] is None
    assert calls[0]["facts"] is None
    assert env.op.backup_bytes > 0  # read its own facts (a major 99 would find no pg_dump)


def test_an_unfinished_or_failed_preparation_is_ignored_without_waiting(
    world_with_bucket: CnpgWorld, claimed_env: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = claimed_env(world_with_bucket.op)
    block_and_record(env)
    env.ctx.backup_prep.result(timeout=60)
    running: Future[backup_catalog.PreparedBackup] = Future()  # never completes
    env.ctx.backup_prep = running
    assert backup_catalog.take_prepared(env.ctx) is None
    assert env.ctx.backup_prep is None
    failed: Future[backup_catalog.PreparedBackup] = Future()
    failed.set_exception(RuntimeError("STS unreachable"))
    env.ctx.backup_prep = failed
    calls = recorded_backups(monkeypatch)

    backup_catalog.run_backup_step(env)

    assert calls[0]["s3"] is None
    assert calls[0]["facts"] is None
    assert env.op.backup_bytes > 0
