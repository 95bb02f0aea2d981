"""Fixtures for the API tests: one client per identity, Celery publish capture, clean stash."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from celery import current_app
from celery.signals import before_task_publish
from django.conf import settings
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from duckgres_admin.models import Operator
from reshard import stash


@dataclass
class Clients:
    internal: APIClient
    runner: APIClient
    dataplane: APIClient
    admin: APIClient
    viewer: APIClient
    superuser: APIClient
    disabled: APIClient
    anon: APIClient

    def all_named(self) -> dict[str, APIClient]:
        return dict(self.__dict__)


def _staff(email: str, *, role: str | None, superuser: bool = False, disabled: bool = False):
    user = get_user_model().objects.create_user(
        username=email, email=email, password=None, is_staff=True, is_superuser=superuser
    )
    if role is not None:
        Operator.objects.create(email=email, role=role, disabled=disabled)
    client = APIClient()
    client.force_login(user)
    return client


def _secret_client(header: str, value: str) -> APIClient:
    client = APIClient()
    client.credentials(**{"HTTP_" + header.upper().replace("-", "_"): value})
    return client


@pytest.fixture
def clients(db: None) -> Clients:
    return Clients(
        internal=_secret_client("X-Duckgres-Internal-Secret", settings.DUCKGRES_INTERNAL_SECRET),
        runner=_secret_client("X-Duckgres-Runner-Secret", settings.DUCKGRES_RUNNER_SECRET),
        dataplane=_secret_client("X-Duckgres-Dataplane-Secret", settings.DUCKGRES_DATAPLANE_SECRET),
        admin=_staff("admin@example.com", role="admin"),
        viewer=_staff("viewer@example.com", role="viewer"),
        superuser=_staff("root@example.com", role=None, superuser=True),
        disabled=_staff("gone@example.com", role="admin", disabled=True),
        anon=APIClient(),
    )


@pytest.fixture(autouse=True)
def _clean_stash() -> Iterator[None]:
    stash.clear()
    yield
    stash.clear()


@dataclass
class Published:
    messages: list[dict[str, Any]]

    def tasks(self) -> list[tuple[str, Any]]:
        return [(m["headers"].get("task"), m["body"]) for m in self.messages]


@pytest.fixture(autouse=True)
def published() -> Iterator[Published]:
    """Every Celery message published during the test, on an in-memory broker."""
    record = Published([])

    def receiver(sender: Any = None, body: Any = None, headers: Any = None, **kw: Any) -> None:
        record.messages.append({"task": sender, "body": body, "headers": headers or {}})

    app: Any = current_app
    old_url = app.conf.broker_url
    app.conf.broker_url = "memory://"
    app._pool = None
    app.amqp._producer_pool = None
    before_task_publish.connect(receiver, weak=False)
    try:
        yield record
    finally:
        before_task_publish.disconnect(receiver)
        app.conf.broker_url = old_url
        app._pool = None
        app.amqp._producer_pool = None


def error(response: Any) -> str:
    return str(response.json()["error"])
