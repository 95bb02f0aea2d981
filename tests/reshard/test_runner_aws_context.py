"""The runner names its AWS context at start, never a secret (``describe_aws_context`` in
``duckgres_admin/lib/s3.py``, called by ``manage.py reshard_runner``).

The runner is a real subprocess against the test database, as in ``test_runner_process.py``;
the credential sources are boto3's real resolution over environments built for each case
(no mock): environment keys, a shared credentials file, and nothing at all.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest

from duckgres_admin.lib.s3 import describe_aws_context
from duckgres_admin.models import ReshardOperation
from tests.fixtures.runner import op_log, run_runner, runner_state_dir

assert runner_state_dir

ACCESS_KEY_ID = "AKIA" + secrets.token_hex(8).upper()
SECRET_KEY = "aws-context-secret-" + secrets.token_hex(12)
SESSION_TOKEN = "aws-context-token-" + secrets.token_hex(12)
ENDPOINT_PASSWORD = "endpoint-pw-" + secrets.token_hex(6)
SECRETS = (ACCESS_KEY_ID, SECRET_KEY, SESSION_TOKEN, ENDPOINT_PASSWORD)

# Every variable through which boto3 could find credentials or a region on this machine.
AMBIENT = (
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_SECURITY_TOKEN",
    "AWS_PROFILE",
    "AWS_DEFAULT_PROFILE",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ROLE_ARN",
    "AWS_WEB_IDENTITY_TOKEN_FILE",
    "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI",
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT_URL_S3",
)


@pytest.fixture
def no_ambient_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """No credential or region source but the ones a test adds (no files, no metadata
    service), in this process and in the children it starts (they copy its environment);
    returns the path to use as the shared credentials file."""
    for name in AMBIENT:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return tmp_path / "credentials"


def _assert_no_secret(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text


@pytest.mark.safeguard("reshard-115")
def test_the_runner_logs_region_endpoint_and_credential_source_first_and_no_secret(
    transactional_db: None, runner_state_dir: Path, no_ambient_aws: Path
) -> None:
    op = ReshardOperation.objects.create(
        org_id="org-aws-context",
        source_kind="cnpg",
        from_shard="shard-a",
        target_kind="cnpg",
        to_shard="shard-b",
        state="cancelled",
        error="cancelled before start",
        launcher="local",
    )
    env = dict(
        DUCKGRES_AWS_REGION="eu-central-1",
        DUCKGRES_S3_ENDPOINT_URL=f"http://minio:{ENDPOINT_PASSWORD}@127.0.0.1:9000/s3?x={SECRET_KEY}",
        DUCKGRES_S3_ADDRESSING_STYLE="path",
        AWS_ACCESS_KEY_ID=ACCESS_KEY_ID,
        AWS_SECRET_ACCESS_KEY=SECRET_KEY,
        AWS_SESSION_TOKEN=SESSION_TOKEN,
    )
    runner = run_runner(op.id, runner_state_dir, env_extra=env)
    assert runner.proc.returncode == 0, runner.output()

    expected = (
        "AWS context: region eu-central-1 (DUCKGRES_AWS_REGION); S3 endpoint "
        "http://127.0.0.1:9000/s3 (DUCKGRES_S3_ENDPOINT_URL), addressing style path; "
        "credentials from env (the ambient chain; a warehouse's data_role_arn is assumed "
        "with them)"
    )
    log = op_log(op.id)
    assert log[0] == expected, log  # the runner's first line, before it looks at the op
    assert log[1] == "runner started for an operation already cancelled; nothing to do"
    # The process log carries the same line, bound with the op id.
    records = [json.loads(x) for x in runner.output().splitlines() if x.startswith("{")]
    [line] = [r for r in records if r.get("event", "").startswith("AWS context:")]
    assert (line["event"], line["op_id"]) == (expected, op.id)
    _assert_no_secret(runner.output())
    _assert_no_secret("\n".join(log))


@pytest.mark.safeguard("reshard-115")
@pytest.mark.safeguard("reshard-137")
def test_each_credential_source_is_named_as_boto3_reports_it(
    no_ambient_aws: Path, monkeypatch: pytest.MonkeyPatch, settings: Any
) -> None:
    settings.DUCKGRES_AWS_REGION = ""
    settings.DUCKGRES_S3_ENDPOINT_URL = ""
    settings.DUCKGRES_S3_ADDRESSING_STYLE = "auto"

    # Nothing at all: no region, AWS's global endpoint, no credentials.
    line = describe_aws_context()
    assert line.startswith(
        "AWS context: no default region (each warehouse's data_region); S3 endpoint "
        "https://s3.amazonaws.com (boto3's default for the region), addressing style auto; "
        "credentials none found"
    ), line

    # A shared credentials file and the AWS region variable.
    no_ambient_aws.write_text(
        f"[default]\naws_access_key_id = {ACCESS_KEY_ID}\naws_secret_access_key = {SECRET_KEY}\n"
    )
    monkeypatch.setenv("AWS_DEFAULT_REGION", "eu-west-1")
    line = describe_aws_context()
    assert line.startswith(
        "AWS context: region eu-west-1 (AWS environment or config); S3 endpoint "
        "https://s3.eu-west-1.amazonaws.com (boto3's default for the region), addressing "
        "style auto; credentials from shared-credentials-file"
    ), line
    _assert_no_secret(line)

    # Environment keys win over the file, as in boto3's chain.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", ACCESS_KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
    monkeypatch.setenv("AWS_SESSION_TOKEN", SESSION_TOKEN)
    line = describe_aws_context()
    assert "credentials from env (" in line
    _assert_no_secret(line)

    # A runner its launcher gave an operation-scoped session says so, and that it assumes no
    # role (safeguard reshard-137): the description is the launcher's, never a credential.
    settings.DUCKGRES_RESHARD_S3_SESSION = (
        "role arn:aws:iam::1:role/r, bucket b, own keys _reshard_catalog_backups/op-7-*, "
        "expires 2026-12-06T13:00:00Z"
    )
    line = describe_aws_context()
    assert line.endswith(
        "credentials from env (an operation-scoped session: role arn:aws:iam::1:role/r, bucket b, "
        "own keys _reshard_catalog_backups/op-7-*, expires 2026-12-06T13:00:00Z; no role is "
        "assumed)"
    ), line
    _assert_no_secret(line)
