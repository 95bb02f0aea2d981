"""Fixtures of the streamed-backup tests: a moto S3 server over HTTP and recording hooks."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from typing import Any

import pytest
from moto.server import ThreadedMotoServer

from duckgres_admin.lib.s3 import S3
from reshard.engines import clients
from tests.fixtures.backup import MotoS3
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.rgw import rgw

# The runner's in-process step fixtures (tests/backup/test_prepared.py).
from tests.fixtures.runner import claimed_env, cnpg_world, runner_moto_server, runner_s3

__all__ = ["claimed_env", "cnpg_world", "rgw", "runner_moto_server", "runner_s3"]


@pytest.fixture(scope="session")
def moto_server() -> Iterator[str]:
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    yield f"http://{host}:{port}"
    server.stop()


@pytest.fixture
def moto_s3(moto_server: str, monkeypatch: pytest.MonkeyPatch, settings: Any) -> MotoS3:
    """A fresh bucket on the moto server; settings point the product's S3 seam at it, and
    every request the product's clients send is recorded (method, URL, headers)."""
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    settings.DUCKGRES_S3_ENDPOINT_URL = moto_server
    settings.DUCKGRES_AWS_REGION = "us-east-1"
    settings.DUCKGRES_S3_ADDRESSING_STYLE = "path"
    s3 = S3()
    bucket = f"bk-{secrets.token_hex(6)}"
    s3.client.create_bucket(Bucket=bucket)
    moto = MotoS3(moto_server, bucket, s3)

    def record(request: Any, **_: Any) -> None:
        moto.requests.append(
            {"method": request.method, "url": request.url, "headers": dict(request.headers)}
        )

    original_init = S3.__init__

    def init(self: S3, *args: Any, **kwargs: Any) -> None:
        original_init(self, *args, **kwargs)
        self.client.meta.events.register("before-send.s3.*", record)

    monkeypatch.setattr(S3, "__init__", init)
    return moto


@pytest.fixture
def hooks() -> RecordingHooks:
    return RecordingHooks()


@pytest.fixture(autouse=True)
def _fresh_client_cache() -> Iterator[None]:
    clients.clear_cache()
    yield
    clients.clear_cache()
