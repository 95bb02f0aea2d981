"""Password stash and pull URL (spec §4.17)."""

from __future__ import annotations

import pytest

from reshard import stash


def test_url_prefers_the_configured_address(settings):
    settings.DUCKGRES_ADVERTISE_ADDRESS = "10.1.2.3"
    settings.POD_IP = "10.9.9.9"
    settings.DUCKGRES_ADVERTISE_PORT = 9090
    settings.DUCKGRES_ADVERTISE_SCHEME = "https"
    assert stash.password_url(7, "pod") == "https://10.1.2.3:9090/api/v1/reshards/7/password"


def test_url_uses_pod_ip_and_brackets_ipv6(settings):
    settings.DUCKGRES_ADVERTISE_ADDRESS = ""
    settings.POD_IP = "fd00::12"
    assert stash.password_url(8, "pod") == "http://[fd00::12]:8080/api/v1/reshards/8/password"


def test_local_launcher_uses_loopback(settings):
    settings.DUCKGRES_ADVERTISE_ADDRESS = ""
    settings.POD_IP = ""
    assert stash.password_url(9, "local") == "http://127.0.0.1:8080/api/v1/reshards/9/password"


def test_no_address_is_an_error(settings, monkeypatch):
    settings.DUCKGRES_ADVERTISE_ADDRESS = ""
    settings.POD_IP = ""
    monkeypatch.setattr(stash, "_first_global_unicast", lambda: "")
    with pytest.raises(stash.NoAddressError, match="could not determine its own address"):
        stash.password_url(1, "pod")


def test_put_get_delete_and_known_values():
    stash.put(1, "secret-one")
    stash.put(2, "secret-two")
    assert stash.get(1) == "secret-one"
    assert sorted(stash.known_values()) == ["secret-one", "secret-two"]
    stash.delete(1)
    stash.delete(1)
    assert stash.held_ids() == [2]
