"""The S3 authority a runner is given: one session per launch, limited to its operation
(issue 25 item 3; docs/launchers.md "S3 credentials").

Invariants:

- With ``DUCKGRES_RUNNER_S3_CREDENTIALS=operation`` (the default) a runner never receives the
  control plane's own AWS credentials. Each launch (first launch and every relaunch) mints a
  fresh session: AssumeRole of the warehouse's ``data_role_arn`` (or, without one,
  GetFederationToken of the control plane's IAM user) with a **session policy** that allows
  only:

  * the operation's own backup keys, ``<bucket>/_reshard_catalog_backups/op-<id>-*``: write
    (multipart included), read back, delete its own failed object, abort and list its own
    uploads' parts;
  * listing open multipart uploads of the bucket (S3 has no per-prefix scope for it; it shows
    key names and upload ids, never data — the runner lists only its own prefix);
  * for a restore, reading exactly the one recorded source object (any version of that key).

  Whatever the role or user may do beyond that, the session cannot: the effective rights are
  the intersection. Another operation's backups, another organisation's objects and the rest
  of the bucket are ``AccessDenied``.
- The bucket is the warehouse's ``data_bucket`` read fresh at launch (a restore's source bucket
  is the one recorded on the op); a warehouse without a bucket gets no S3 credentials at all.
- A minted session lives ``DUCKGRES_RUNNER_S3_SESSION_SECONDS`` (default 1 h) and is not
  renewed inside the runner: a relaunch mints a new one. A backup or restore that outlives it
  fails with ``ExpiredToken`` and the operation rolls back (raise the setting, and the role's
  maximum session duration, for catalogs that take longer).
- The secret parts travel only in the per-op login Secret (pod launcher) or the child's
  environment (local launcher); :attr:`RunnerS3.description` is what may be logged.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from django.conf import settings

from duckgres_admin.base.times import rfc3339_seconds
from duckgres_admin.lib.s3 import S3Error, SessionCredentials, mint_session
from duckgres_admin.models import ReshardOperation, Warehouse
from duckgres_admin.platform.names import runner_name
from reshard.engines.backup import KEY_PREFIX
from reshard.launchers.base import LauncherError

SESSION_VAR = "DUCKGRES_RESHARD_S3_SESSION"
# The variables the runner's botocore reads (its default chain, environment first).
ACCESS_KEY_VAR = "AWS_ACCESS_KEY_ID"
SECRET_KEY_VAR = "AWS_SECRET_ACCESS_KEY"
TOKEN_VAR = "AWS_SESSION_TOKEN"
# The control plane's own credentials: never copied into a runner given a session.
AMBIENT_VARS: tuple[str, ...] = (ACCESS_KEY_VAR, SECRET_KEY_VAR, TOKEN_VAR)

_OWN_OBJECT_ACTIONS = (
    "s3:PutObject",
    "s3:GetObject",
    "s3:DeleteObject",
    "s3:AbortMultipartUpload",
    "s3:ListMultipartUploadParts",
)


@dataclass(frozen=True)
class RunnerS3:
    """What one launch hands its runner: the session and a loggable description of it."""

    credentials: SessionCredentials
    description: str

    def environment(self) -> dict[str, str]:
        return {
            ACCESS_KEY_VAR: self.credentials.access_key_id,
            SECRET_KEY_VAR: self.credentials.secret_access_key,
            TOKEN_VAR: self.credentials.session_token,
            SESSION_VAR: self.description,
        }


def scoped() -> bool:
    """True when runners get operation sessions instead of the control plane's credentials."""
    return str(settings.DUCKGRES_RUNNER_S3_CREDENTIALS) == "operation"


def partition_of(role_arn: str) -> str:
    """The ARN partition (``aws``, ``aws-cn``, ``aws-us-gov``) of the role, ``aws`` without."""
    parts = role_arn.split(":")
    return parts[1] if len(parts) > 2 and parts[0] == "arn" and parts[1] else "aws"


def session_policy(
    *, bucket: str, op_id: int | None, restore: tuple[str, str] | None, partition: str
) -> str:
    """The session policy of an operation's runner, as compact JSON (no spaces: some servers
    do not decode a form-encoded ``+`` in it, and AWS counts its packed size). ``restore``:
    the ``(bucket, key)`` a restore reads, or None. ``op_id`` None: no own keys at all (the
    restore test's sandbox reads its one object and nothing else)."""
    arn = f"arn:{partition}:s3:::"
    statements: list[dict[str, object]] = []
    if op_id is not None:
        statements += [
            {
                "Sid": "OwnBackupObjects",
                "Effect": "Allow",
                "Action": list(_OWN_OBJECT_ACTIONS),
                "Resource": [f"{arn}{bucket}/{KEY_PREFIX}op-{op_id}-*"],
            },
            {
                "Sid": "OpenUploads",
                "Effect": "Allow",
                "Action": ["s3:ListBucketMultipartUploads"],
                "Resource": [f"{arn}{bucket}"],
            },
        ]
    if restore is not None:
        statements.append(
            {
                "Sid": "RestoreSource",
                "Effect": "Allow",
                "Action": ["s3:GetObject", "s3:GetObjectVersion"],
                "Resource": [f"{arn}{restore[0]}/{restore[1]}"],
            }
        )
    return json.dumps({"Version": "2012-10-17", "Statement": statements}, separators=(",", ":"))


def for_launch(op: ReshardOperation) -> RunnerS3 | None:
    """Mint the session of this launch; None when runners hold ambient credentials (setting)
    or the warehouse has no bucket (the runner then gets no S3 credentials at all). Raises
    :class:`LauncherError` naming the STS call and the fix; never a credential."""
    if not scoped():
        return None
    row = (
        Warehouse.objects.filter(org_id=op.org_id)
        .values_list("data_bucket", "data_region", "data_role_arn")
        .first()
    )
    bucket, region, role_arn = row if row else ("", "", "")
    if not bucket:
        return None
    restore = (
        (op.restore_backup_bucket or bucket, op.restore_backup_key)
        if op.restore_backup_key
        else None
    )
    policy = session_policy(
        bucket=bucket, op_id=op.id, restore=restore, partition=partition_of(role_arn)
    )
    reads = f", reads s3://{restore[0]}/{restore[1]}" if restore else ""
    return _mint(
        region, role_arn, runner_name(op.id), policy, f"bucket {bucket}, own keys "
        f"{KEY_PREFIX}op-{op.id}-*{reads}",
    )  # fmt: skip


def for_object(wh: Warehouse, key: str, session_name: str) -> RunnerS3 | None:
    """A session that may read ``s3://<data_bucket>/<key>`` (any version) and nothing else: the
    restore test's sandbox. None with ``DUCKGRES_RUNNER_S3_CREDENTIALS=ambient``."""
    if not scoped():
        return None
    policy = session_policy(
        bucket=wh.data_bucket,
        op_id=None,
        restore=(wh.data_bucket, key),
        partition=partition_of(wh.data_role_arn),
    )
    return _mint(
        wh.data_region, wh.data_role_arn, session_name, policy,
        f"reads s3://{wh.data_bucket}/{key} only",
    )  # fmt: skip


def _mint(region: str, role_arn: str, session_name: str, policy: str, scope: str) -> RunnerS3:
    seconds = int(settings.DUCKGRES_RUNNER_S3_SESSION_SECONDS)
    try:
        credentials = mint_session(
            region=region,
            role_arn=role_arn,
            session_name=session_name,
            policy=policy,
            seconds=seconds,
        )
    except S3Error as exc:
        fix = (
            "check the role's trust policy and maximum session duration"
            if role_arn
            else "set the warehouse's data_role_arn (GetFederationToken needs IAM user "
            "credentials), or DUCKGRES_RUNNER_S3_CREDENTIALS=ambient for an S3 server without STS"
        )
        raise LauncherError(f"minting the runner's S3 session failed: {exc} — {fix}") from None
    via = f"role {role_arn}" if role_arn else "federation token"
    expires = rfc3339_seconds(credentials.expiration)
    return RunnerS3(credentials, f"{via}, {scope}, expires {expires}")
