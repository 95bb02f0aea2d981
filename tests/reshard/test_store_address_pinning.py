"""The address a store connection checked is the address it uses (safeguard reshard-80).

A store's host name is resolved once per connection, every answer is checked against
``DUCKGRES_STORE_HOST_DENYLIST`` and the session goes to exactly those addresses (libpq
``hostaddr``) while TLS still verifies the name. DNS is the external system here: its answers are
replaced at ``socket.getaddrinfo`` (the seam) so a test can rebind a name between the check and
the connection; the PostgreSQL servers and the listener that must receive nothing are real.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
from collections.abc import Iterator
from typing import Any

import psycopg
import pytest

from duckgres_admin.lib import pgadmin
from reshard.engines import identity
from reshard.engines.clients import BackupSource, source_conninfo
from tests.fixtures.stores import StoreClusters

pytestmark = pytest.mark.safeguard("reshard-80")

REAL_GETADDRINFO = socket.getaddrinfo


class Dns:
    """Answers for made-up names; every other name goes to the real resolver."""

    def __init__(self) -> None:
        self.answers: dict[str, list[str]] = {}
        self.asked: list[str] = []

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> list[Any]:
        if isinstance(host, str) and host in self.answers:
            self.asked.append(host)
            return [
                (socket.AF_INET, socket.SOCK_STREAM, 6, "", (address, int(port or 0)))
                for address in self.answers[host]
            ]
        return REAL_GETADDRINFO(host, port, *args, **kwargs)


@pytest.fixture
def dns(monkeypatch: pytest.MonkeyPatch) -> Dns:
    fake = Dns()
    monkeypatch.setattr(socket, "getaddrinfo", fake)
    return fake


@pytest.fixture
def trap() -> Iterator[tuple[int, list[str]]]:
    """A real listener on 127.0.0.2 that records every connection it gets."""
    server = socket.create_server(("127.0.0.2", 0))
    server.settimeout(0.2)
    accepted: list[str] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, peer = server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            accepted.append(str(peer))
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield server.getsockname()[1], accepted
    finally:
        stop.set()
        thread.join(2)
        server.close()


@pytest.fixture
def deny_trap(settings: Any) -> None:
    settings.DUCKGRES_STORE_HOST_DENYLIST = (
        *settings.DUCKGRES_STORE_HOST_DENYLIST,
        ipaddress.ip_network("127.0.0.2/32"),
    )


def test_a_name_rebound_to_a_denied_address_after_the_check_gets_no_connection(
    dns: Dns, trap: tuple[int, list[str]], deny_trap: None
) -> None:
    port, accepted = trap
    dns.answers["store.rebind.test"] = ["127.0.0.1"]
    assert identity.host_refusal("host", "store.rebind.test") is None  # the check passes
    dns.answers["store.rebind.test"] = ["127.0.0.2"]  # ... then the name is rebound
    denied = r"resolves to 127\.0\.0\.2, in the denied"
    with pytest.raises(pgadmin.DeniedStoreAddress, match=denied):
        pgadmin.connect(
            pgadmin.Endpoint("store.rebind.test", port, "require"),
            dbname="postgres",
            user="provisioner",
            password="never-sent-anywhere",
        )
    assert accepted == []  # nothing reached the denied address
    with pytest.raises(pgadmin.DeniedStoreAddress):
        source_conninfo(
            BackupSource("store.rebind.test", port, "postgres", "provisioner", "require", "x"),
            require_auth=True,
        )
    assert accepted == []


def test_a_denied_literal_address_is_refused_before_any_packet(
    trap: tuple[int, list[str]], deny_trap: None
) -> None:
    port, accepted = trap
    with pytest.raises(pgadmin.DeniedStoreAddress, match=r"127\.0\.0\.2 is in the denied network"):
        pgadmin.connect(
            pgadmin.Endpoint("127.0.0.2", port, "require"),
            dbname="postgres",
            user="provisioner",
            password="never-sent-anywhere",
        )
    assert accepted == []


def test_the_session_goes_to_the_checked_address_and_tls_keeps_the_name(
    dns: Dns, store_clusters: StoreClusters
) -> None:
    cluster = store_clusters.source
    # A name no real resolver knows: the connection can only work through the pinned address.
    dns.answers["store.pinned.test"] = ["127.0.0.1"]
    params = pgadmin.pinned_host("store.pinned.test", cluster.port)
    assert params == {"host": "store.pinned.test", "hostaddr": "127.0.0.1"}
    with pgadmin.connect(
        pgadmin.Endpoint("store.pinned.test", cluster.port, "require"),
        dbname="postgres",
        user=cluster.provisioner_user,
        password=cluster.provisioner_password,
    ) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
        assert conn.info.hostaddr == "127.0.0.1"
        assert conn.info.host == "store.pinned.test"
    # verify-full checks the certificate against the NAME (the test CA signs 127.0.0.1 and
    # localhost only), so a pinned address never weakens TLS.
    with pytest.raises(psycopg.OperationalError, match=r"does not match|certificate"):
        pgadmin.connect(
            pgadmin.Endpoint("store.pinned.test", cluster.port, "verify-full"),
            dbname="postgres",
            user=cluster.provisioner_user,
            password=cluster.provisioner_password,
        ).close()
    # Every address of a name is pinned, in order (libpq tries them in turn).
    dns.answers["store.multi.test"] = ["127.0.0.3", "127.0.0.1"]
    assert pgadmin.pinned_host("store.multi.test", cluster.port) == {
        "host": "store.multi.test,store.multi.test",
        "hostaddr": "127.0.0.3,127.0.0.1",
    }
    conninfo = source_conninfo(
        BackupSource("store.pinned.test", cluster.port, "postgres", "u", "require", "x"),
        require_auth=True,
    )
    assert "hostaddr=127.0.0.1" in conninfo
