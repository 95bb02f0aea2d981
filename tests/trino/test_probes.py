"""Candidate validation and coordinator probes (spec trino-pools §4.12; safeguards 9 and 37).

A stand-in coordinator (``tests/trino/coordinator_double.py``) answers over real HTTP; the
instance's Service host reaches it through ``probes.CONNECT_OVERRIDES`` (the test DNS seam).
Tests other than safeguard 9 pass a fixed observer credential through ``Validator(credentials=)``
(the Kubernetes seam); safeguard 9 reads the real Secrets from the test kube-apiserver.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

import pytest

from duckgres_admin.lib import http
from tests.trino.coordinator_double import CoordinatorDouble, coordinator  # noqa: F401
from trino_pools import probes
from trino_pools.probes import (
    RESTARTED,
    ProbeError,
    ValidationContext,
    ValidationResult,
    Validator,
    auth_fingerprint,
    certificate_hash,
    check_target,
    origin_of,
    read_process_id,
)

CRED = ("observer-a", "pw-a-7f3e9c")
INSTANCE = "cell-1a2b3c4d"
NAMESPACE = "trino-a"
CHECKS = ["image", "workers", "catalog-revision", "operational-connection"]


def fixed(_namespace: str) -> tuple[str, str]:
    return CRED


def make_ctx(double: CoordinatorDouble, endpoint: str, **overrides: Any) -> ValidationContext:
    values: dict[str, Any] = {
        "instance_id": INSTANCE,
        "endpoint_url": endpoint,
        "namespace": NAMESPACE,
        "image": "trinodb/trino:476",
        "worker_image": "trinodb/trino:476",
        "ready_workers": double.workers,
        "publication_revision": 5,
        "registered_process_id": double.process_id,
        "pod_uid": "5f0e6c1a-0000-4000-8000-000000000001",
        "config_revision": "rel-2026.08.1",
        "running_image": "docker.io/trinodb/trino:476",
    }
    values.update(overrides)
    return ValidationContext(**values)


def run_pass(validator: Validator, ctx: ValidationContext, steps: int = 30) -> ValidationResult:
    for _ in range(steps):
        result = validator.step(ctx)
        assert result.requests <= 2
        if result.done or result.error:
            return result
    raise AssertionError("validation did not finish")


@pytest.fixture
def endpoint(coordinator: CoordinatorDouble) -> str:  # noqa: F811
    coordinator.expected_credential = CRED
    return coordinator.host_alias(INSTANCE, NAMESPACE, 8080)


@pytest.fixture
def foreign() -> Any:
    """A second stand-in on another host: it must never see a request (nor a credential)."""
    with CoordinatorDouble() as double:
        url = double.host_alias("evil", NAMESPACE, 8080)
        yield double, url


# --- a complete pass ---------------------------------------------------------------------


def test_a_pass_spans_several_steps_and_produces_the_receipt(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    coordinator.workers = 3  # 4 node rows, 2 per page: POST + 2 pages
    validator = Validator(credentials=fixed)
    ctx = make_ctx(coordinator, endpoint)
    results = []
    for _ in range(10):
        before = len(coordinator.requests)
        result = validator.step(ctx)
        assert len(coordinator.requests) - before == result.requests <= 2
        results.append(result)
        if result.done or result.error:
            break
    assert [r.done for r in results] == [False, False, True]
    assert results[-1].error == ""
    assert coordinator.paths()[:3] == ["/v1/info", "/v1/catalog/sync", "/v1/statement"]
    assert coordinator.paths()[-1] == "/v1/info"
    assert len(coordinator.requests) == 6
    assert validator.in_progress(INSTANCE) == 0

    # Continuations reported as https:443 (forwarded) were brought back onto the Service.
    for rec in coordinator.requests:
        assert rec.credential == CRED
        assert rec.headers["x-trino-user"] == CRED[0]
        assert rec.headers["x-trino-source"] == "rollout-readiness"
        assert rec.headers["content-type"] == "text/plain"
        assert rec.headers["x-forwarded-proto"] == "https"
        assert rec.headers["x-forwarded-port"] == "443"
        assert rec.headers["host"] == f"{INSTANCE}.{NAMESPACE}.svc.cluster.local:8080"
    assert coordinator.requests[2].body == probes.NODES_SQL

    done = results[-1]
    fingerprint = hashlib.sha256(b"none").hexdigest()
    expected_hash = hashlib.sha256(
        "\0".join(
            [
                coordinator.node_id,
                coordinator.process_id,
                coordinator.coordinator_id,
                "7",
                fingerprint,
                "3",
                ",".join(CHECKS),
            ]
        ).encode()
    ).hexdigest()
    assert done.receipt == {
        "certificateHash": expected_hash,
        "configRevision": "rel-2026.08.1",
        "authRevision": "",
        "podUid": "5f0e6c1a-0000-4000-8000-000000000001",
        "bootId": coordinator.process_id,
        "nodeId": coordinator.node_id,
        "coordinatorId": coordinator.coordinator_id,
        "readyWorkers": 3,
        "checks": CHECKS,
    }
    assert (done.node_id, done.coordinator_id, done.process_id, done.applied_revision) == (
        coordinator.node_id,
        coordinator.coordinator_id,
        coordinator.process_id,
        7,
    )


def test_a_coordinator_restart_between_two_steps_fails_the_pass(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    validator = Validator(credentials=fixed)
    ctx = make_ctx(coordinator, endpoint)
    first = validator.step(ctx)
    assert (first.done, first.error, first.requests) == (False, "", 2)
    coordinator.restart()
    second = run_pass(validator, ctx)
    assert second.error.startswith(RESTARTED)
    assert second.fatal
    assert not second.done
    assert second.receipt is None
    assert validator.in_progress(INSTANCE) == 0


def test_a_process_id_changed_since_registration_fails(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    validator = Validator(credentials=fixed)
    result = run_pass(validator, make_ctx(coordinator, endpoint, registered_process_id="0ld"))
    assert (result.error, result.fatal) == (RESTARTED, True)


def test_a_restart_after_the_statement_is_caught_by_the_second_info(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    coordinator.workers = 1  # POST + one page: the statement ends in step 2
    validator = Validator(credentials=fixed)
    ctx = make_ctx(coordinator, endpoint)
    assert validator.step(ctx).requests == 2  # info, sync
    assert validator.step(ctx).requests == 2  # POST, page 1 (last)
    assert validator.in_progress(INSTANCE) == 5
    coordinator.restart()
    result = validator.step(ctx)
    assert result.fatal
    assert result.error.startswith(RESTARTED)


def test_a_delayed_coordinator_still_validates_over_several_bounded_steps(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    # The probe half of the 9 s coordinator scenario: every step stays within ~20 s.
    coordinator.workers = 1
    coordinator.delay = 9.0
    validator = Validator(credentials=fixed)
    ctx = make_ctx(coordinator, endpoint)
    for _ in range(5):
        started = time.monotonic()
        result = validator.step(ctx)
        assert time.monotonic() - started < 21
        assert result.error == ""
        if result.done:
            break
    assert result.done
    assert result.receipt is not None
    assert result.receipt["bootId"] == coordinator.process_id


def test_a_pass_older_than_its_budget_is_discarded(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    now = [1000.0]
    validator = Validator(credentials=fixed, pass_budget=300, clock=lambda: now[0])
    ctx = make_ctx(coordinator, endpoint)
    validator.step(ctx)
    assert validator.in_progress(INSTANCE) == 4
    now[0] += 301
    validator.step(ctx)  # a new pass: starts again at /v1/info
    assert coordinator.paths() == ["/v1/info", "/v1/catalog/sync"] * 2
    result = validator.step(ctx)
    assert not result.done  # POST + page; the new pass is alive
    now[0] += 299  # still within the new pass's budget
    assert run_pass(validator, ctx).done


def test_forget_and_clear_drop_the_pass(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    validator = Validator(credentials=fixed)
    ctx = make_ctx(coordinator, endpoint)
    validator.step(ctx)
    validator.forget(INSTANCE)
    assert validator.in_progress(INSTANCE) == 0
    validator.step(ctx)
    validator.clear()
    validator.step(ctx)
    assert coordinator.paths() == ["/v1/info", "/v1/catalog/sync"] * 3


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"starting": True}, "still starting"),
        ({"is_coordinator": False}, "not a coordinator"),
        ({"coordinator_id": "abc"}, "5 alphanumerics"),
        ({"sync_ready": False}, "not ready"),
        ({"sync_enabled": False}, "not enabled"),
        ({"failed_catalogs": 1}, "failedCatalogs"),
        ({"applied_revision": None}, "appliedRevision is missing"),
        ({"applied_revision": 4}, "behind the pool's publication revision 5"),
        ({"worker_state": "shutting_down"}, "not active"),
        ({"workers": 0}, "workers check"),
    ],
)
def test_an_unready_coordinator_fails_the_pass_without_failing_the_candidate(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
    change: dict[str, Any],
    reason: str,
) -> None:
    ctx = make_ctx(coordinator, endpoint, ready_workers=max(coordinator.workers, 1))
    for key, value in change.items():
        setattr(coordinator, key, value)
    result = run_pass(Validator(credentials=fixed), ctx)
    assert reason in result.error
    assert not result.fatal
    assert not result.done


def test_kubernetes_and_trino_must_agree_on_the_worker_count(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    result = run_pass(
        Validator(credentials=fixed), make_ctx(coordinator, endpoint, ready_workers=3)
    )
    assert "Trino reports 2 active workers, Kubernetes 3 ready" in result.error


@pytest.mark.parametrize(
    ("overrides", "reason"),
    [
        ({"running_image": ""}, "not known"),
        ({"running_image": "trinodb/trino:475"}, "the blueprint pins"),
        ({"running_worker_images": ("trinodb/trino:475",)}, "a worker runs"),
    ],
)
def test_the_image_check_needs_the_blueprint_image(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
    overrides: dict[str, Any],
    reason: str,
) -> None:
    result = Validator(credentials=fixed).step(make_ctx(coordinator, endpoint, **overrides))
    assert reason in result.error
    assert result.requests == 0
    assert coordinator.requests == []


def test_read_process_id_reads_only_the_catalog_sync_process_id(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    assert read_process_id(endpoint, NAMESPACE, credentials=fixed) == coordinator.process_id
    assert coordinator.paths() == ["/v1/catalog/sync"]


# --- safeguard 37: every hostile answer is rejected; the credential stays home -------------


@pytest.mark.safeguard("trino-37")
def test_a_foreign_next_uri_is_refused_and_never_receives_the_credential(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
    foreign: Any,
) -> None:
    other, other_url = foreign
    coordinator.foreign_next_uri = f"{other_url}/v1/statement/executing/q/y0/1"
    coordinator.fail("/v1/statement", "foreign-next")
    result = run_pass(Validator(credentials=fixed), make_ctx(coordinator, endpoint))
    assert "continuation nextUri refused" in result.error
    assert "evil." in result.error
    assert other.requests == []  # reachable through the seam, yet never contacted
    assert CRED[1] not in result.error


@pytest.mark.safeguard("trino-37")
@pytest.mark.parametrize(
    "next_uri",
    [
        "http://{host}:9090/v1/statement/executing/q/y0/1",  # same host, other port
        "https://{host}:8443/v1/statement/executing/q/y0/1",  # https, not 443
        "http://{host}:8080/v1/statement-unrelated/q",  # adjacent path
        "http://{host}:8080/v1/statement/../../v1/node",  # traversal out of the prefix
        "http://{host}:8080/v1/statement/executing/q?x=1",  # a query
        "http://user:pw@{host}:8080/v1/statement/executing/q",  # userinfo
        "https://{host}/v1/info",  # forwarded rewrite is only for statement continuations
    ],
)
def test_a_continuation_off_the_endpoint_is_refused_before_sending(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
    next_uri: str,
) -> None:
    host = f"{INSTANCE}.{NAMESPACE}.svc.cluster.local"
    coordinator.foreign_next_uri = next_uri.format(host=host)
    coordinator.fail("/v1/statement", "foreign-next")
    result = run_pass(Validator(credentials=fixed), make_ctx(coordinator, endpoint))
    assert "continuation nextUri refused" in result.error
    assert coordinator.paths() == ["/v1/info", "/v1/catalog/sync", "/v1/statement"]


@pytest.mark.safeguard("trino-37")
def test_a_redirect_is_never_followed(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
    foreign: Any,
) -> None:
    other, other_url = foreign
    coordinator.foreign_next_uri = f"{other_url}/v1/info"
    coordinator.fail("/v1/info", "redirect")
    result = run_pass(Validator(credentials=fixed), make_ctx(coordinator, endpoint))
    assert result.error == "GET /v1/info answered HTTP 302"
    assert other.requests == []
    coordinator.fail("/v1/catalog/sync", "redirect")
    with pytest.raises(ProbeError, match=r"HTTP 302$"):
        read_process_id(endpoint, NAMESPACE, credentials=fixed)
    assert other.requests == []


@pytest.mark.safeguard("trino-37")
@pytest.mark.parametrize(
    ("path", "fault", "message"),
    [
        ("/v1/info", "401", "GET /v1/info answered HTTP 401"),
        ("/v1/catalog/sync", "500", "GET /v1/catalog/sync answered HTTP 500"),
        ("/v1/catalog/sync", "bad-json", "GET /v1/catalog/sync: the answer is not valid JSON"),
        ("/v1/info", "oversize", "GET /v1/info: the answer exceeds 1048576 bytes"),
        (
            "/v1/statement",
            "sql-error",
            "POST /v1/statement: the coordinator reported an error (PERMISSION_DENIED)",
        ),
        (
            "/v1/statement/",
            "sql-error",
            "GET /v1/statement/executing/",
        ),
        ("/v1/statement/", "bad-json", "the answer is not valid JSON"),
    ],
)
def test_a_hostile_answer_fails_without_echoing_its_body(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
    path: str,
    fault: str,
    message: str,
) -> None:
    coordinator.fail(path, fault)
    result = run_pass(Validator(credentials=fixed), make_ctx(coordinator, endpoint))
    assert message in result.error
    assert not result.done
    assert not result.fatal
    for body_text in ("body", "unauthorized", "Access Denied", "xxxx"):
        assert body_text not in result.error


@pytest.mark.safeguard("trino-37")
def test_a_wrong_credential_is_a_401_failure(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    result = run_pass(
        Validator(credentials=lambda _ns: ("observer-a", "stale")),
        make_ctx(coordinator, endpoint),
    )
    assert result.error == "GET /v1/info answered HTTP 401"
    assert "stale" not in result.error


@pytest.mark.safeguard("trino-37")
def test_a_statement_is_bounded_in_pages_and_rows(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    coordinator.workers = 40
    coordinator.rows_per_page = 1
    result = run_pass(Validator(credentials=fixed), make_ctx(coordinator, endpoint), steps=40)
    assert result.error == "statement: more than 32 pages"
    assert coordinator.paths().count("/v1/statement") == 1
    assert len(coordinator.requests) == 2 + 32 + 1  # the 33rd page is read, then refused

    coordinator.requests.clear()
    coordinator.workers = 4100
    coordinator.rows_per_page = 4101
    result = run_pass(Validator(credentials=fixed), make_ctx(coordinator, endpoint))
    assert result.error == "statement: more than 4096 rows"


@pytest.mark.parametrize(
    "endpoint_url",
    [
        "http://trino.example.com:8080",  # plain HTTP outside the cluster
        "ftp://x.ns.svc.cluster.local",
        "https://user:pw@x.example.com",
        "https://x.example.com/?a=1",
        "https://x.example.com/#f",
        "https://x.example.com/v1",
    ],
)
def test_an_unusable_endpoint_is_refused(endpoint_url: str) -> None:
    with pytest.raises(ProbeError):
        origin_of(endpoint_url)


def test_path_and_origin_rules() -> None:
    internal = origin_of("http://Cell-1.ns.svc.cluster.local:8080")
    assert internal.internal
    assert internal.host == "cell-1.ns.svc.cluster.local"
    base = "http://CELL-1.ns.svc.cluster.local:8080"
    for path in ("/v1/statement", "/v1/statement/queued/q/1", "/v1/info", "/v1/catalog/sync"):
        assert check_target(internal, base + path) == internal.url(path)
    for path in ("/v1/statement-unrelated", "/v1/infox", "/v1/info/", "/v1/node", "/"):
        with pytest.raises(ProbeError, match="is not a probe path"):
            check_target(internal, base + path)
    with pytest.raises(ProbeError, match="is not a probe path"):
        check_target(internal, base + "/v1/statement/%2e%2e/x")
    rewritten = check_target(
        internal,
        "https://cell-1.ns.svc.cluster.local/v1/statement/executing/q/y/1",
        continuation=True,
    )
    assert rewritten == "http://cell-1.ns.svc.cluster.local:8080/v1/statement/executing/q/y/1"
    with pytest.raises(ProbeError):  # not a continuation: no rewrite
        check_target(internal, "https://cell-1.ns.svc.cluster.local/v1/statement/executing/q")
    external = origin_of("https://pool.example.com")
    assert not external.internal
    assert external.port == 443
    with pytest.raises(ProbeError, match="not the endpoint's origin"):
        check_target(external, "http://pool.example.com:443/v1/info")
    assert check_target(external, "https://POOL.example.com:443/v1/info", continuation=True)


# --- receipt formulas ---------------------------------------------------------------------


def test_the_auth_fingerprint_formula() -> None:
    assert auth_fingerprint([]) == hashlib.sha256(b"none").hexdigest()
    components = [
        {"kind": "password-authenticator", "name": "file", "revision": "r2", "error": ""},
        {"kind": "group-provider", "name": "file", "revision": "", "error": "not loaded"},
    ]
    expected = hashlib.sha256(
        b"group-provider\0file\0\0not loaded\x1epassword-authenticator\0file\0r2\0"
    ).hexdigest()
    assert auth_fingerprint(components) == expected
    assert auth_fingerprint(list(reversed(components))) == expected


def test_the_certificate_hash_formula() -> None:
    value = certificate_hash(
        node_id="n1",
        process_id="p1",
        coordinator_id="k3x9q",
        applied_revision=118,
        auth_fingerprint="f" * 64,
        ready_workers=4,
        checks=CHECKS,
    )
    raw = (
        "n1\x00p1\x00k3x9q\x00118\x00"
        + "f" * 64
        + "\x004\x00image,workers,catalog-revision,operational-connection"
    )
    assert value == hashlib.sha256(raw.encode()).hexdigest()


def test_security_components_enter_the_receipt_but_auth_revision_is_never_claimed(
    coordinator: CoordinatorDouble,  # noqa: F811
    endpoint: str,
) -> None:
    components = [
        {"kind": "system-access-control", "name": "duckgres", "revision": "a1", "error": ""},
        {"kind": "password-authenticator", "name": "duckgres", "revision": "", "error": "stale"},
    ]
    coordinator.security_revisions = components
    result = run_pass(Validator(credentials=fixed), make_ctx(coordinator, endpoint))
    assert result.done
    assert result.receipt is not None
    assert result.receipt["checks"] == CHECKS
    assert result.receipt["certificateHash"] == certificate_hash(
        node_id=coordinator.node_id,
        process_id=coordinator.process_id,
        coordinator_id=coordinator.coordinator_id,
        applied_revision=7,
        auth_fingerprint=auth_fingerprint(components),
        ready_workers=2,
        checks=CHECKS,
    )
    assert probes.claimed_checks(components, {}) == CHECKS
    full = [
        {"kind": k, "name": "duckgres", "revision": "a1", "error": ""}
        for k in probes.SECURITY_KINDS
    ]
    expected = dict.fromkeys(probes.SECURITY_KINDS, "a1")
    assert probes.claimed_checks(full, expected) == [*CHECKS, "auth-revision"]
    assert probes.claimed_checks(full, {**expected, "group-provider": "a2"}) == CHECKS


# --- the HTTP seam ---------------------------------------------------------------------------


def test_the_http_seam_keeps_the_host_and_returns_redirects(
    coordinator: CoordinatorDouble,  # noqa: F811
) -> None:
    coordinator.fail("/v1/info", "redirect")
    response = http.request(
        "GET",
        "http://some.service.example:1234/v1/info",
        headers={},
        body=None,
        timeout=5,
        connect_to=("127.0.0.1", coordinator.port),
    )
    assert response.status == 302
    assert response.headers["location"] == "http://elsewhere.example.com/v1/info"
    assert coordinator.requests[0].headers["host"] == "some.service.example:1234"
    assert len(coordinator.requests) == 1


def test_the_http_seam_budget_covers_the_whole_request(
    coordinator: CoordinatorDouble,  # noqa: F811
) -> None:
    coordinator.delay = 3
    started = time.monotonic()
    with pytest.raises(http.HttpTransportError):
        http.request(
            "GET",
            f"http://127.0.0.1:{coordinator.port}/v1/info",
            headers={},
            body=None,
            timeout=1,
        )
    assert time.monotonic() - started < 2.5


# --- safeguard 9: each pool's own observer Secret -------------------------------------------


@pytest.fixture
def kube_seam(kube_api: Any, settings: Any) -> Any:
    from duckgres_admin.lib import k8s

    for key, value in kube_api.settings_overrides().items():
        setattr(settings, key, value)
    k8s.api_client.cache_clear()
    from kubernetes import client

    extra = f"t-{secrets.token_hex(5)}"
    kube_api.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=extra)))
    yield kube_api, extra
    k8s.api_client.cache_clear()
    try:
        kube_api.core.delete_namespace(extra)
    except Exception as exc:
        print(f"cleanup of {extra}: {exc}")


def put_secret(core: Any, namespace: str, data: dict[str, str]) -> None:
    from kubernetes import client

    core.create_namespaced_secret(
        namespace,
        client.V1Secret(metadata=client.V1ObjectMeta(name="trino-observer"), string_data=data),
    )


@pytest.mark.kube
@pytest.mark.safeguard("trino-9")
def test_each_pool_probes_with_its_own_observer_secret(kube_seam: Any) -> None:
    kube_api, ns_b = kube_seam
    ns_a = kube_api.namespace
    cred_a = ("observer-a", "pw-a-" + secrets.token_hex(4))
    cred_b = ("observer-b", "pw-b-" + secrets.token_hex(4))
    put_secret(kube_api.core, ns_a, {"username": cred_a[0], "password": cred_a[1]})
    put_secret(kube_api.core, ns_b, {"username": cred_b[0], "password": cred_b[1]})
    with CoordinatorDouble() as pool_a, CoordinatorDouble() as pool_b:
        url_a = pool_a.host_alias(INSTANCE, ns_a, 8080)
        url_b = pool_b.host_alias("cell-5e6f7a8b", ns_b, 8080)
        validator = Validator()  # the real credential source
        assert read_process_id(url_a, ns_a) == pool_a.process_id
        assert read_process_id(url_b, ns_b) == pool_b.process_id
        ctx_a = make_ctx(pool_a, url_a, namespace=ns_a)
        ctx_b = make_ctx(pool_b, url_b, namespace=ns_b, instance_id="cell-5e6f7a8b")
        for _ in range(10):  # interleaved passes of both pools in one term
            a, b = validator.step(ctx_a), validator.step(ctx_b)
            assert a.error == ""
            assert b.error == ""
            if a.done and b.done:
                break
        assert a.done
        assert b.done
        assert pool_a.credentials() == {cred_a}
        assert pool_b.credentials() == {cred_b}


@pytest.mark.kube
@pytest.mark.safeguard("trino-9")
def test_a_missing_observer_secret_or_key_names_them_without_values(
    kube_seam: Any,
    coordinator: CoordinatorDouble,  # noqa: F811
) -> None:
    kube_api, ns_b = kube_seam
    ns_a = kube_api.namespace
    url = coordinator.host_alias(INSTANCE, ns_a, 8080)

    with pytest.raises(ProbeError) as info:
        read_process_id(url, ns_a)
    assert str(info.value) == (
        f"observer credential unavailable: Secret trino-observer key username in namespace "
        f"{ns_a}: the Secret does not exist"
    )
    result = Validator().step(make_ctx(coordinator, url, namespace=ns_a))
    assert "Secret trino-observer key username" in result.error
    assert not result.fatal

    password = "pw-" + secrets.token_hex(6)
    put_secret(kube_api.core, ns_b, {"username": "observer-b", "password": password})
    put_secret(kube_api.core, ns_a, {"username": "observer-a"})  # no password key
    with pytest.raises(ProbeError) as info:
        read_process_id(url, ns_a)
    message = str(info.value)
    assert "Secret trino-observer key password" in message
    assert "the key is missing" in message
    assert "observer-a" not in message
    assert password not in message
    assert coordinator.requests == []  # nothing is sent without the pool's own credential


def test_the_http_seam_opens_at_most_four_connections_per_host(
    coordinator: CoordinatorDouble,  # noqa: F811
) -> None:
    import threading

    coordinator.delay = 1
    statuses: list[int] = []

    def call() -> None:
        response = http.request(
            "GET",
            "http://limited.example:8080/v1/info",
            headers={},
            body=None,
            timeout=5,
            connect_to=("127.0.0.1", coordinator.port),
        )
        statuses.append(response.status)

    threads = [threading.Thread(target=call) for _ in range(8)]
    started = time.monotonic()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert statuses == [200] * 8
    assert time.monotonic() - started >= 1.9  # two waves of four


def test_the_http_seam_verifies_tls_against_the_pinned_server_name(tmp_path: Any) -> None:
    import ssl
    import subprocess
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    key, cert = tmp_path / "key.pem", tmp_path / "cert.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=pool.example.com"),
            *("-addext", "subjectAltName=DNS:pool.example.com"),
        ],
        check=True,
        capture_output=True,
    )

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Length", "2")
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(str(cert), str(key))
    server.socket = server_context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        address = ("127.0.0.1", int(server.server_address[1]))
        context = http.tls_context(str(cert))
        assert context.minimum_version == ssl.TLSVersion.TLSv1_2

        def get(url: str, server_name: str = "") -> int:
            return http.request(
                "GET",
                url,
                headers={},
                body=None,
                timeout=5,
                connect_to=address,
                server_name=server_name,
                context=context,
            ).status

        assert get("https://pool.example.com/v1/info") == 200
        # The URL names another host, the pin names the certificate's: verified by the pin.
        assert get("https://10.0.0.1/v1/info", server_name="pool.example.com") == 200
        with pytest.raises(http.HttpTransportError, match=r"CERTIFICATE_VERIFY_FAILED|SSL"):
            get("https://pool.example.com/v1/info", server_name="other.example.com")
        with pytest.raises(http.HttpTransportError):
            http.request(
                "GET",
                "https://pool.example.com/v1/info",
                headers={},
                body=None,
                timeout=5,
                connect_to=address,
            )  # the system trust store does not know this certificate
    finally:
        server.shutdown()
        server.server_close()
