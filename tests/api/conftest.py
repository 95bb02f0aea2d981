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


# --- Trino (spec trino-pools §5) --------------------------------------------------------------


@dataclass
class TrinoEnv:
    """Installs a Trino configuration into this process for one test (restored afterwards)."""

    tmp: Any

    def install(self, *cell_ids: str, default: str | None = "pool-a") -> Any:
        from tests.trino.helpers import cell, full_env, registry, write
        from trino_pools import config

        cells = write(self.tmp, "api-cells.json", registry(*(cell(c) for c in cell_ids)))
        loaded = config.load(
            full_env(
                self.tmp, DUCKGRES_TRINO_CELLS_FILE=cells, DUCKGRES_TRINO_DEFAULT_CELL=default
            ),
            service_account_token="/nonexistent",
        )
        config.install_for_tests(loaded)
        return loaded

    def unwire(self) -> None:
        from trino_pools import config

        config.install_for_tests(config.TrinoSettings())


@pytest.fixture
def trino(tmp_path: Any) -> Iterator[TrinoEnv]:
    """Two pools, ``pool-a`` (the default cell) and ``pool-b``; ``trino.install(...)`` for
    another layout, ``trino.unwire()`` for a process without Trino."""
    from trino_pools import config

    env = TrinoEnv(tmp_path)
    env.install("pool-a", "pool-b")
    try:
        yield env
    finally:
        config.install_for_tests(None)
