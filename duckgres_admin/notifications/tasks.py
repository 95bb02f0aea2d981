"""Celery tasks of the notification outbox (docs/notifications.md). Thin: id in, service out.

Both run on ``duckgres.default`` (the default queue; no route needed).

- ``notifications.scan()``: beat every 15 s, expires 15 s. Not ``acks_late``: a scan lost with
  its worker is the next scan, and two scans at once are harmless (the outbox key and
  ``SKIP LOCKED``).
- ``notifications.deliver(notification_id)``: one attempt; ``acks_late`` because it is
  idempotent (a redelivered message finds the row claimed or delivered and does nothing). The
  retry policy lives in the row (attempts, backoff, ``DUCKGRES_WEBHOOK_MAX_ATTEMPTS``): the task
  retries itself after the backoff the service computed, and the scan re-sends a row whose
  message was lost.
"""

from __future__ import annotations

from typing import Any

from celery import shared_task

from duckgres_admin.notifications import services
from duckgres_admin.platform.queues import TaskName

# Celery's own bound, above the row's (DUCKGRES_WEBHOOK_MAX_ATTEMPTS ≤ 20).
CELERY_MAX_RETRIES = 25


@shared_task(name=TaskName.NOTIFICATIONS_SCAN, acks_late=False, ignore_result=True)
def scan_task() -> dict[str, object]:
    report = services.outbox_scan()
    return {"enabled": report.enabled, "inserted": report.inserted, "queued": len(report.enqueued)}


@shared_task(
    name=TaskName.NOTIFICATIONS_DELIVER,
    bind=True,
    acks_late=True,
    max_retries=CELERY_MAX_RETRIES,
    ignore_result=True,
)
def deliver_task(self: Any, notification_id: int) -> str:
    outcome = services.notification_deliver(notification_id=int(notification_id))
    if outcome.retry_in is not None and self.request.retries < CELERY_MAX_RETRIES:
        raise self.retry(countdown=outcome.retry_in)
    return outcome.outcome
