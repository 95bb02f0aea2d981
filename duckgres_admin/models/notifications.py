"""The notification outbox (docs/notifications.md).

One row per (subject kind, subject id, event): a reshard operation that reached a terminal
state, or a store drain that ended, gets exactly one row for that state, written by the outbox
scan with ``INSERT … ON CONFLICT DO NOTHING`` on the unique key, so concurrent scans are
harmless. The delivery task claims a row by compare-and-swap (``pending`` → ``sending``,
``attempts + 1``) and records the outcome guarded by the same attempt number; a ``delivered``
row is never claimed again. ``payload`` is the event as built at insert time: identifiers,
states, store names and timestamps only, never a password, a DSN or a secret reference."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class NotificationKind(models.TextChoices):
    RESHARD = "reshard"
    DRAIN = "drain"  # a store drain (plan) that ended: finished or cancelled


class NotificationState(models.TextChoices):
    PENDING = "pending"  # waiting for its next attempt (next_attempt_at)
    SENDING = "sending"  # claimed by a delivery task until claimed_until
    DELIVERED = "delivered"  # the receiver answered 2xx: never sent again
    FAILED = "failed"  # given up: attempts exhausted or a permanent refusal


class Notification(models.Model):
    id = models.BigAutoField(primary_key=True)
    kind = models.TextField(choices=NotificationKind.choices)
    subject_id = models.BigIntegerField()
    event = models.TextField()
    payload = models.JSONField()
    state = models.TextField(choices=NotificationState.choices, default=NotificationState.PENDING)
    attempts = models.IntegerField(default=0)
    last_status = models.IntegerField(null=True, blank=True)
    last_error = models.TextField(default="", blank=True)
    created_at = models.DateTimeField(db_default=Now())
    next_attempt_at = models.DateTimeField(db_default=Now())
    claimed_until = models.DateTimeField(null=True, blank=True)
    last_attempt_at = models.DateTimeField(null=True, blank=True)
    delivered_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "duckgres_notifications"
        verbose_name = "notification"
        indexes = [
            # The scan's re-enqueue of due rows: WHERE state IN (pending, sending) ORDER BY id.
            models.Index(
                fields=["next_attempt_at"],
                condition=models.Q(state__in=["pending", "sending"]),
                name="notification_due",
            ),
        ]
        constraints = [
            # One notification per subject and event: the scan's ON CONFLICT key.
            models.UniqueConstraint(
                fields=["kind", "subject_id", "event"], name="notification_one_per_event"
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=[s.value for s in NotificationState]),
                name="notification_state_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(kind__in=[k.value for k in NotificationKind]),
                name="notification_kind_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(attempts__gte=0), name="notification_attempts_nonnegative"
            ),
        ]

    def __str__(self) -> str:
        return f"notification {self.id} ({self.kind} {self.subject_id} {self.event}, {self.state})"
