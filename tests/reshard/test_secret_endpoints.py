"""A secret reference's password goes only to the endpoints it is bound to (safeguard
reshard-124; ``DUCKGRES_SECRET_REF_ENDPOINTS``), against the real store clusters.

``secretrefs.resolve`` remembers which references produced a value; every connection seam checks
the password against the bindings of those references before a packet is sent: the product's
own connections (``lib.pgadmin.connect``: the API's probes and the runner's sessions) and the
``pg_dump``/``pg_restore`` conninfo. A listener standing in for the wrong server counts that
nothing ever connects to it.
"""

from __future__ import annotations

from typing import Any

import pytest

from duckgres_admin.base.scrub import Scrubber
from duckgres_admin.lib import pgadmin, secretrefs
from reshard.engines.clients import BackupSource, source_conninfo
from reshard.runner import connections
from reshard.runner.context import RunContext
from tests.fixtures.rows import new_store, unique
from tests.fixtures.settings_probe import start as start_process
from tests.fixtures.store_tls import PgWireStub
from tests.fixtures.stores import PROVISIONER_PASSWORD_VAR, StoreClusters

pytestmark = pytest.mark.safeguard("reshard-124")

REF = f"env:{PROVISIONER_PASSWORD_VAR}"


def _bind(settings: Any, raw: str) -> None:
    bindings, problems = secretrefs.parse_endpoint_bindings("DUCKGRES_SECRET_REF_ENDPOINTS", raw)
    assert problems == []
    settings.DUCKGRES_SECRET_REF_ENDPOINTS = bindings


def _provisioner(clusters: StoreClusters, port: int, password: str) -> Any:
    cluster = clusters.source
    return pgadmin.connect(
        pgadmin.Endpoint(cluster.host, port, cluster.sslmode),
        dbname="postgres", user=cluster.provisioner_user, password=password,
    )  # fmt: skip


def test_a_resolved_password_goes_only_where_its_reference_is_bound(
    store_clusters: StoreClusters, settings: Any
) -> None:
    _bind(settings, f"{REF}=127.0.0.1:{store_clusters.source.port}")
    password = secretrefs.resolve(REF)
    with _provisioner(store_clusters, store_clusters.source.port, password) as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)
    # Another real server with the same login: refused before connecting, naming the binding.
    with PgWireStub() as other:
        for port in (store_clusters.target.port, other.port):
            with pytest.raises(pgadmin.SecretNotBoundHere) as info:
                _provisioner(store_clusters, port, password)
            assert str(info.value) == (
                f"secret {REF} may not be sent to 127.0.0.1:{port}: "
                f"DUCKGRES_SECRET_REF_ENDPOINTS binds it to 127.0.0.1:{store_clusters.source.port}"
                "; use the password of that server, or have an operator add "
                f"127.0.0.1:{port} to the reference's entry"
            )
            assert password not in str(info.value)
        assert other.connections == 0


def test_a_reference_no_entry_names_goes_nowhere_and_unset_means_unbound(
    store_clusters: StoreClusters, settings: Any
) -> None:
    password = secretrefs.resolve(REF)
    settings.DUCKGRES_SECRET_REF_ENDPOINTS = ()  # unset: the behaviour before the setting
    with _provisioner(store_clusters, store_clusters.source.port, password):
        pass
    _bind(settings, "env:SOME_OTHER_REF=127.0.0.1:*")
    with pytest.raises(pgadmin.SecretNotBoundHere, match="no endpoint \\(no entry names it\\)"):
        _provisioner(store_clusters, store_clusters.source.port, password)
    # A password no reference produced (e.g. typed by a caller and checked by the API against
    # its reference) is not a reference's to bind: only resolved values are tracked.
    cluster = store_clusters.source
    assert secretrefs.origins("not-a-resolved-value") == ()
    secretrefs.check_endpoint("not-a-resolved-value", cluster.host, cluster.port)


def test_patterns_prefixes_and_any_of_the_references_of_a_value(
    store_clusters: StoreClusters, settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    port = store_clusters.source.port
    # The same password behind a second reference that is bound there: allowed through it.
    monkeypatch.setenv("DUCKGRES_TEST_SECRET_SAME", secretrefs.resolve(REF))
    _bind(
        settings, f"{REF}=db.example:5432;env:DUCKGRES_TEST_SECRET_*=localhost:*,127.0.0.1:{port}"
    )
    password = secretrefs.resolve("env:DUCKGRES_TEST_SECRET_SAME")
    with _provisioner(store_clusters, port, password):
        pass
    assert secretrefs.origins(password)[-1] == secretrefs.parse("env:DUCKGRES_TEST_SECRET_SAME")
    with pytest.raises(pgadmin.SecretNotBoundHere):
        _provisioner(store_clusters, store_clusters.target.port, password)


def test_pg_dump_and_pg_restore_never_get_a_conninfo_for_an_unbound_endpoint(
    store_clusters: StoreClusters, settings: Any
) -> None:
    """The pg_dump/pg_restore conninfo (one function for both) checks before the child runs."""
    _bind(settings, f"{REF}=127.0.0.1:{store_clusters.source.port}")
    password = secretrefs.resolve(REF)
    ok = BackupSource("127.0.0.1", store_clusters.source.port, "d", "provisioner", "", password)
    assert "port=5433" in source_conninfo(ok, require_auth=True)
    bad = BackupSource("127.0.0.1", store_clusters.target.port, "d", "provisioner", "", password)
    with pytest.raises(
        pgadmin.SecretNotBoundHere, match=f"may not be sent to 127.0.0.1:{bad.port}"
    ):
        source_conninfo(bad, require_auth=True)


def test_the_runner_resolves_and_is_refused_the_same_way(
    store_clusters: StoreClusters, settings: Any, db: None
) -> None:
    """A store row whose host was changed to another server keeps its reference: the runner's
    provisioner session (resolve in the runner, connect through the seam) is refused there."""
    _bind(settings, f"{REF}=127.0.0.1:{store_clusters.source.port}")
    with PgWireStub() as impostor:
        store = new_store(store_clusters.source, name=unique("moved"), port=impostor.port)
        ctx = RunContext(op_id=1, runner_id="secret-endpoints", scrubber=Scrubber())
        prov = connections.provisioner(ctx, store.name)
        with (
            pytest.raises(pgadmin.SecretNotBoundHere),
            connections.provisioner_conn(ctx, prov),
        ):
            pass
        assert impostor.connections == 0


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ("env:X", "'env:X' binds no endpoint"),
        ("env:X=*:5432", "a bare * host would name every server"),
        ("env:X=db:99999", "port 99999 is out of range"),
        ("env:*=db:5432", "'env:*' would bind every variable"),
        ("k8s:ns/a=db", "'db' is not an endpoint"),
        ("env:X=db:5432;;", "an entry is empty"),
    ],
)
def test_a_malformed_binding_stops_the_process(raw: str, message: str) -> None:
    assert any(message in p for p in secretrefs.parse_endpoint_bindings("V", raw)[1])
    result = start_process({"DUCKGRES_SECRET_REF_ENDPOINTS": raw})
    assert result.returncode != 0
    assert "DUCKGRES_SECRET_REF_ENDPOINTS" in result.stderr
    assert message in result.stderr
