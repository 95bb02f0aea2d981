"""Every key of the shipped ConfigMap reaches the processes that read it (issue 26 item 1;
docs/kubernetes.md "Settings"), checked on the manifests ``kubectl apply -k k8s/`` applies.

A key an operator uncomments in ``k8s/base/configmap.yaml`` must (1) be a setting the product reads
and (2) reach every control-plane process without a JSON patch: each Deployment takes the whole
ConfigMap with ``envFrom``. Keys a runner pod inherits must also be explicit ``env`` entries of
the launching workers, since the pod launcher copies only those.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from reshard.launchers.envcontract import ALLOWLIST
from tests.fixtures.manifests import BASE_DIR, deployments, env_of, one

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("duckgres_admin", "reshard", "trino_pools")
LAUNCHING = ("duckgres-admin-worker", "duckgres-admin-control-worker")
_KEY = re.compile(r"^  (?:# )?([A-Z][A-Z0-9_]+): ", re.MULTILINE)


def shipped_keys() -> set[str]:
    """The keys of the ``duckgres-admin`` ConfigMap, commented-out ones included."""
    text = (BASE_DIR / "configmap.yaml").read_text().split("\n---", 1)[0]
    return set(_KEY.findall(text))


def _read_by_product(key: str) -> bool:
    needle = f'"{key}"'
    return any(
        needle in path.read_text(errors="replace")
        for package in PRODUCT
        for path in (ROOT / package).rglob("*.py")
        if "migrations" not in path.parts
    )


def test_the_shipped_keys_include_the_commented_day_two_switches() -> None:
    keys = shipped_keys()
    assert set(one("ConfigMap", "duckgres-admin")["data"]) <= keys
    # Commented out in the file; read by the default worker once uncommented.
    assert {"DUCKGRES_BACKUP_RETENTION_ENABLED", "DUCKGRES_RESTORE_TEST_STORE"} <= keys


def test_every_shipped_key_is_a_setting_the_product_reads() -> None:
    unread = sorted(key for key in shipped_keys() if not _read_by_product(key))
    assert unread == [], f"k8s/base/configmap.yaml offers keys nothing reads: {unread}"


def test_no_shipped_value_spells_the_namespace() -> None:
    """kustomize's namespace transformer rewrites metadata, never a ConfigMap value: a value
    naming ``duckgres`` as a namespace would follow no overlay that moves the control plane."""
    namespace = one("Namespace", "duckgres")["metadata"]["name"]
    spelled = re.compile(rf"(?:\.{namespace}\.svc|k8s:{namespace}/)")
    for path in sorted(BASE_DIR.glob("*.yaml")):
        for doc in path.read_text().split("\n---"):
            if "kind: ConfigMap" not in doc:
                continue
            values = [line for line in doc.splitlines() if _KEY.match(line + " ")]
            offending = [line.strip() for line in values if spelled.search(line)]
            assert offending == [], f"{path.name}: {offending}"


@pytest.mark.safeguard("reshard-136")
def test_every_control_plane_process_takes_the_whole_config_map_and_its_own_extras() -> None:
    for deployment in deployments():
        name = deployment["metadata"]["name"]
        sources = deployment["spec"]["template"]["spec"]["containers"][0]["envFrom"]
        assert sources[0] == {"configMapRef": {"name": "duckgres-admin"}}, name
        component = name.removeprefix("duckgres-admin-")
        extras = [
            {"configMapRef": {"name": f"duckgres-admin-{component}-extra", "optional": True}},
            {"secretRef": {"name": f"duckgres-admin-{component}-extra", "optional": True}},
        ]
        assert sources[-2:] == extras, name  # last: they override the shared ConfigMap
        # An explicit env entry would win over envFrom: only the runner's names, the secrets
        # and the downward API are listed, so every other key can be changed in the ConfigMap.
        for key, entry in env_of(deployment).items():
            ref = (entry.get("valueFrom") or {}).get("configMapKeyRef")
            assert ref is None or key in ALLOWLIST, (name, key)


def test_the_keys_a_runner_inherits_are_explicit_on_the_launching_workers() -> None:
    inherited = sorted(shipped_keys() & set(ALLOWLIST))
    assert inherited, "the ConfigMap carries runner settings (log level, AWS region, S3)"
    for name in LAUNCHING:
        env = env_of(one("Deployment", name))
        for key in inherited:
            assert env[key]["valueFrom"]["configMapKeyRef"]["key"] == key, (name, key)


def test_the_default_worker_has_a_liveness_probe_that_pings_its_own_node() -> None:
    """Issue 26 item 4: the prefork default worker is restarted when its main process stops
    answering; the solo workers (janitor, Trino) get none (docs/kubernetes.md "Probes")."""
    worker = one("Deployment", "duckgres-admin-worker")["spec"]["template"]["spec"]
    probe = worker["containers"][0]["livenessProbe"]
    assert probe["exec"]["command"][:2] == ["sh", "-c"]
    assert 'inspect ping --destination "celery@$HOSTNAME"' in probe["exec"]["command"][2]
    assert probe["periodSeconds"] * probe["failureThreshold"] >= 300
    assert probe["timeoutSeconds"] > 10  # above the ping's own --timeout
    for name in ("duckgres-admin-control-worker", "duckgres-admin-trino-worker"):
        spec = one("Deployment", name)["spec"]["template"]["spec"]
        assert "livenessProbe" not in spec["containers"][0], name
