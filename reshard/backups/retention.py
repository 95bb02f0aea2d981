"""The backup retention policy and its settings (docs/backup.md "Retention").

Imports nothing of Django or of the project's models, so that ``duckgres_admin.settings`` parses
the policy at start (a bad value refuses to start, naming the variable) and
``reshard.backups.inventory`` applies it.
"""

from __future__ import annotations

from dataclasses import dataclass

from duckgres_admin.platform.config import EnvReader

ENABLED_VAR = "DUCKGRES_BACKUP_RETENTION_ENABLED"
KEEP_LAST_VAR = "DUCKGRES_BACKUP_RETENTION_KEEP_LAST"
MIN_AGE_VAR = "DUCKGRES_BACKUP_RETENTION_MIN_AGE_DAYS"


@dataclass(frozen=True)
class RetentionPolicy:
    enabled: bool = False
    keep_last: int = 5
    min_age_days: int = 30


def policy_from_env(env: EnvReader) -> RetentionPolicy:
    """The policy from the environment (problems collected on ``env``, like every setting)."""
    return RetentionPolicy(
        enabled=env.boolean(ENABLED_VAR, False),
        keep_last=env.integer(KEEP_LAST_VAR, 5, minimum=1, maximum=1000),
        min_age_days=env.integer(MIN_AGE_VAR, 30, minimum=1, maximum=36500),
    )
