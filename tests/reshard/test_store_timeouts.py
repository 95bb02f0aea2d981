"""A hostile store cannot hold a caller for ever (safeguard reshard-127).

Real sockets on 127.0.0.1: a server that accepts and never answers, one that answers the
startup (the SSLRequest's ``S``) and then stalls in the TLS handshake, and a relay in front of
the real PostgreSQL that stops forwarding the server's answers once the session is up. Each
bound is asserted as wall time.
"""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator

import psycopg
import pytest
from psycopg.conninfo import conninfo_to_dict

from duckgres_admin.lib import pgadmin
from reshard.engines.clients import BackupSource, source_conninfo
from tests.fixtures.stores import StoreClusters

pytestmark = pytest.mark.safeguard("reshard-127")


class Hostile:
    """A listener whose accepted connections are held open; ``answer`` is sent to each first
    (after the client's first packet) and then nothing ever again."""

    def __init__(self, answer: bytes = b"") -> None:
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.answer = answer
        self.held: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.getsockname()[1])

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.held.append(conn)
            if self.answer:
                conn.settimeout(5)
                try:
                    conn.recv(8)  # the SSLRequest
                    conn.sendall(self.answer)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        for conn in self.held:
            conn.close()
        self.server.close()


class Relay:
    """Forwards bytes to ``upstream`` both ways until ``stall`` is set; from then on the
    server's answers are held back (the client's bytes still go through)."""

    def __init__(self, upstream_port: int) -> None:
        self.upstream_port = upstream_port
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.stall = threading.Event()
        self.stop = threading.Event()
        self.sockets: list[socket.socket] = []
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    @property
    def port(self) -> int:
        return int(self.server.getsockname()[1])

    def serve(self) -> None:
        while not self.stop.is_set():
            try:
                client, _ = self.server.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            upstream = socket.create_connection(("127.0.0.1", self.upstream_port))
            self.sockets += [client, upstream]
            threading.Thread(target=self.pump, args=(client, upstream), daemon=True).start()

    def pump(self, client: socket.socket, upstream: socket.socket) -> None:
        while not self.stop.is_set():
            ready, _, _ = select.select([client, upstream], [], [], 0.1)
            for sock in ready:
                if sock is upstream and self.stall.is_set():
                    continue
                try:
                    data = sock.recv(65536)
                except OSError:
                    return
                if not data:
                    return
                (upstream if sock is client else client).sendall(data)
            if self.stall.is_set():
                time.sleep(0.05)

    def close(self) -> None:
        self.stop.set()
        self.thread.join(2)
        for sock in self.sockets:
            sock.close()
        self.server.close()


@pytest.fixture
def silent() -> Iterator[Hostile]:
    server = Hostile()
    yield server
    server.close()


@pytest.fixture
def ssl_then_stall() -> Iterator[Hostile]:
    server = Hostile(answer=b"S")
    yield server
    server.close()


def test_every_connection_sets_keepalives_and_tcp_user_timeout(
    store_clusters: StoreClusters,
) -> None:
    cluster = store_clusters.source
    with pgadmin.connect(
        pgadmin.Endpoint("127.0.0.1", cluster.port, "require"),
        dbname="postgres",
        user=cluster.provisioner_user,
        password=cluster.provisioner_password,
    ) as conn:
        dsn = conn.info.dsn
    assert "keepalives=1" in dsn, dsn
    assert "keepalives_idle=30" in dsn
    assert "keepalives_interval=10" in dsn
    assert "keepalives_count=3" in dsn
    assert "tcp_user_timeout=60000" in dsn
    assert "connect_timeout=10" in dsn


def test_pg_dump_and_pg_restore_connections_set_them_too(store_clusters: StoreClusters) -> None:
    """The conninfo both client programs get (backup, restore, restore test) carries the same
    dead-peer detection as the product's own connections (issue 25 item 8)."""
    cluster = store_clusters.source
    conninfo = conninfo_to_dict(
        source_conninfo(
            BackupSource("127.0.0.1", cluster.port, "postgres", "provisioner", "require", "x"),
            require_auth=True,
        )
    )
    assert {k: conninfo.get(k) for k in pgadmin.socket_params()} == {
        "keepalives": "1",
        "keepalives_idle": "30",
        "keepalives_interval": "10",
        "keepalives_count": "3",
        "tcp_user_timeout": "60000",
    }, conninfo


@pytest.mark.parametrize("server", ["silent", "ssl_then_stall"])
def test_a_probe_of_a_server_that_never_answers_gives_up_within_its_bound(
    server: str, request: pytest.FixtureRequest
) -> None:
    hostile: Hostile = request.getfixturevalue(server)
    started = time.monotonic()
    with pytest.raises(psycopg.OperationalError):
        pgadmin.probe(
            pgadmin.Endpoint("127.0.0.1", hostile.port, "require"),
            dbname="postgres",
            user="u",
            password=None,
            connect_timeout=2,
        )
    elapsed = time.monotonic() - started
    assert 1.5 <= elapsed < 6, elapsed
    assert hostile.held, "the hostile server was reached"


def test_a_server_that_stalls_after_the_login_releases_the_probe_query(
    store_clusters: StoreClusters,
) -> None:
    cluster = store_clusters.source
    relay = Relay(cluster.port)
    try:
        conn = pgadmin.connect(
            pgadmin.Endpoint("127.0.0.1", relay.port, "require"),
            dbname="postgres",
            user=cluster.provisioner_user,
            password=cluster.provisioner_password,
        )
        with conn:
            assert conn.execute("SELECT 1").fetchone() == (1,)  # the relay works
            relay.stall.set()
            started = time.monotonic()
            with pytest.raises(psycopg.OperationalError), pgadmin.socket_deadline(conn, 1.5):
                conn.execute("SELECT pg_catalog.pg_sleep(0)")
            elapsed = time.monotonic() - started
        assert 1.2 <= elapsed < 5, elapsed
    finally:
        relay.close()


def test_socket_deadline_leaves_a_connection_that_finished_in_time_alone(
    store_clusters: StoreClusters,
) -> None:
    cluster = store_clusters.source
    with pgadmin.connect(
        pgadmin.Endpoint("127.0.0.1", cluster.port, "require"),
        dbname="postgres",
        user=cluster.provisioner_user,
        password=cluster.provisioner_password,
    ) as conn:
        with pgadmin.socket_deadline(conn, 0.5):
            conn.execute("SELECT 1")
        time.sleep(0.8)  # past the deadline: the timer was cancelled
        assert conn.execute("SELECT 2").fetchone() == (2,)
