"""The retention task (``housekeeping.prune``): beat every hour on ``duckgres.default``,
expires after an hour; not ``acks_late`` (a run lost with its worker is the next run)."""

from __future__ import annotations

from celery import shared_task

from duckgres_admin.housekeeping import prune
from duckgres_admin.platform.queues import TaskName


@shared_task(name=TaskName.HOUSEKEEPING_PRUNE, acks_late=False, ignore_result=True)
def prune_task() -> dict[str, object]:
    report = prune.prune()
    return {"deleted": report.deleted, "unfinished": report.unfinished}
