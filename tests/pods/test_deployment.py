"""The control plane as shipped, running on the real one-node cluster (marker ``pods``)."""

from __future__ import annotations

import html
import http.cookiejar
import json
import os
import re
import secrets
import subprocess
import urllib.error
import urllib.parse
import urllib.request
from datetime import datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest

from tests.fixtures.docs import documented_command
from tests.fixtures.pod_security import read_only_root, restricted_violations
from tests.fixtures.pods import (
    DEPLOYMENTS,
    KUBECONFIG,
    NAMESPACE,
    ROOT,
    RUNNERS_NAMESPACE,
    TRINO_CATALOG_SCHEMA,
    TRINO_CELL_NAMESPACE,
    TRINO_POOL_ID,
    Deployed,
    kubectl,
    kubectl_json,
    scrape,
    wait_until,
)

pytestmark = [pytest.mark.pods, pytest.mark.timeout(900)]


def _get(deployed: Deployed, path: str) -> tuple[int, str, bytes]:
    request = urllib.request.Request(
        f"http://{deployed.service_ip}:8080{path}", headers={"Host": "duckgres-admin-api"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return response.status, response.headers.get("Content-Type", ""), response.read()


@pytest.mark.safeguard("reshard-62")
def test_every_process_runs_from_the_shipped_manifests(deployed: Deployed) -> None:
    job = kubectl_json("-n", NAMESPACE, "get", "job", "duckgres-admin-migrate")
    assert job["status"].get("succeeded") == 1
    for name in DEPLOYMENTS:
        dep: dict[str, Any] = kubectl_json("-n", NAMESPACE, "get", "deploy", name)
        want = dep["spec"]["replicas"]
        assert dep["status"].get("availableReplicas") == want, (name, dep["status"])
    # Every pod ran its wait-for-migrations init container to completion, as uid 10001.
    for pod in deployed.pods("app=duckgres-admin"):
        if pod["metadata"]["labels"].get("component") == "migrate":
            continue
        [init] = pod["status"]["initContainerStatuses"]
        assert init["state"]["terminated"]["exitCode"] == 0, pod["metadata"]["name"]
        assert pod["spec"]["securityContext"]["runAsUser"] == 10001
    # Every pod the cluster really runs passes the restricted Pod Security level, read-only root.
    for pod in kubectl_json("-n", NAMESPACE, "get", "pods")["items"]:
        name = pod["metadata"]["name"]
        assert restricted_violations(pod["spec"], name) == []
        assert read_only_root(pod["spec"]) == [], name
    # The schema the Job migrated is complete.
    assert deployed.one("SELECT count(*) FROM django_migrations") > 20


def test_the_admin_static_files_and_readyz_answer_through_the_service(deployed: Deployed) -> None:
    status, _type, body = _get(deployed, "/readyz")
    assert status == 200, body[:300]
    status, content_type, body = _get(deployed, "/static/admin/css/base.css")
    assert status == 200
    assert content_type.startswith("text/css")
    assert b"body" in body


# (identity, verb, resource, namespace, allowed) on the real API server's RBAC authorizer,
# impersonated. The runner's account lives in the runner namespace, the others in NAMESPACE.
C, R = NAMESPACE, RUNNERS_NAMESPACE
CAN_I = [
    ("duckgres-admin-api", "create", "tokenreviews.authentication.k8s.io", C, True),
    ("duckgres-admin-runner", "create", "tokenreviews.authentication.k8s.io", C, False),
    ("duckgres-admin-launcher", "create", "tokenreviews.authentication.k8s.io", C, False),
    ("duckgres-admin-api", "get", "secrets", C, True),
    ("duckgres-admin-api", "get", "pods", C, True),
    ("duckgres-admin-api", "create", "pods", C, False),
    ("duckgres-admin-api", "delete", "pods", C, False),
    ("duckgres-admin-api", "create", "pods", R, False),
    # The launcher creates pods only in the runner namespace (safeguard reshard-138).
    ("duckgres-admin-launcher", "create", "pods", C, False),
    ("duckgres-admin-launcher", "delete", "pods", C, False),
    ("duckgres-admin-launcher", "get", "pods", C, True),  # its own pod
    ("duckgres-admin-launcher", "create", "pods", R, True),
    ("duckgres-admin-launcher", "delete", "pods", R, True),
    ("duckgres-admin-launcher", "get", "pods/log", R, True),
    ("duckgres-admin-launcher", "get", "secrets", C, True),  # copies referenced keys
    ("duckgres-admin-launcher", "create", "secrets", C, False),
    ("duckgres-admin-launcher", "delete", "secrets", C, False),
    ("duckgres-admin-launcher", "create", "secrets", R, True),  # each runner's own Secret
    ("duckgres-admin-launcher", "update", "secrets", R, False),
    ("duckgres-admin-launcher", "patch", "secrets", R, False),
    ("duckgres-admin-launcher", "list", "secrets", R, False),
    ("duckgres-admin-launcher", "create", "deployments.apps", C, False),
    ("duckgres-admin-launcher", "create", "deployments.apps", R, False),
    ("duckgres-admin-launcher", "list", "secrets", C, False),
    ("duckgres-admin-api", "create", "secrets", C, False),
    ("duckgres-admin-beat", "get", "secrets", C, False),
    ("duckgres-admin-beat", "get", "pods", C, False),
    ("duckgres-admin-runner", "get", "secrets", R, False),
    ("duckgres-admin-runner", "get", "secrets", C, False),
    ("duckgres-admin-runner", "create", "pods", R, False),
    ("duckgres-admin-runner", "list", "pods", R, False),
    ("duckgres-admin-trino", "get", "secrets", C, False),
    ("duckgres-admin-trino", "create", "pods", C, False),
    ("duckgres-admin-trino", "create", "pods", R, False),
]


@pytest.mark.safeguard("reshard-78")
def test_each_component_runs_as_its_own_identity_with_only_its_rights(deployed: Deployed) -> None:
    expected = {
        "api": "duckgres-admin-api",
        "worker": "duckgres-admin-launcher",
        "control-worker": "duckgres-admin-launcher",
        "beat": "duckgres-admin-beat",
        "trino-worker": "duckgres-admin-trino",
    }
    seen = set()
    for pod in deployed.pods("app=duckgres-admin"):
        component = pod["metadata"]["labels"].get("component", "")
        if component not in expected:
            continue
        seen.add(component)
        spec = pod["spec"]
        assert spec["serviceAccountName"] == expected[component], pod["metadata"]["name"]
        tokens = [v for v in spec.get("volumes", []) if "projected" in v]
        if component == "beat":  # beat holds no API token at all
            assert tokens == [], spec.get("volumes")
    assert seen == set(expected)
    wrong = []
    for account, verb, resource, namespace, allowed in CAN_I:
        home = RUNNERS_NAMESPACE if account == "duckgres-admin-runner" else NAMESPACE
        answer = kubectl(
            "auth", "can-i", verb, resource, "-n", namespace,
            f"--as=system:serviceaccount:{home}:{account}", check=False,
        ).strip()  # fmt: skip
        if (answer == "yes") != allowed:
            wrong.append((account, verb, resource, namespace, answer))
    assert wrong == []


def _as_launcher_create(pod: dict[str, Any]) -> subprocess.CompletedProcess[str]:
    """``kubectl create --dry-run=server`` of ``pod`` impersonating the launcher's account:
    authorization and admission run as for a real create, nothing is persisted."""
    return subprocess.run(
        ["kubectl", "--kubeconfig", str(KUBECONFIG), "create", "--dry-run=server", "-f", "-",
         f"--as=system:serviceaccount:{NAMESPACE}:duckgres-admin-launcher"],
        input=json.dumps(pod), capture_output=True, text=True, timeout=60,
    )  # fmt: skip


@pytest.mark.safeguard("reshard-138")
def test_the_launchers_token_cannot_start_a_pod_with_a_more_powerful_identity(
    deployed: Deployed,
) -> None:
    """Whoever holds the launcher's token: no pod beside the control plane, and in the runner
    namespace no account but the rightless ones (the ServiceAccount admission refuses a name
    that does not exist there), so neither the API's, the launcher's nor the trino worker's."""

    def pod(namespace: str, account: str) -> dict[str, Any]:
        return {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"probe-{secrets.token_hex(3)}", "namespace": namespace},
            "spec": {"serviceAccountName": account, "restartPolicy": "Never",
                     "containers": [{"name": "c", "image": "localhost/duckgres-admin:0.1.0",
                                     "imagePullPolicy": "Never"}]},
        }  # fmt: skip

    beside = _as_launcher_create(pod(NAMESPACE, "duckgres-admin-api"))
    assert beside.returncode != 0
    assert "forbidden" in beside.stderr.lower(), beside.stderr
    for account in ("duckgres-admin-api", "duckgres-admin-launcher", "duckgres-admin-trino"):
        there = _as_launcher_create(pod(RUNNERS_NAMESPACE, account))
        assert there.returncode != 0, account
        assert f'serviceaccount "{account}" not found' in there.stderr, there.stderr
    # What it is for still works: a rightless runner account in the runner namespace.
    ok = _as_launcher_create(pod(RUNNERS_NAMESPACE, "duckgres-admin-runner"))
    assert ok.returncode == 0, ok.stderr


# The trino worker's start lines once Trino is wired (trino_pools/tasks.py ``worker_start``):
# AppConfig.ready() validated the configuration (the process does not start otherwise), the
# exporter is started only for a wired configuration, and the start-up ownership audit runs
# only after the catalog writer's connection check (and bootstrap) succeeded.
TRINO_STARTED = (
    "trino worker metrics exporter listening on :9109",
    "trino ownership audit: every Trino-enabled warehouse has a configured owner",
)


def _trino_worker_pod(deployed: Deployed) -> dict[str, Any]:
    pods = [
        p
        for p in deployed.pods("component=trino-worker")
        if not p["metadata"].get("deletionTimestamp")
    ]
    assert len(pods) == 1, [p["metadata"]["name"] for p in pods]
    return pods[0]


def _trino_lease(deployed: Deployed) -> tuple[str, int, datetime, bool]:
    row = deployed.one(
        "SELECT holder, epoch, renewed_at, expires_at > now() FROM duckgres_leases "
        "WHERE name = 'trino'"
    )
    assert row is not None, "no trino lease row (migration 0003 seeds it)"
    return str(row[0]), int(row[1]), row[2], bool(row[3])


def _trino_worker_log(name: str) -> str:
    return kubectl("-n", NAMESPACE, "logs", name, "-c", "trino-worker")


def test_the_trino_worker_validates_its_pool_and_holds_the_trino_lease(deployed: Deployed) -> None:
    pod = _trino_worker_pod(deployed)
    name = pod["metadata"]["name"]
    assert pod["status"]["phase"] == "Running", pod["status"]
    [container] = pod["status"]["containerStatuses"]
    assert container["ready"] is True, container
    assert container["restartCount"] == 0, container
    log = wait_until(
        lambda: (text := _trino_worker_log(name)) and all(line in text for line in TRINO_STARTED)
        and text,
        "the trino worker's start lines (configuration validated, catalog writer checked)", 60,
    )  # fmt: skip
    assert "invalid Trino configuration" not in log

    # The leader lease: the row `trino` of duckgres_leases, taken by the first pool tick.
    holder, epoch, renewed_at, live = wait_until(
        lambda: (row := _trino_lease(deployed))[0].startswith(f"{name}.") and row,
        f"the trino lease to be held by {name}",
        90,
    )
    assert epoch >= 1
    assert live, "the trino lease has expired"
    assert f"lease trino: taken by {holder} (epoch {epoch})" in _trino_worker_log(name)
    # Renewed (every pool tick, beat sends one every 5 s), not retaken: same holder and epoch.
    later = wait_until(
        lambda: (row := _trino_lease(deployed))[2] > renewed_at and row,
        "the trino lease to be renewed",
        30,
        poll=1,
    )
    assert later[:2] == (holder, epoch), later
    assert later[3], "the renewed trino lease has expired"
    # No Trino secret reached the log.
    log = _trino_worker_log(name)
    for key, value in deployed.trino_secrets.items():
        assert value not in log, f"the {key} value is in the trino worker's log"


def test_the_trino_worker_runs_its_pool_term_in_the_cell_namespace(deployed: Deployed) -> None:
    """The operator's first tick with the lease: the pool row is seeded, its authority taken and
    the catalog writer claimed in the catalog store (the DSN from the Secret works), then the
    pool freezes because its desired configuration is not published. The frozen reason is a
    404 from the cell namespace, which only a working RoleBinding there gives (without it:
    "Kubernetes forbids get on configmaps/…")."""
    name = _trino_worker_pod(deployed)["metadata"]["name"]
    holder = wait_until(
        lambda: (row := _trino_lease(deployed))[0].startswith(f"{name}.") and row[0],
        "the trino lease",
        90,
    )
    owner, auth_epoch, frozen, reason = wait_until(
        lambda: deployed.one(
            "SELECT authority_owner, authority_epoch, frozen, frozen_reason "
            "FROM duckgres_trino_pools WHERE pool_id = %s AND frozen",
            TRINO_POOL_ID,
        ),
        "the pool to be seeded, acquired and frozen",
        60,
    )
    assert owner == holder
    assert auth_epoch >= 1
    assert frozen is True
    configmap = f"configmaps/trino-pool-config-pods-pool in namespace {TRINO_CELL_NAMESPACE}"
    assert f"{configmap} not found (404)" in reason, reason
    assert "forbid" not in reason.lower(), reason
    with psycopg.connect(deployed.trino_catalog_dsn, connect_timeout=5) as conn:
        writer = conn.execute(
            f"SELECT writer_epoch, writer_identity FROM {TRINO_CATALOG_SCHEMA}."
            "trino_catalog_writer_state WHERE pool_key = %s",
            [TRINO_POOL_ID],
        ).fetchone()
    assert writer == (auth_epoch, holder)
    # The grants in the cell namespace are the shipped ones, and only there.
    sa = f"--as=system:serviceaccount:{NAMESPACE}:duckgres-admin-trino"
    for namespace, verb, resource, allowed in (
        (TRINO_CELL_NAMESPACE, "create", "deployments.apps", "yes"),
        (TRINO_CELL_NAMESPACE, "get", "secret/trino-observer", "yes"),
        (TRINO_CELL_NAMESPACE, "get", "secret/other", "no"),
        (TRINO_CELL_NAMESPACE, "patch", "deployments.apps", "no"),
        ("default", "create", "deployments.apps", "no"),
    ):
        answer = kubectl("auth", "can-i", verb, resource, "-n", namespace, sa, check=False)
        assert answer.strip() == allowed, (namespace, verb, resource, answer)


# Run inside the trino worker's container: the product's Gateway client with the process's own
# validated settings (URL, pinned server name, token file); the token never leaves the pod.
GATEWAY_PROBE = """
import json, django
django.setup()
from duckgres_admin.lib.gateway import GatewayClient
from trino_pools import config
s = config.current()
with open(s.rollout_token_file, encoding="utf-8") as f:
    token = f.read().rstrip("\\n")
client = GatewayClient(s.gateway_url, token, server_name=s.gateway_server_name)
print("GATEWAY-ANSWER " + json.dumps(client.get("/gateway/backend/all")))
"""


def test_the_default_workers_liveness_probe_answers_and_can_fail(deployed: Deployed) -> None:
    """The probe the manifest ships, run in the worker's container as the kubelet runs it,
    exits 0; aimed at a node that does not exist it exits non-zero (the probe can fail)."""
    pod = deployed.live_pod("component=worker")
    container = pod["spec"]["containers"][0]
    command = container["livenessProbe"]["exec"]["command"]
    name = pod["metadata"]["name"]
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(KUBECONFIG), "-n", NAMESPACE, "exec", name, "-c",
         container["name"], "--", *command], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, (done.stdout, done.stderr)
    assert "pong" in done.stdout
    wrong = [*command[:-1], command[-1].replace('"celery@$HOSTNAME"', "celery@no-such-node")]
    assert wrong != command
    done = subprocess.run(
        ["kubectl", "--kubeconfig", str(KUBECONFIG), "-n", NAMESPACE, "exec", name, "-c",
         container["name"], "--", *wrong], capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode != 0, (done.stdout, done.stderr)
    status = pod["status"]["containerStatuses"][0]
    assert status["restartCount"] == 0, status


def test_the_trino_worker_reaches_its_gateway_over_verified_tls(deployed: Deployed) -> None:
    assert deployed.gateway is not None
    name = _trino_worker_pod(deployed)["metadata"]["name"]
    before = len(deployed.gateway.requests_to("GET", r"^/gateway/backend/all$"))
    out = kubectl("-n", NAMESPACE, "exec", name, "-c", "trino-worker", "--",
                  "python", "-c", GATEWAY_PROBE, timeout=120)  # fmt: skip
    [answer] = [line for line in out.splitlines() if line.startswith("GATEWAY-ANSWER ")]
    assert json.loads(answer.split(" ", 1)[1]) == [], answer
    seen = deployed.gateway.requests_to("GET", r"^/gateway/backend/all$")[before:]
    assert len(seen) == 1, seen
    # Authenticated with the rollout token from the Secret (the double answers 401 otherwise).
    assert seen[0][2]["authorization"] == f"Bearer {deployed.trino_secrets['rollout-token']}"
    assert deployed.trino_secrets["rollout-token"] not in out


def _run_documented(command: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "KUBECONFIG": str(KUBECONFIG)}
    return subprocess.run(
        ["bash", "-c", command], cwd=cwd, capture_output=True, text=True, timeout=120, env=env
    )


def _login_through(base: str, username: str, password: str) -> tuple[int, str]:
    """A browser's admin login: the form, its CSRF cookie and token, the POST with an Origin."""
    # Browsers treat http://localhost as a secure context and send Secure cookies there; the
    # standard library's jar does not, unless told to.
    browser_like = http.cookiejar.DefaultCookiePolicy(secure_protocols=("https", "wss", "http"))
    jar = http.cookiejar.CookieJar(policy=browser_like)
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(jar))
    with opener.open(f"{base}/admin/login/?next=/admin/", timeout=10) as form:
        page = form.read().decode()
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page)
    assert token, page[:500]
    fields = {"csrfmiddlewaretoken": html.unescape(token[1]), "next": "/admin/"}
    body = urllib.parse.urlencode({**fields, "username": username, "password": password})
    request = urllib.request.Request(
        f"{base}/admin/login/?next=/admin/", data=body.encode(), headers={"Origin": base}
    )
    try:
        with opener.open(request, timeout=10) as answer:  # follows the redirect to /admin/
            return answer.status, answer.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def test_the_documented_first_look_works_as_printed(deployed: Deployed, tmp_path: Path) -> None:
    """docs/kubernetes.md steps 5 and 6 run verbatim: the first admin from standard input in
    the API's pod, the port-forward, readyz on localhost and a browser login over plain HTTP."""
    password = "first-look-" + secrets.token_hex(12)
    (tmp_path / "admin-password").write_text(password + "\n")
    created = _run_documented(documented_command("create_first_admin"), tmp_path)
    assert created.returncode == 0, created.stderr
    assert password not in created.stdout + created.stderr
    forward = documented_command("port-forward svc/duckgres-admin-api")
    env = {**os.environ, "KUBECONFIG": str(KUBECONFIG)}
    proc = subprocess.Popen(
        ["bash", "-c", f"exec {forward}"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        assert "Forwarding from" in first, first
        with urllib.request.urlopen("http://localhost:8080/readyz", timeout=10) as ready:
            assert ready.status == 200
        status, page = _login_through("http://localhost:8080", "alice", password)
        assert status == 200, page[:500]
        assert 'action="/admin/logout/"' in page or "Log out" in page, page[:500]
        # The same login over plain HTTP at another name answers 403 and names the fix.
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(
                urllib.request.Request(
                    "http://127.0.0.1:8080/admin/login/",
                    data=b"username=alice",
                    headers={"Host": "duckgres-admin-api:8080"},
                ),
                timeout=10,
            )
        assert refused.value.code == 403
        assert "DUCKGRES_SECURE_COOKIES=false" in refused.value.read().decode()
    finally:
        proc.terminate()
        proc.wait(10)


def test_an_upgrade_applied_as_documented_re_creates_and_re_runs_the_migration(
    deployed: Deployed, tmp_path: Path
) -> None:
    """docs/kubernetes.md "Upgrade": a release that changes the Job's pod template is applied
    with ``kubectl apply -k … --force`` and no ``kubectl delete job``; without ``--force`` the
    same apply is refused (the template is immutable), which is why the flag is documented."""
    before = kubectl_json("-n", NAMESPACE, "get", "job", "duckgres-admin-migrate")
    release = secrets.token_hex(4)
    overlay = os.path.relpath(ROOT / "tests" / "pods" / "overlay", tmp_path)  # kustomize: relative
    (tmp_path / "kustomization.yaml").write_text(
        "apiVersion: kustomize.config.k8s.io/v1beta1\nkind: Kustomization\n"
        f"resources:\n- {overlay}\n"
        "patches:\n- target: {kind: Job, name: duckgres-admin-migrate}\n  patch: |-\n"
        "    - op: add\n      path: /spec/template/metadata/annotations\n"
        f'      value: {{duckgres.test/release: "{release}"}}\n'
    )
    plain = kubectl("apply", "-k", str(tmp_path), check=False, timeout=300)
    job = kubectl_json("-n", NAMESPACE, "get", "job", "duckgres-admin-migrate")
    assert job["metadata"]["uid"] == before["metadata"]["uid"], plain
    kubectl("apply", "-k", str(tmp_path), "--force", timeout=300)

    def rerun() -> bool:
        job = kubectl_json("-n", NAMESPACE, "get", "job", "duckgres-admin-migrate")
        fresh = job["metadata"]["uid"] != before["metadata"]["uid"]
        return bool(fresh and job["status"].get("succeeded") == 1)

    wait_until(rerun, "the re-created migration Job to succeed", timeout=300, poll=2)
    job = kubectl_json("-n", NAMESPACE, "get", "job", "duckgres-admin-migrate")
    assert job["spec"]["template"]["metadata"]["annotations"]["duckgres.test/release"] == release
    for name in DEPLOYMENTS:
        dep = kubectl_json("-n", NAMESPACE, "get", "deploy", name)
        assert dep["status"].get("availableReplicas") == dep["spec"]["replicas"], name


def test_the_default_worker_serves_its_childrens_task_outcomes(deployed: Deployed) -> None:
    """Beat sends notifications.scan every 15 s to the default worker: its prefork children's
    outcomes reach the main process's exporter (docs/monitoring.md "Platform metrics")."""
    name = deployed.live_pod("component=worker")["metadata"]["name"]

    def succeeded() -> float:
        out = scrape(name, "worker", 9111)
        if not out:
            log = kubectl("-n", NAMESPACE, "logs", name, "-c", "worker", "--tail=200", check=False)
            raise AssertionError(f"the worker's exporter did not answer; its log:\n{log}")
        return sum(
            float(line.rsplit(" ", 1)[1])
            for line in out.splitlines()
            if line.startswith("duckgres_celery_tasks_total{") and '"succeeded"' in line
        )

    wait_until(succeeded, "a task outcome on the default worker's exporter", timeout=120, poll=5)


def _ready_api_pods(deployed: Deployed) -> set[str]:
    ready = set()
    for pod in deployed.pods("app=duckgres-admin,component=api"):
        if pod["metadata"].get("deletionTimestamp") is not None:
            continue
        conditions = pod["status"].get("conditions") or []
        if any(c["type"] == "Ready" and c["status"] == "True" for c in conditions):
            ready.add(pod["metadata"]["name"])
    return ready


def _shipped_budgets() -> str:
    """``components/ha``'s budgets in the policy API this cluster serves: ``policy/v1`` from
    Kubernetes 1.21 (what the component ships); the one-node cluster is 1.20, whose
    ``policy/v1beta1`` has the same two fields the budgets use (``maxUnavailable``,
    ``selector``), so only the version line changes."""
    text = (ROOT / "k8s" / "components" / "ha" / "pdb.yaml").read_text()
    served = kubectl("api-versions").split()
    if "policy/v1" in served:
        return text
    assert "policy/v1beta1" in served, served
    assert text.count("apiVersion: policy/v1\n") == 3, "three budgets, one version line each"
    return text.replace("apiVersion: policy/v1\n", "apiVersion: policy/v1beta1\n")


def test_a_drain_under_the_ha_budgets_never_takes_both_api_replicas(deployed: Deployed) -> None:
    """docs/kubernetes.md "High availability": with ``components/ha``'s budgets applied (in the
    policy API version the cluster serves), a drain evicts one API replica and is refused the
    other while the first is not back. On the one-node cluster the evicted replica's successor
    cannot be scheduled on the cordoned node, so the drain (limited to the API's pods) must stop
    at the budget: a replica serves throughout, the refusal names the budget, and after the
    uncordon both replicas return."""
    budgets = _shipped_budgets()
    node = kubectl_json("get", "nodes")["items"][0]["metadata"]["name"]
    before = wait_until(lambda: len(_ready_api_pods(deployed)) == 2 and _ready_api_pods(deployed),
                        "both API replicas ready", 300)  # fmt: skip
    kubectl("apply", "-f", "-", input=budgets)
    seen: list[int] = []
    try:
        drain = subprocess.Popen(
            ["kubectl", "--kubeconfig", str(KUBECONFIG), "drain", node, "--ignore-daemonsets",
             "--delete-emptydir-data", "--pod-selector=app=duckgres-admin,component=api",
             "--timeout=60s"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )  # fmt: skip
        while drain.poll() is None:
            seen.append(len(_ready_api_pods(deployed)))
        output = drain.communicate(timeout=30)[0]
    finally:
        kubectl("uncordon", node)
        kubectl("delete", "-f", "-", "--ignore-not-found", input=budgets)
    assert drain.returncode != 0, output  # it stopped at the budget, never took the second
    assert "disruption budget" in output, output
    assert seen, "the drain ran"
    assert min(seen) >= 1, seen  # a replica was ready at every sample
    evicted = before - _ready_api_pods(deployed)
    assert len(evicted) == 1, (before, output)
    wait_until(lambda: len(_ready_api_pods(deployed)) == 2, "both API replicas back", 300)
    wait_until(lambda: deployed.api.answers("warehouses"), "the API after the drain", 120)
