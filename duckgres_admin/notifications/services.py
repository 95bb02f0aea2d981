"""The outbox scan and one delivery attempt (docs/notifications.md).

Terminal paths (the runner, its rollback, the janitor's force-fail, ``reshard_recover``, a
cancel before start) do not know about notifications: the op row is the source of truth, and
the scan derives the outbox from it.

``outbox_scan`` (beat, every 15 s; safe to run anywhere and twice at once):

1. Insert one row per terminal operation finished within the lookback that has none for its
   state: ``INSERT … ON CONFLICT (kind, subject_id, event) DO NOTHING``, so two scans insert it
   once.
2. Hand out the due rows: one ``UPDATE … FROM (SELECT … FOR UPDATE SKIP LOCKED) … RETURNING``
   takes ``pending`` rows whose ``next_attempt_at`` passed and ``sending`` rows whose claim
   expired (their worker died), sets them ``pending`` with ``next_attempt_at`` pushed one
   redelivery grace ahead, and enqueues ``notifications.deliver(id)`` after commit. A lost
   message is therefore re-sent by a later scan, and two scans never hand out a row twice
   within the grace.

``notification_deliver`` (one Celery message, id only):

1. Claim by CAS: ``pending`` → ``sending``, ``attempts + 1``, ``claimed_until`` = now + the
   request budget + grace. No row (delivered, given up, or claimed by another task): nothing.
2. POST the signed body through ``duckgres_admin.lib.http.post`` (no redirect, no proxy, the
   whole request bounded by ``DUCKGRES_WEBHOOK_TIMEOUT_SECONDS``).
3. Record the outcome guarded by ``state='sending' AND attempts=<this attempt>``: 2xx →
   ``delivered`` (never sent again); 4xx other than 408/425/429, or the last attempt →
   ``failed``; otherwise ``pending`` with ``next_attempt_at`` = now + backoff + grace, and the
   task retries itself after the backoff (``min(base * 2^(attempt-1), 3600)`` seconds).

Delivery is at-least-once: a worker that dies after the receiver answered and before step 3
committed leaves a ``sending`` row that a later scan hands out again. Receivers deduplicate by
``X-Duckgres-Delivery`` (the row id).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import current_app
from django.conf import settings
from django.db import connection, transaction
from django.db.models import Exists, F, OuterRef, QuerySet
from django.db.models.functions import Coalesce, Now

from duckgres_admin.base.scrub import Scrubber
from duckgres_admin.lib import http
from duckgres_admin.models import (
    ENDED_DRAIN_STATES,
    TERMINAL_STATES,
    Notification,
    NotificationKind,
    NotificationState,
    ReshardOperation,
    StoreDrain,
)
from duckgres_admin.notifications import events, signing
from duckgres_admin.notifications.config import WebhookConfig

_log = logging.getLogger("duckgres.notifications")

DELIVER_TASK = "notifications.deliver"
SCAN_BATCH = 200
# How long a handed-out or claimed row waits before a scan may hand it out again.
REDELIVER_GRACE_SECONDS = 60
MAX_BACKOFF_SECONDS = 3600
ERROR_MAX_CHARS = 500
# Statuses worth retrying: the receiver may take it later.
_RETRYABLE_4XX = frozenset({408, 425, 429})


@dataclass(frozen=True)
class ScanReport:
    enabled: bool
    inserted: int = 0
    enqueued: tuple[int, ...] = ()


@dataclass(frozen=True)
class DeliveryOutcome:
    notification_id: int
    outcome: str  # delivered | retry | failed | skipped | disabled
    status: int | None = None
    attempt: int = 0
    retry_in: int | None = None


def _config() -> WebhookConfig:
    config: WebhookConfig = settings.DUCKGRES_WEBHOOK
    return config


def backoff_seconds(config: WebhookConfig, attempt: int) -> int:
    return int(min(config.backoff_seconds * 2 ** max(attempt - 1, 0), MAX_BACKOFF_SECONDS))


def _insert_rows(
    kind: str,
    ended: QuerySet[Any],
    lookback_seconds: int,
    payload: Callable[[Any], dict[str, Any]],
) -> int:
    """One row per subject of ``ended`` (rows with ``id`` and ``state``, annotated ``ended``
    with the time they ended) that ended within the look-back and has none for its state."""
    has_row = Notification.objects.filter(
        kind=kind, subject_id=OuterRef("pk"), event=OuterRef("state")
    )
    subjects = list(
        ended.filter(ended__gte=Now() - timedelta(seconds=lookback_seconds))
        .exclude(Exists(has_row))
        .order_by("id")[:SCAN_BATCH]
    )
    rows = [
        Notification(kind=kind, subject_id=s.id, event=s.state, payload=payload(s))
        for s in subjects
    ]
    # ON CONFLICT DO NOTHING: a concurrent scan inserted the same event first.
    Notification.objects.bulk_create(rows, ignore_conflicts=True)
    return len(rows)


def _insert_event_rows(config: WebhookConfig) -> int:
    """Terminal reshard operations and ended store drains."""
    ops = ReshardOperation.objects.filter(state__in=TERMINAL_STATES).alias(
        ended=Coalesce("finished_at", "created_at")
    )
    ended_drains = StoreDrain.objects.filter(state__in=ENDED_DRAIN_STATES).alias(
        ended=F("finished_at")
    )
    return _insert_rows(
        NotificationKind.RESHARD, ops, config.lookback_seconds, events.reshard_event
    ) + _insert_rows(
        NotificationKind.DRAIN,
        ended_drains,
        config.lookback_seconds,
        lambda drain: events.drain_event(drain, drain.progress()),
    )


_HAND_OUT_SQL = """
UPDATE duckgres_notifications AS n
   SET state = 'pending', claimed_until = NULL,
       next_attempt_at = now() + make_interval(secs => %(grace)s)
  FROM (SELECT id FROM duckgres_notifications
         WHERE (state = 'pending' AND next_attempt_at <= now())
            OR (state = 'sending' AND claimed_until < now())
         ORDER BY id
         LIMIT %(batch)s
           FOR UPDATE SKIP LOCKED) AS due
 WHERE n.id = due.id
RETURNING n.id
"""


def _send_deliver(ids: list[int]) -> None:
    for notification_id in ids:
        try:
            current_app.send_task(DELIVER_TASK, args=[notification_id])
        except Exception as exc:  # noqa: BLE001 - the next scan hands the row out again
            _log.warning("cannot queue %s(%d): %s", DELIVER_TASK, notification_id, exc)


def outbox_scan() -> ScanReport:
    """Write the missing outbox rows and enqueue the due deliveries (module docstring)."""
    config = _config()
    if not config.enabled:
        return ScanReport(enabled=False)
    inserted = _insert_event_rows(config)
    with transaction.atomic(), connection.cursor() as cursor:
        cursor.execute(_HAND_OUT_SQL, {"grace": REDELIVER_GRACE_SECONDS, "batch": SCAN_BATCH})
        ids = sorted(int(row[0]) for row in cursor.fetchall())
        transaction.on_commit(lambda: _send_deliver(ids))
    if inserted or ids:
        _log.info(
            "notification outbox: %d new event(s), %d delivery(ies) queued", inserted, len(ids)
        )
    return ScanReport(enabled=True, inserted=inserted, enqueued=tuple(ids))


_CLAIM_SQL = """
UPDATE duckgres_notifications
   SET state = 'sending', attempts = attempts + 1, last_attempt_at = now(),
       claimed_until = now() + make_interval(secs => %(hold)s)
 WHERE id = %(id)s AND state = 'pending'
RETURNING attempts, payload::text
"""


def _claim(notification_id: int, hold_seconds: int) -> tuple[int, str] | None:
    with connection.cursor() as cursor:
        cursor.execute(_CLAIM_SQL, {"id": notification_id, "hold": hold_seconds})
        row = cursor.fetchone()
    return (int(row[0]), str(row[1])) if row else None


def _record(
    notification_id: int, attempt: int, *, state: str, status: int | None, error: str, delay: int
) -> bool:
    fields: dict[str, object] = {
        "state": state,
        "last_status": status,
        "last_error": error[:ERROR_MAX_CHARS],
        "claimed_until": None,
    }
    if state == NotificationState.DELIVERED:
        fields["delivered_at"] = Now()
    if state == NotificationState.PENDING:
        fields["next_attempt_at"] = Now() + timedelta(seconds=delay + REDELIVER_GRACE_SECONDS)
    updated = Notification.objects.filter(
        pk=notification_id, state=NotificationState.SENDING, attempts=attempt
    ).update(**fields)
    return updated == 1


def _headers(
    config: WebhookConfig, notification_id: int, event: str, body: bytes
) -> dict[str, str]:
    timestamp = int(time.time())
    return {
        "Content-Type": "application/json",
        "User-Agent": "duckgres-admin-webhook/1",
        "X-Duckgres-Event": event,
        "X-Duckgres-Delivery": str(notification_id),
        signing.TIMESTAMP_HEADER: str(timestamp),
        signing.SIGNATURE_HEADER: signing.signature(config.secret, timestamp, body),
    }


def notification_deliver(*, notification_id: int) -> DeliveryOutcome:
    """One delivery attempt of one outbox row (module docstring)."""
    config = _config()
    if not config.enabled:
        return DeliveryOutcome(notification_id, "disabled")
    claimed = _claim(notification_id, config.timeout_seconds + REDELIVER_GRACE_SECONDS)
    if claimed is None:
        return DeliveryOutcome(notification_id, "skipped")
    attempt, payload_text = claimed
    event = json.loads(payload_text)
    body = events.render(event, delivery_id=notification_id, fmt=config.format)
    headers = _headers(config, notification_id, str(event.get("event", "")), body)
    scrub = Scrubber(config.secret, config.url)
    status: int | None = None
    try:
        response = http.post(config.url, headers=headers, body=body, timeout=config.timeout_seconds)
        status = response.status
        error = "" if 200 <= status < 300 else f"the receiver answered HTTP {status}"
    except http.HttpTransportError as exc:
        error = scrub.scrub(f"transport: {exc}")
    if status is not None and 200 <= status < 300:
        state, delay = NotificationState.DELIVERED, 0
    elif (
        status is not None and 400 <= status < 500 and status not in _RETRYABLE_4XX
    ) or attempt >= config.max_attempts:
        state, delay = NotificationState.FAILED, 0
    else:
        state, delay = NotificationState.PENDING, backoff_seconds(config, attempt)
    recorded = _record(
        notification_id, attempt, state=state, status=status, error=error, delay=delay
    )
    where = config.destination
    if not recorded:
        _log.warning(
            "notification %d: attempt %d's outcome was not recorded (the row changed meanwhile)",
            notification_id,
            attempt,
        )
        return DeliveryOutcome(notification_id, "skipped", status, attempt)
    if state == NotificationState.DELIVERED:
        _log.info(
            "notification %d (%s) delivered to %s: HTTP %s (attempt %d)",
            notification_id, event.get("event"), where, status, attempt,
        )  # fmt: skip
        return DeliveryOutcome(notification_id, "delivered", status, attempt)
    if state == NotificationState.FAILED:
        _log.warning(
            "notification %d (%s) to %s given up after attempt %d/%d: %s",
            notification_id, event.get("event"), where, attempt, config.max_attempts, error,
        )  # fmt: skip
        return DeliveryOutcome(notification_id, "failed", status, attempt)
    _log.warning(
        "notification %d (%s) to %s: attempt %d/%d failed (%s); retrying in %d s",
        notification_id, event.get("event"), where, attempt, config.max_attempts, error, delay,
    )  # fmt: skip
    return DeliveryOutcome(notification_id, "retry", status, attempt, retry_in=delay)
