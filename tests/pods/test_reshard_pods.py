"""Reshards on real runner pods (marker ``pods``): the worker pod's pod launcher creates
``duckgres-reshard-op-<id>``, the kubelet runs it from the image, it claims, moves the catalog and
exits; the janitor (control-worker pod) captures logs through the kubelet's log API and reaps.

Catalogs live on the host's store clusters (5433/5434, reached by the pods at 10.244.0.1);
their tenant passwords are Secret keys the pods resolve through ``k8s:`` references.
"""

from __future__ import annotations

import json
import secrets
import subprocess
import time
from datetime import datetime
from typing import Any

import pytest

from tests.fixtures.docs import documented_command
from tests.fixtures.pod_security import read_only_root, restricted_violations
from tests.fixtures.pods import (
    BUCKET,
    DEPLOYMENTS,
    NAMESPACE,
    NODE_IP,
    RUNNERS_NAMESPACE,
    TENANT_SECRET,
    Deployed,
    container_id,
    kubectl,
    kubectl_json,
    runner_pod,
    scrape,
    wait_rollouts,
    wait_step,
    wait_until,
)
from tests.fixtures.runner import catalog_checksums
from tests.fixtures.secrets_scan import scan, unique_password
from tests.fixtures.stores import TenantCatalog, create_tenant_catalog, drop_tenant
from tests.pods.tenants import Tenant
from tests.pods.tenants import messages as _messages

pytestmark = [pytest.mark.pods, pytest.mark.timeout(900)]


def _ts(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


@pytest.fixture
def tenant(deployed: Deployed) -> Any:
    made: list[Tenant] = []

    def factory(**kwargs: Any) -> Tenant:
        t = Tenant(deployed, **kwargs)
        made.append(t)
        return t

    yield factory
    for t in made:
        t.cleanup()


def _moved_rows(tenant: Tenant) -> dict[str, int]:
    moved = TenantCatalog(
        tenant.deployed.clusters.target,
        tenant.catalog.role,
        tenant.catalog.database,
        tenant.catalog.password,
        tenant.catalog.password_var,
    )
    return moved.row_counts()


@pytest.mark.safeguard("reshard-78")
@pytest.mark.safeguard("reshard-137")
@pytest.mark.safeguard("reshard-138")
def test_a_reshard_runs_in_its_own_pod_and_the_janitor_reaps_it(deployed: Deployed, tenant):
    t = tenant(rows=5)
    rows_before = t.catalog.row_counts()
    op_id = t.to_cnpg_target()

    pod = wait_until(lambda: runner_pod(op_id), f"runner pod duckgres-reshard-op-{op_id}", 60)
    spec = pod["spec"]
    assert spec["restartPolicy"] == "Never"
    assert spec["terminationGracePeriodSeconds"] == 600
    assert pod["metadata"]["labels"]["app"] == "duckgres-reshard"
    container = spec["containers"][0]
    assert container["image"] == "localhost/duckgres-admin:0.1.0"
    assert restricted_violations(spec, "runner") == []
    assert read_only_root(spec) == []
    # The env allowlist: secret-bearing entries reach the runner as references (never values).
    env = {e["name"]: e for e in container["env"]}
    # In the runner namespace no reference to the control plane's Secrets resolves: the
    # launcher copied the runner secret into the op's own Secret (safeguard reshard-138).
    assert "value" not in env["DUCKGRES_RUNNER_SECRET"]
    assert env["DUCKGRES_RUNNER_SECRET"]["valueFrom"]["secretKeyRef"] == {
        "name": f"duckgres-reshard-op-{op_id}-login", "key": "DUCKGRES_RUNNER_SECRET"
    }  # fmt: skip
    assert pod["metadata"]["namespace"] == RUNNERS_NAMESPACE
    # S3: never the control plane's keys, a session minted for this launch in the op's own
    # Secret (safeguard reshard-137); the runner's S3 upload below signs with it.
    for name, key in (("AWS_ACCESS_KEY_ID", "aws-access-key-id"),
                      ("AWS_SECRET_ACCESS_KEY", "aws-secret-access-key"),
                      ("AWS_SESSION_TOKEN", "aws-session-token")):  # fmt: skip
        assert env[name]["valueFrom"]["secretKeyRef"] == {
            "name": f"duckgres-reshard-op-{op_id}-login", "key": key
        }, name  # fmt: skip
    assert (
        f"own keys _reshard_catalog_backups/op-{op_id}-*"
        in (env["DUCKGRES_RESHARD_S3_SESSION"]["value"])
    )
    # The config store: the operation's own login, never the control plane's (reshard-133).
    assert env["DUCKGRES_CONFIG_STORE"]["valueFrom"]["secretKeyRef"] == {
        "name": f"duckgres-reshard-op-{op_id}-login", "key": "config-store-dsn"
    }  # fmt: skip
    assert "DUCKGRES_INTERNAL_SECRET" not in env
    # Its own identity with no API token (safeguard reshard-78): the store's provisioner
    # reference reaches it only as a mounted secretKeyRef, which the move below resolves.
    assert spec["serviceAccountName"] == "duckgres-admin-runner"
    assert spec["automountServiceAccountToken"] is False
    assert not [v for v in spec.get("volumes", []) if "projected" in v], spec.get("volumes")
    assert env["DUCKGRES_SECRET_REFS_MOUNTED"]["value"] == "1"
    mounted = [e for e in container["env"] if e["name"].startswith("DUCKGRES_REF_")]
    assert mounted, container["env"]
    assert all("value" not in e and e["valueFrom"]["secretKeyRef"] for e in mounted)

    op = deployed.api.wait_terminal(op_id, timeout=300)
    entries = deployed.api.log_entries(op_id)
    assert op["state"] == "succeeded", (op, _messages(entries)[-4000:])
    assert op["runner_id"] == f"duckgres-reshard-op-{op_id}"
    assert _moved_rows(t) == rows_before
    # The backup went to S3 with the keys the kubelet resolved from the Secret.
    assert op["backup_s3_uri"].startswith(f"s3://{BUCKET}/"), op
    key = op["backup_s3_uri"][len(f"s3://{BUCKET}/") :]
    assert deployed.s3.head_object(Bucket=BUCKET, Key=key)["ContentLength"] > 0
    # The pod ran to completion, exit 0, under the kubelet.
    pod = wait_until(
        lambda: (p := runner_pod(op_id)) and p["status"].get("phase") in ("Succeeded", "Failed")
        and p,
        "the runner pod to finish", 60,
    )  # fmt: skip
    if pod is not True:
        terminated = pod["status"]["containerStatuses"][0]["state"].get("terminated") or {}
        assert pod["status"]["phase"] == "Succeeded", pod["status"]
        assert terminated.get("exitCode") == 0
    # The op log carries the pod's own lines and the runner's exit marker naming the pod.
    text = _messages(deployed.api.log_entries(op_id))
    assert f"operation claimed by duckgres-reshard-op-{op_id} (epoch 1)" in text
    assert "runner log persisted: pod " in text, text[-3000:]
    assert "credentials from env (an operation-scoped session: federation token" in text
    # The janitor reaps the finished pod (REAP_AFTER 5 s + one janitor interval).
    wait_until(lambda: runner_pod(op_id) is None, "the janitor to reap the runner pod", 120, 2)


def test_an_external_target_password_reaches_the_runner_pod_and_nowhere_else(
    deployed: Deployed, tenant
):
    """The password is pulled by the runner pod from the API pod that holds the stash, over the
    pod network, and no form of it is in pod specs, events, container logs, the config store or
    Redis afterwards."""
    password = unique_password()
    t = tenant(rows=3)
    external = create_tenant_catalog(deployed.clusters.target, password=password, with_tables=False)
    # Where the binding will read the password after the move (the operator's secret store).
    deployed.put_secret_key(TENANT_SECRET, f"{t.org}-external", password)
    try:
        op_id = t.start(
            {
                "type": "external",
                "endpoint": f"{NODE_IP}:{deployed.clusters.target.port}",
                "user": external.role,
                "database": external.database,
                "sslmode": "require",
                "password_secret_ref": f"k8s:{NAMESPACE}/{TENANT_SECRET}#{t.org}-external",
                "password": password,
            }
        )
        pod = wait_until(lambda: runner_pod(op_id), "the runner pod", 60)
        env = {e["name"]: e for e in pod["spec"]["containers"][0]["env"]}
        url = env["DUCKGRES_RESHARD_PASSWORD_URL"]["value"]
        api_ips = {p["status"].get("podIP") for p in deployed.pods("component=api")}
        assert url.split("//", 1)[1].split(":", 1)[0] in api_ips, (url, api_ips)
        op = deployed.api.wait_terminal(op_id, timeout=300)
        entries = deployed.api.log_entries(op_id)
        text = _messages(entries)
        assert "runner fetched the ephemeral external target password" in text, text[-3000:]

        sources: list[tuple[str, bytes | str]] = [("op JSON", json.dumps(op))]
        sources.append(("op log", json.dumps(entries)))
        for namespace in (NAMESPACE, RUNNERS_NAMESPACE):
            for p in kubectl_json("-n", namespace, "get", "pods")["items"]:
                name = p["metadata"]["name"]
                sources.append((f"pod spec {name}", json.dumps(p)))
                for c in p["spec"]["containers"]:
                    logs = kubectl("-n", namespace, "logs", name, "-c", c["name"], check=False)
                    sources.append((f"container log {name}/{c['name']}", logs))
            events = kubectl("-n", namespace, "get", "events", "-o", "json")
            sources.append((f"events in {namespace}", events))
        dump = subprocess.run(
            ["pg_dump", "-h", "127.0.0.1", "-U", "postgres", "--no-owner", "-d", "duckgres_pods"],
            capture_output=True, check=True, timeout=120,
        ).stdout  # fmt: skip
        assert b"duckgres_reshard_operation_log" in dump
        sources.append(("pg_dump of the config store", dump))
        redis_dump = subprocess.run(
            ["redis-cli", "-h", "127.0.0.1", "-n", "4", "--no-raw", "KEYS", "*"],
            capture_output=True,
            check=True,
        ).stdout
        for key in redis_dump.decode().split():
            key = key.strip('"')
            for cmd in (["GET", key], ["LRANGE", key, "0", "-1"], ["HGETALL", key]):
                out = subprocess.run(["redis-cli", "-n", "4", *cmd], capture_output=True)
                sources.append((f"redis {key}", out.stdout))
        hits = scan(password, sources)
        assert hits == [], f"the password leaked into: {hits}"
        assert scan(password, [("sanity", password)])
    finally:
        drop_tenant(deployed.clusters.target, external.role)


def test_deleting_the_runner_pod_mid_copy_rolls_back_within_the_grace(deployed: Deployed, tenant):
    """``kubectl delete pod``: SIGTERM, the runner rolls back inside its 600 s grace, the
    warehouse is consistent and unblocked, and the op ends failed (docs/runner.md)."""
    t = tenant(tables=1500)
    rows_before = t.catalog.row_counts()
    op_id = t.to_cnpg_target()
    wait_step(deployed, op_id, {"copying"}, 180)
    started = time.monotonic()
    kubectl("-n", RUNNERS_NAMESPACE, "delete", "pod", f"duckgres-reshard-op-{op_id}",
            "--wait=false")  # fmt: skip
    op = deployed.api.wait_terminal(op_id, timeout=300)
    took = time.monotonic() - started
    text = _messages(deployed.api.log_entries(op_id))
    assert op["state"] in ("failed", "cancelled"), (op, text[-3000:])
    assert "SIGTERM" in text, text[-3000:]
    assert took < 600
    wh = deployed.api.get(f"warehouses/{t.org}").body
    assert wh["state"] == "ready"
    assert wh["writable"] is True
    assert wh["metadata_store_name"] == "pods-source", wh
    assert t.catalog.row_counts() == rows_before
    with t.catalog.tenant_conn() as conn:
        assert conn.execute("SELECT 1").fetchone() == (1,)


# Run in a pod built from a live runner pod (its image, account, env and Secret references):
# what a compromised runner can do with the config-store login it was given.
LOGIN_PROBE = """
import json, os, psycopg
from psycopg import errors
out = {}
with psycopg.connect(os.environ["DUCKGRES_CONFIG_STORE"], autocommit=True,
                     connect_timeout=10) as conn:
    out["user"] = conn.execute("SELECT session_user").fetchone()[0]
    for table in ("auth_user", "django_session", "duckgres_operators", "duckgres_audit_log"):
        try:
            conn.execute(f"SELECT 1 FROM {table} LIMIT 1")
            out[table] = "readable"
        except errors.InsufficientPrivilege:
            out[table] = "permission denied"
    out["ops"] = [r[0] for r in conn.execute("SELECT id FROM duckgres_reshard_operations")]
    out["others_updated"] = conn.execute(
        "UPDATE duckgres_reshard_operations SET error = 'probe' WHERE id <> %s",
        [int(os.environ["DUCKGRES_RESHARD_OP_ID"])]).rowcount
print("PROBE " + json.dumps(out), flush=True)
"""


def _probe_pod(runner: dict[str, Any], name: str) -> dict[str, Any]:
    """``runner``'s pod with another name, no op-id label (the janitor leaves it alone) and
    the probe as its command."""
    spec = {k: v for k, v in runner["spec"].items() if k != "nodeName"}
    container = dict(spec["containers"][0])
    container["command"] = ["python", "-c", LOGIN_PROBE]
    spec["containers"] = [container]
    labels = {"app": runner["metadata"]["labels"]["app"]}
    return {"apiVersion": "v1", "kind": "Pod", "spec": spec,
            "metadata": {"name": name, "namespace": RUNNERS_NAMESPACE,
                         "labels": labels}}  # fmt: skip


@pytest.mark.safeguard("reshard-133")
def test_a_runner_pods_login_reaches_its_own_operation_only(deployed: Deployed, tenant):
    """From a pod with a live runner's image, account and environment: Django's users and
    sessions, operators and audit are ``permission denied``, no other operation is visible or
    writable. The control plane's own login is never in the pod."""
    earlier = tenant(rows=2)
    earlier_id = earlier.to_cnpg_target()  # another operation's row in the config store
    assert deployed.api.wait_terminal(earlier_id, timeout=300)["state"] == "succeeded"
    t = tenant(tables=1500)
    op_id = t.to_cnpg_target()
    wait_step(deployed, op_id, {"copying"}, 180)
    runner = runner_pod(op_id)
    assert runner is not None
    env = {e["name"]: e for e in runner["spec"]["containers"][0]["env"]}
    assert env["DUCKGRES_CONFIG_STORE"]["valueFrom"]["secretKeyRef"] == {
        "name": f"duckgres-reshard-op-{op_id}-login", "key": "config-store-dsn"
    }  # fmt: skip
    name, R = f"duckgres-login-probe-{op_id}", RUNNERS_NAMESPACE
    kubectl("apply", "-f", "-", input=json.dumps(_probe_pod(runner, name)))
    try:
        phase = wait_until(
            lambda: kubectl_json("-n", R, "get", "pod", name)["status"].get("phase")
            in ("Succeeded", "Failed") and kubectl_json("-n", R, "get", "pod", name),
            "the probe pod to finish", 120,
        )  # fmt: skip
        log = kubectl("-n", R, "logs", name)
        assert phase["status"]["phase"] == "Succeeded", log
    finally:
        kubectl("-n", R, "delete", "pod", name, "--wait=false", check=False)
    found = json.loads(log.split("PROBE ", 1)[1].splitlines()[0])
    assert found["user"].startswith("duckgres_runner_")
    assert found["user"].endswith(f"_op{op_id}")
    for table in ("auth_user", "django_session", "duckgres_operators", "duckgres_audit_log"):
        assert found[table] == "permission denied", found
    assert found["ops"] == [op_id], found
    assert found["others_updated"] == 0
    assert deployed.one("SELECT error FROM duckgres_reshard_operations WHERE id = %s",
                        earlier_id) == ""  # fmt: skip
    op = deployed.api.wait_terminal(op_id, timeout=600)
    assert op["state"] == "succeeded", op
    # Once the runner is reaped, the janitor deletes the Secret and drops the login.
    wait_until(
        lambda: not deployed.one("SELECT count(*) FROM pg_roles WHERE rolname = %s",
                                 found["user"]),
        "the janitor to drop the runner's login", 180, 2,
    )  # fmt: skip
    assert not kubectl("-n", RUNNERS_NAMESPACE, "get", "secret",
                       f"duckgres-reshard-op-{op_id}-login",
                       "--ignore-not-found", "-o", "name").strip()  # fmt: skip


def test_a_runner_killed_by_the_runtime_is_relaunched_and_the_move_completes(
    deployed: Deployed, tenant
):
    """kill -9 of the runner's container through containerd mid-copy: the pod ends Failed, the
    janitor captures its log through the kubelet, relaunches a runner within its thresholds and
    the op ends succeeded with the same rows and checksums on both sides."""
    from tests.fixtures.pods import NODE_DIR

    t = tenant(tables=1500)
    sums_before = catalog_checksums(deployed.clusters.source, t.catalog.database)
    op_id = t.to_cnpg_target()
    wait_step(deployed, op_id, {"copying"}, 180)
    pod = runner_pod(op_id)
    assert pod is not None
    first_uid = pod["metadata"]["uid"]
    subprocess.run(
        ["ctr", "--address", str(NODE_DIR / "containerd" / "containerd.sock"), "-n", "k8s.io",
         "tasks", "kill", "-s", "KILL", container_id(pod)],
        check=True, capture_output=True,
    )  # fmt: skip
    killed_at = time.monotonic()
    op = deployed.api.wait_terminal(op_id, timeout=600)
    entries = deployed.api.log_entries(op_id)
    text = _messages(entries)
    assert op["state"] == "succeeded", (op, text[-4000:])
    assert op["runner_epoch"] >= 2, op
    assert f"captured from runner pod duckgres-reshard-op-{op_id} uid {first_uid}:" in text, text[
        -4000:
    ]
    assert any(e["source"] == "pod-log" for e in entries)
    assert catalog_checksums(deployed.clusters.target, t.catalog.database) == sums_before
    print(f"pods: relaunch after kill -9 took {time.monotonic() - killed_at:.1f} s to succeed")


def test_losing_the_api_replica_that_holds_the_stash_fails_cleanly(deployed: Deployed, tenant):
    """The API pod holding an external target's password is deleted before the runner pulls it:
    the pull fails, the op ends failed with the documented message, the warehouse is ready on
    its old binding (nothing stranded)."""
    t = tenant(rows=3)
    external = create_tenant_catalog(deployed.clusters.target, with_tables=False)
    deployed.put_secret_key(TENANT_SECRET, f"{t.org}-x", external.password)
    try:
        # Scale the workers down so no runner pod starts before the API pod is gone.
        kubectl("-n", NAMESPACE, "scale", "deploy/duckgres-admin-worker", "--replicas=0")
        wait_until(lambda: not deployed.pods("component=worker"), "workers gone", 120)
        op_id = t.start(
            {
                "type": "external",
                "endpoint": f"{NODE_IP}:{deployed.clusters.target.port}",
                "user": external.role,
                "database": external.database,
                "sslmode": "require",
                "password_secret_ref": f"k8s:{NAMESPACE}/{TENANT_SECRET}#{t.org}-x",
                "password": external.password,
            }
        )
        holder = deployed.one(
            "SELECT password_url FROM duckgres_reshard_operations WHERE id=%s", op_id
        )
        host = str(holder).split("//", 1)[1].split(":", 1)[0]
        [api_pod] = [p for p in deployed.pods("component=api") if p["status"]["podIP"] == host]
        kubectl("-n", NAMESPACE, "delete", "pod", api_pod["metadata"]["name"], "--wait=true",
                "--timeout=120s")  # fmt: skip
    finally:
        kubectl("-n", NAMESPACE, "scale", "deploy/duckgres-admin-worker", "--replicas=2")
    try:
        op = deployed.api.wait_terminal(op_id, timeout=400)
        text = _messages(deployed.api.log_entries(op_id))
        assert op["state"] == "failed", (op, text[-3000:])
        assert "password" in op["error"].lower(), op["error"]
        wh = deployed.api.get(f"warehouses/{t.org}").body
        assert wh["state"] == "ready"
        assert wh["metadata_store_name"] == "pods-source"
    finally:
        drop_tenant(deployed.clusters.target, external.role)


SCRATCH_ROLE = "duckgres_pods_scratch"


def _control_worker_metrics() -> str:
    """Every control-worker replica's exporter, concatenated: only the janitor leader sets the
    backup gauges, the others keep zero (dashboards and rules take the max)."""
    pods = kubectl_json("-n", NAMESPACE, "get", "pods", "-l", "component=control-worker")["items"]
    names = [p["metadata"]["name"] for p in pods if p["status"].get("phase") == "Running"]
    return "\n".join(scrape(name, "control-worker", 9108) for name in names)


def _never_tested(metrics: str) -> float:
    prefix = "duckgres_backup_never_tested_warehouses "
    return max((float(ln.split()[-1]) for ln in metrics.splitlines() if ln.startswith(prefix)),
               default=-1.0)  # fmt: skip


def _scratch_store(deployed: Deployed) -> None:
    """A cnpg store on the config store's server (5432), which serves no warehouse: the restore
    test refuses a store whose server does, unless told otherwise."""
    import psycopg
    from psycopg import sql

    password = secrets.token_urlsafe(24)
    with psycopg.connect(host="127.0.0.1", user="postgres", dbname="postgres",
                         autocommit=True, connect_timeout=10) as conn:  # fmt: skip
        conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(SCRATCH_ROLE)))
        conn.execute(
            sql.SQL("CREATE ROLE {} LOGIN CREATEDB CREATEROLE PASSWORD {}").format(
                sql.Identifier(SCRATCH_ROLE), sql.Literal(password)
            )
        )
    deployed.put_secret_key("duckgres-store-pods", "scratch", password)
    body = {
        "name": "pods-scratch", "kind": "cnpg", "host": NODE_IP, "port": 5432,
        "sslmode": "require", "tls_policy": "allow-weaker",
        "tls_policy_reason": "test clusters: the certificates name 127.0.0.1, not the node",
        "provisioner_user": SCRATCH_ROLE,
        "provisioner_password_ref": f"k8s:{NAMESPACE}/duckgres-store-pods#scratch",
    }  # fmt: skip
    resp = deployed.api.post("metadata-stores", body)
    assert resp.status == 201, (resp.status, resp.raw[:500])


@pytest.mark.safeguard("reshard-136")
@pytest.mark.safeguard("reshard-139")
def test_uncommenting_the_restore_test_switch_runs_a_restore_test_and_its_metric_appears(
    deployed: Deployed, tenant
):
    """docs/kubernetes.md "Settings": the day-two switch of k8s/base/configmap.yaml, set in the
    ConfigMap, reaches the processes after the documented restart; the restore test then runs
    in the default worker and the control worker exports its result."""
    t = tenant(rows=3)
    op_id = t.to_cnpg_target()
    op = deployed.api.wait_terminal(op_id, timeout=300)
    assert op["state"] == "succeeded", op
    # Before: the backup counts as never tested (DuckgresBackupNeverRestoreTested's series) and
    # has no verified age.
    wait_until(lambda: _never_tested(_control_worker_metrics()) >= 1, "the never-tested gauge",
               120, 5)  # fmt: skip
    series = f'duckgres_backup_newest_verified_age_seconds{{org_id="{t.org}"}}'
    assert series not in _control_worker_metrics()
    # Off: the request is refused and nothing is queued.
    resp = deployed.api.post(f"warehouses/{t.org}/backups/restore-test", {})
    assert resp.status == 409, (resp.status, resp.raw[:300])
    assert resp.body["code"] == "restore_test_disabled"

    _scratch_store(deployed)
    patch = json.dumps({"data": {"DUCKGRES_RESTORE_TEST_STORE": "pods-scratch"}})
    kubectl("-n", NAMESPACE, "patch", "configmap", "duckgres-admin", "--type=merge", "-p", patch)
    kubectl("-n", NAMESPACE, "rollout", "restart", "deployment")  # the docs' command, verbatim
    wait_rollouts(("duckgres-admin-api", "duckgres-admin-worker", "duckgres-admin-control-worker"))
    resp = wait_until(
        lambda: (r := deployed.api.post(f"warehouses/{t.org}/backups/restore-test", {}))
        and r.status != 503 and r,
        "the restarted API to take the request", 60, 2,
    )  # fmt: skip
    assert resp.status == 202, (resp.status, resp.raw[:500])

    def verified() -> Any:
        backups = deployed.api.get(f"warehouses/{t.org}/backups").body["backups"]
        return [b for b in backups if b.get("verified") is not None]

    [backup] = wait_until(verified, "the restore test's result", 300, 3)
    assert backup["verified"] is True, backup
    wait_until(lambda: series in _control_worker_metrics(), "the verified-age series", 120, 5)
    # The archive went through pg_restore in a sandbox pod of the runner namespace, never in
    # the worker (safeguard reshard-139); the pod is gone, its scheduling event stays.
    events = kubectl_json("-n", RUNNERS_NAMESPACE, "get", "events")["items"]
    sandbox = f"duckgres-restore-test-op{backup['op_id']}"
    assert any(e["involvedObject"]["name"] == sandbox for e in events), [
        e["involvedObject"]["name"] for e in events
    ]
    assert not kubectl("-n", RUNNERS_NAMESPACE, "get", "pod,secret", sandbox,
                       "--ignore-not-found", "-o", "name").strip()  # fmt: skip


# Last of the suite: it evicts every pod of the node, the control plane's included.
def test_a_node_drain_mid_copy_rolls_back_in_the_grace_and_the_control_plane_returns(
    deployed: Deployed, tenant
):
    """docs/kubernetes.md "Node drain", verbatim on the one-node cluster while a reshard copies:
    the runner pod is evicted with its 600 s grace and rolls back, the control plane comes back
    after the uncordon, and the operation ends consistent (failed, source serving, rows intact)."""
    t = tenant(tables=1500)
    rows_before = t.catalog.row_counts()
    op_id = t.to_cnpg_target()
    wait_step(deployed, op_id, {"copying"}, 180)
    node = kubectl_json("get", "nodes")["items"][0]["metadata"]["name"]
    drain = documented_command("drain <node>", section="Node drain").split()[1:]
    words = [node if w == "<node>" else w for w in drain]
    started = time.monotonic()
    try:
        kubectl(*words, timeout=900)
    finally:
        kubectl("uncordon", node)
    took = time.monotonic() - started
    assert runner_pod(op_id) is None
    wait_rollouts(DEPLOYMENTS)
    wait_until(lambda: deployed.api.answers("warehouses"), "the API after the drain", 120)
    op = deployed.api.wait_terminal(op_id, timeout=300)
    text = _messages(deployed.api.log_entries(op_id))
    assert op["state"] in ("failed", "cancelled"), (op, text[-3000:])
    assert "SIGTERM" in text, text[-3000:]
    assert took < 600 + 120
    wh = deployed.api.get(f"warehouses/{t.org}").body
    assert (wh["state"], wh["writable"], wh["metadata_store_name"]) == (
        "ready",
        True,
        "pods-source",
    )
    assert t.catalog.row_counts() == rows_before
