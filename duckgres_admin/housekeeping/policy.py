"""The retention settings (``DUCKGRES_RETENTION_*``), parsed with every other setting.

Each is a number of days; 0 keeps that table's rows for ever. The notification outbox must keep
a delivered row longer than the webhook's look-back window, or the outbox scan would write the
event again and deliver it twice: that is refused at start, naming both settings.
"""

from __future__ import annotations

from dataclasses import dataclass

from duckgres_admin.platform.config import EnvReader

DAY_SECONDS = 86400


@dataclass(frozen=True)
class RetentionDays:
    op_logs: int  # log and step rows of operations that ended this long ago
    audit: int
    notifications: int  # delivered or given-up outbox rows
    leases: int  # ended connection-lease rows
    batch: int  # rows per DELETE statement
    budget_seconds: int  # one run's time budget (the next hourly run goes on)


def from_env(env: EnvReader, *, webhook_lookback_seconds: int) -> RetentionDays:
    days = RetentionDays(
        op_logs=env.integer("DUCKGRES_RETENTION_OP_LOG_DAYS", 180, minimum=0, maximum=36500),
        audit=env.integer("DUCKGRES_RETENTION_AUDIT_DAYS", 365, minimum=0, maximum=36500),
        notifications=env.integer(
            "DUCKGRES_RETENTION_NOTIFICATION_DAYS", 30, minimum=0, maximum=36500
        ),
        leases=env.integer("DUCKGRES_RETENTION_LEASE_DAYS", 7, minimum=0, maximum=36500),
        batch=env.integer("DUCKGRES_RETENTION_BATCH_ROWS", 5000, minimum=100, maximum=100000),
        budget_seconds=env.integer(
            "DUCKGRES_RETENTION_BUDGET_SECONDS", 300, minimum=10, maximum=3000
        ),
    )
    if days.notifications and days.notifications * DAY_SECONDS <= webhook_lookback_seconds:
        env.errors.append(
            "DUCKGRES_RETENTION_NOTIFICATION_DAYS must keep outbox rows longer than "
            f"DUCKGRES_WEBHOOK_LOOKBACK_SECONDS ({webhook_lookback_seconds} s), or the outbox "
            "scan would write and deliver an event again: raise the days or lower the look-back"
        )
    return days
