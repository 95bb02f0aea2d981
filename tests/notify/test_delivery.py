"""The outbox and its delivery, against a real HTTP receiver (and a real Celery worker)."""

from __future__ import annotations

import base64
import json
import secrets
import time
from datetime import timedelta
from typing import Any

import pytest
import redis
from django.conf import settings as django_settings
from django.utils import timezone

from duckgres_admin.models import Notification, ReshardOperation
from duckgres_admin.notifications import services, signing
from duckgres_admin.notifications.config import WebhookConfig

WEBHOOK_SECRET = "webhook-signing-secret-0123456789abcdefXYZ"
REF_SOURCE = "k8s:duckgres/duckgres-tenant-acme#password"
REF_TARGET = "k8s:duckgres/duckgres-tenant-acme-target#password"


def _config(url: str, **overrides: Any) -> WebhookConfig:
    fields: dict[str, Any] = {
        "url": url,
        "secret": WEBHOOK_SECRET,
        "timeout_seconds": 5,
        "max_attempts": 3,
        "backoff_seconds": 1,
    }
    fields.update(overrides)
    return WebhookConfig(**fields)


def _webhook_env(url: str) -> dict[str, str]:
    return {
        "DUCKGRES_WEBHOOK_URL": url,
        "DUCKGRES_WEBHOOK_SECRET": WEBHOOK_SECRET,
        "DUCKGRES_WEBHOOK_BACKOFF_SECONDS": "1",
        "DUCKGRES_WEBHOOK_MAX_ATTEMPTS": "3",
        "DUCKGRES_WEBHOOK_TIMEOUT_SECONDS": "5",
    }


def _bound(make_warehouse: Any, store: Any, **overrides: Any) -> Any:
    """A ready warehouse with a complete cnpg binding on ``store`` (its own database)."""
    name = secrets.token_hex(4)
    fields = {
        "database_name": f"db_{name}",
        "metadata_store_database": f"db_{name}",
        "metadata_store_user": f"user_{name}",
        "metadata_store_password_ref": f"env:DUCKGRES_TEST_TENANT_{name.upper()}",
    }
    fields.update(overrides)
    return make_warehouse(store=store, **fields)


def _finished(op: ReshardOperation, state: str, **fields) -> ReshardOperation:
    now = timezone.now()
    values = {"state": state, "finished_at": now, **fields}
    ReshardOperation.objects.filter(pk=op.pk).update(**values)
    op.refresh_from_db()
    return op


def _wait_rows(ids, state: str, timeout: float = 60.0) -> list[Notification]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rows = list(Notification.objects.filter(subject_id__in=ids).order_by("subject_id"))
        if len(rows) == len(ids) and all(r.state == state for r in rows):
            return rows
        time.sleep(0.2)
    raise AssertionError([(r.subject_id, r.state, r.attempts, r.last_error) for r in rows])


def _verified(request: Any) -> dict[str, Any]:
    assert request.headers["content-type"] == "application/json"
    assert signing.verify(
        WEBHOOK_SECRET,
        request.headers["x-duckgres-timestamp"],
        request.headers["x-duckgres-signature"],
        request.body,
        now=time.time(),
    ), request.headers
    # A tampered body or another secret does not verify.
    assert not signing.verify(
        WEBHOOK_SECRET,
        request.headers["x-duckgres-timestamp"],
        request.headers["x-duckgres-signature"],
        request.body + b" ",
        now=time.time(),
    )
    body: dict[str, Any] = json.loads(request.body)
    return body


@pytest.mark.safeguard("reshard-87")
def test_every_terminal_op_is_delivered_once_by_a_real_worker_with_a_retry(
    receiver, settings, make_store, make_warehouse, make_op, celery_worker_factory
):
    settings.DUCKGRES_WEBHOOK = _config(receiver.url)
    source, target = make_store(), make_store()
    ops = []
    for state in ("succeeded", "failed", "cancelled"):
        wh = _bound(make_warehouse, source)
        op = make_op(wh, to_store=target)
        ops.append(_finished(op, state, started_at=timezone.now(), step="copying"))
    running = make_op(_bound(make_warehouse, source), to_store=target, state="running")
    old = _finished(
        make_op(_bound(make_warehouse, source), to_store=target),
        "succeeded",
        finished_at=timezone.now() - timedelta(days=3),
    )
    receiver.statuses = [503]  # the first request is refused, then every one is taken
    worker = celery_worker_factory(extra_env=_webhook_env(receiver.url))

    report = services.outbox_scan()
    assert report.inserted == 3
    assert len(report.enqueued) == 3
    ids = [op.id for op in ops]
    rows = _wait_rows(ids, "delivered")
    requests = receiver.wait_for(4)
    time.sleep(1.5)
    assert len(receiver.requests) == 4, worker.log_text()[-3000:]

    bodies = [_verified(r) for r in requests]
    by_delivery: dict[int, list[dict[str, Any]]] = {}
    for request, body in zip(requests, bodies, strict=True):
        assert request.path == "/hooks/duckgres"
        assert request.headers["x-duckgres-delivery"] == str(body["delivery_id"])
        assert request.headers["x-duckgres-event"] == body["event"]
        by_delivery.setdefault(body["delivery_id"], []).append(body)
    assert sorted(by_delivery) == sorted(r.id for r in rows)
    assert sorted(len(v) for v in by_delivery.values()) == [1, 1, 2]  # one retried once
    for row, op in zip(rows, ops, strict=True):
        body = by_delivery[row.id][-1]
        assert body["operation_id"] == op.id
        assert body["org_id"] == op.org_id
        assert body["event"] == f"reshard.{op.state}"
        assert body["state"] == op.state
        assert body["source"] == {"kind": "cnpg", "store": source.name}
        assert body["target"] == {"kind": "cnpg", "store": target.name}
        assert body["finished_at"]
        assert body["created_at"]
        assert body["started_at"]
        assert body["error_code"] == {
            "succeeded": None, "failed": "step_failed", "cancelled": "cancelled"
        }[op.state]  # fmt: skip
        assert row.last_status == 200
        assert row.delivered_at is not None
        assert row.last_error == ""
    assert sorted(r.attempts for r in rows) == [1, 1, 2]
    assert not Notification.objects.filter(subject_id__in=[running.id, old.id]).exists()

    # Delivered rows are never handed out or sent again, by a scan or a stray message.
    again = services.outbox_scan()
    assert again.inserted == 0
    assert again.enqueued == ()
    assert services.notification_deliver(notification_id=rows[0].id).outcome == "skipped"
    time.sleep(1.5)
    assert len(receiver.requests) == 4
    log = worker.log_text()
    assert WEBHOOK_SECRET not in log
    assert "/hooks/duckgres" not in log
    assert "attempt 1/3 failed (the receiver answered HTTP 503); retrying in 1 s" in log


@pytest.mark.safeguard("reshard-88")
def test_no_secret_in_payload_celery_message_or_error(
    receiver, settings, make_store, make_warehouse, make_op, transactional_db
):
    settings.DUCKGRES_WEBHOOK = _config(receiver.url)
    wh = _bound(make_warehouse, make_store(), metadata_store_password_ref=REF_SOURCE)
    op = make_op(
        wh,
        source_password_secret_ref=REF_SOURCE,
        target_kind="external",
        target_endpoint="rds.example.com",
        target_port=6543,
        target_user="tenant_user_acme",
        target_database="tenant_db_acme",
        target_password_secret_ref=REF_TARGET,
        password_url="http://10.0.0.1:8081/api/v1/reshards/1/password",
    )
    op = _finished(
        op,
        "failed",
        error=f"the reference {REF_TARGET} does not resolve (user tenant_user_acme)",
        recovery_required=True,
    )
    client = redis.Redis.from_url(str(django_settings.CELERY_BROKER_URL))
    client.delete("duckgres.default")
    report = services.outbox_scan()
    assert report.enqueued
    (row,) = Notification.objects.filter(subject_id=op.id)
    # The Celery message carries the row id only.
    messages = client.lrange("duckgres.default", 0, -1)
    mine = []
    for raw in messages:
        assert WEBHOOK_SECRET.encode() not in raw
        assert b"hooks" not in raw
        envelope = json.loads(raw)
        if envelope["headers"]["task"] == "notifications.deliver":
            args = json.loads(base64.b64decode(envelope["body"]))[0]
            mine.append(args)
    assert [row.id] in mine
    client.delete("duckgres.default")

    outcome = services.notification_deliver(notification_id=row.id)
    assert outcome.outcome == "delivered"
    (request,) = receiver.requests
    body = _verified(request)
    assert body["target"] == {"kind": "external", "host": "rds.example.com"}
    assert body["error_code"] == "not_started"  # no runner ever claimed it
    assert body["recovery_required"] is True
    text = request.body.decode() + json.dumps(row.payload)
    for forbidden in (
        REF_SOURCE, REF_TARGET, "tenant_user_acme", "tenant_db_acme", "password",
        "does not resolve", WEBHOOK_SECRET, "postgresql://", "8081",
    ):  # fmt: skip
        assert forbidden not in text, forbidden
    assert WEBHOOK_SECRET not in json.dumps({k: str(v) for k, v in request.headers.items()})


def test_refusals_give_up_and_transport_errors_back_off(
    receiver, settings, make_op, make_warehouse, make_store, transactional_db
):
    settings.DUCKGRES_WEBHOOK = _config(receiver.url)
    store = make_store()
    op = _finished(make_op(_bound(make_warehouse, store), to_store=make_store()), "cancelled")
    services.outbox_scan()
    (row,) = Notification.objects.filter(subject_id=op.id)

    # A permanent refusal (400) is given up at once: no retry.
    receiver.statuses = [400]
    outcome = services.notification_deliver(notification_id=row.id)
    assert (outcome.outcome, outcome.status, outcome.retry_in) == ("failed", 400, None)
    row.refresh_from_db()
    assert (row.state, row.attempts, row.last_error) == (
        "failed", 1, "the receiver answered HTTP 400"
    )  # fmt: skip

    # Nobody listening: retried with exponential backoff, then given up after max_attempts.
    Notification.objects.filter(pk=row.pk).update(state="pending", attempts=0)
    closed = "http://127.0.0.1:1/hooks/s3cr3t-path?token=s3cr3t"
    settings.DUCKGRES_WEBHOOK = _config(closed, max_attempts=3, backoff_seconds=7)
    delays = []
    for _ in range(3):
        outcome = services.notification_deliver(notification_id=row.id)
        delays.append(outcome.retry_in)
    assert delays == [7, 14, None]
    row.refresh_from_db()
    assert row.state == "failed"
    assert row.attempts == 3
    assert row.last_status is None
    assert row.last_error.startswith("transport: ")
    assert "s3cr3t" not in row.last_error
    assert len(receiver.requests) == 1


def test_a_stale_claim_is_handed_out_again_and_the_slack_format(
    receiver, settings, make_op, make_warehouse, make_store, transactional_db
):
    settings.DUCKGRES_WEBHOOK = _config(receiver.url, format="slack")
    wh = _bound(make_warehouse, make_store())
    op = _finished(make_op(wh, to_store=make_store()), "succeeded")
    services.outbox_scan()
    (row,) = Notification.objects.filter(subject_id=op.id)
    # A worker that died mid-attempt left the row claimed; once the claim expires a scan
    # hands it out again (at-least-once), and the next attempt delivers.
    Notification.objects.filter(pk=row.pk).update(
        state="sending", attempts=1, claimed_until=timezone.now() - timedelta(seconds=1)
    )
    assert services.notification_deliver(notification_id=row.id).outcome == "skipped"
    assert row.id in services.outbox_scan().enqueued
    assert services.notification_deliver(notification_id=row.id).outcome == "delivered"
    (request,) = receiver.requests
    body = json.loads(request.body)
    assert list(body) == ["text"]
    assert f"reshard {op.id} of org `{op.org_id}` *succeeded*" in body["text"]
    assert signing.verify(
        WEBHOOK_SECRET,
        request.headers["x-duckgres-timestamp"],
        request.headers["x-duckgres-signature"],
        request.body,
        now=time.time(),
    )


def test_off_without_a_url_and_the_beat_row(settings, make_op, make_warehouse, make_store, db):
    from django_celery_beat.models import PeriodicTask

    settings.DUCKGRES_WEBHOOK = WebhookConfig()
    _finished(make_op(_bound(make_warehouse, make_store()), to_store=make_store()), "succeeded")
    assert services.outbox_scan() == services.ScanReport(enabled=False)
    assert not Notification.objects.exists()
    task = PeriodicTask.objects.get(task="notifications.scan")
    assert (task.name, task.queue, task.expire_seconds, task.enabled) == (
        "duckgres: notification outbox (every 15 s)", "duckgres.default", 15, True
    )  # fmt: skip
    assert (task.interval.every, task.interval.period) == (15, "seconds")


def test_a_drain_that_ended_is_delivered_once_with_its_counts(
    receiver, settings, make_store, transactional_db
):
    from reshard.control import drains

    settings.DUCKGRES_WEBHOOK = _config(receiver.url)
    drain = drains.create_drain(
        make_store().name,
        target_stores=[make_store().name],
        max_concurrent=1,
        drain_timeout_seconds=60,
        actor="ops@example.com",
    )
    services.outbox_scan()
    assert not Notification.objects.filter(kind="drain").exists(), "only an ended drain"
    drains.advance(lambda: None)  # nothing bound: it ends at once
    services.outbox_scan()
    services.outbox_scan()  # a second scan writes nothing more
    (row,) = Notification.objects.filter(kind="drain", subject_id=drain.id)
    assert row.event == "finished"
    assert services.notification_deliver(notification_id=row.id).outcome == "delivered"
    (request,) = receiver.requests
    body = json.loads(request.body)
    assert body["event"] == "drain.finished"
    assert (body["drain_id"], body["store"], body["state"]) == (
        drain.id,
        drain.store_id,
        "finished",
    )
    assert body["progress"] == dict.fromkeys(
        ("waiting", "running", "succeeded", "failed", "cancelled", "skipped"), 0
    )
    assert signing.verify(
        WEBHOOK_SECRET,
        request.headers["x-duckgres-timestamp"],
        request.headers["x-duckgres-signature"],
        request.body,
        now=time.time(),
    )


@pytest.mark.django_db
def test_a_restore_is_announced_as_one(make_store, make_warehouse, make_op) -> None:
    from duckgres_admin.notifications import events

    source, target = make_store(), make_store()
    op = make_op(_bound(make_warehouse, source), to_store=target)
    key = "_reshard_catalog_backups/op-7-20260101T000000Z.dump"
    op = _finished(op, "succeeded", kind="restore", restore_backup_key=key)
    event = events.reshard_event(op)
    assert (event["event"], event["kind"], event["backup_key"]) == (
        "restore.succeeded",
        "restore",
        key,
    )
    assert f"restore {op.id} of org `{op.org_id}` *succeeded*" in events.slack_text(event)
    plain = events.reshard_event(
        _finished(make_op(_bound(make_warehouse, source), to_store=target), "failed")
    )
    assert (plain["event"], plain["kind"]) == ("reshard.failed", "reshard")
    assert "backup_key" not in plain
