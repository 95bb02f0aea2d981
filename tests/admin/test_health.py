"""The API replica's probes."""

import pytest
from django.db import OperationalError, connection


def test_livez_needs_nothing(client):
    response = client.get("/livez")
    assert response.status_code == 200
    assert response.json() == {"status": "ok"}


@pytest.mark.django_db
def test_readyz_checks_the_config_store(client):
    assert client.get("/readyz").status_code == 200


@pytest.mark.django_db
def test_readyz_is_503_when_the_config_store_is_unreachable(client, monkeypatch):
    def broken_cursor(*args, **kwargs):
        raise OperationalError("connection refused")

    monkeypatch.setattr(connection, "cursor", broken_cursor)
    response = client.get("/readyz")
    assert response.status_code == 503
    assert response.json()["status"] == "unavailable"
