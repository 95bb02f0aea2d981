"""Password stash and pull URL (spec §4.17)."""

from __future__ import annotations

import pytest

from reshard.start import stash


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


@pytest.mark.safeguard("reshard-79")
def test_take_hands_an_entry_out_once():
    stash.put(3, "secret-three")
    assert stash.take(3) == "secret-three"
    assert stash.take(3) is None
    assert stash.get(3) is None


@pytest.mark.safeguard("reshard-79")
def test_the_url_names_the_pull_port_when_it_is_set(settings):
    settings.DUCKGRES_ADVERTISE_ADDRESS = "10.1.2.3"
    settings.DUCKGRES_ADVERTISE_PORT = 8080
    settings.DUCKGRES_PASSWORD_PULL_PORT = 8081
    assert stash.password_url(7, "pod") == "http://10.1.2.3:8081/api/v1/reshards/7/password"


@pytest.mark.safeguard("reshard-79")
@pytest.mark.django_db(transaction=True)
def test_the_pruner_drops_a_terminal_ops_entry_without_any_request():
    import threading
    import time

    from tests.fixtures.rows import new_op, new_store, new_warehouse

    warehouse = new_warehouse(
        org_id="prune-org",
        store=new_store(name="prune-src"),
        metadata_store_database="d",
        metadata_store_user="u",
        metadata_store_password_ref="env:X",
    )
    live = new_op(warehouse, state="running", target_endpoint="h", target_port=5432)
    stash.put(live.id, "live-password")
    stop = threading.Event()
    thread = stash.start_pruner(0.05, stop)
    try:
        time.sleep(0.3)
        assert stash.held_ids() == [live.id]  # a running op keeps its entry
        type(live).objects.filter(pk=live.id).update(state="failed")
        deadline = time.monotonic() + 5
        while stash.held_ids() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stash.held_ids() == []
    finally:
        stop.set()
        thread.join(5)
