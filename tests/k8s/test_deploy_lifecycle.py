"""The deploy lifecycle as shipped: ``kubectl apply -k k8s/``, the migration Job, the
wait-for-migrations init containers, the Secret kept out of the applied set, the first admin.

``kubectl kustomize`` is kubectl's own built-in kustomize (what ``kubectl apply -k`` runs).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
import yaml
from django.contrib.auth import get_user_model

from tests.fixtures.docs import documented_command
from tests.fixtures.manifests import (
    BASE_DIR,
    DOCS,
    K8S_DIR,
    RUNNERS_DIR,
    applied_files,
    deployments,
    images,
    kustomize,
    one,
)
from tests.fixtures.processes import child_config_store_dsn, process_env

ROOT = K8S_DIR.parent


def test_apply_k_installs_every_top_level_manifest_and_nothing_else():
    listed = set(applied_files())
    on_disk = {
        p
        for d in (BASE_DIR, RUNNERS_DIR)
        for p in d.glob("*.yaml")
        if p.name != "kustomization.yaml"
    }
    assert listed == on_disk, "every k8s/{base,runners}/*.yaml is applied by -k, and only those"
    rendered = {(d["kind"], d["metadata"]["name"]) for d in kustomize(K8S_DIR)}
    assert rendered == {(d["kind"], d["metadata"]["name"]) for d in DOCS}
    assert images(kustomize(K8S_DIR)) == {"duckgres-admin:0.1.0"}


def test_the_secret_is_a_template_outside_the_applied_set():
    """Applying the install must never overwrite the operator's real Secret with empty values."""
    assert not [d for d in DOCS if d["kind"] == "Secret"]
    [template] = list(yaml.safe_load_all((K8S_DIR / "templates" / "secret.yaml").read_text()))
    assert template["kind"] == "Secret"
    assert "data" not in template
    assert set(template["stringData"].values()) == {""}


def test_setting_the_image_once_changes_every_container(tmp_path):
    copy = tmp_path / "k8s"
    shutil.copytree(K8S_DIR, copy)
    kustomization = yaml.safe_load((copy / "kustomization.yaml").read_text())
    kustomization["images"] = [
        {"name": "duckgres-admin", "newName": "registry.example/duckgres-admin", "newTag": "9.9.9"}
    ]
    (copy / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    assert images(kustomize(copy)) == {"registry.example/duckgres-admin:9.9.9"}


def test_every_deployment_waits_for_the_migrations_first():
    for deployment in deployments():
        spec = deployment["spec"]["template"]["spec"]
        name = deployment["metadata"]["name"]
        [init] = spec["initContainers"]
        assert init["command"][:3] == ["python", "manage.py", "wait_for_migrations"], name
        assert init["image"] == spec["containers"][0]["image"], name
        # It reads the schema only: the config store and the settings' key, nothing else secret.
        refs = {e["name"] for e in init["env"] if "valueFrom" in e}
        assert refs == {"DJANGO_SECRET_KEY", "DUCKGRES_CONFIG_STORE"}, name
        assert init["securityContext"]["allowPrivilegeEscalation"] is False
        assert init["securityContext"]["capabilities"] == {"drop": ["ALL"]}


def test_the_migration_job_migrates_with_the_config_store_only():
    job = one("Job", "duckgres-admin-migrate")
    pod = job["spec"]["template"]["spec"]
    assert pod["restartPolicy"] == "Never"
    assert pod["automountServiceAccountToken"] is False
    [container] = pod["containers"]
    assert container["command"] == ["python", "manage.py", "migrate", "--no-input"]
    refs = {e["name"] for e in container["env"] if "valueFrom" in e}
    assert refs == {"DJANGO_SECRET_KEY", "DUCKGRES_CONFIG_STORE"}
    assert pod["securityContext"]["runAsUser"] == 10001


def _manage(
    *args: str, env: dict[str, str], timeout: float = 60, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *args],
        cwd=ROOT,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.mark.django_db(transaction=True)
def test_wait_for_migrations_returns_at_once_on_a_migrated_schema():
    result = _manage("wait_for_migrations", "--timeout=30", env=process_env())
    assert result.returncode == 0, result.stderr
    assert "schema is migrated" in result.stderr


def _psql(sql: str) -> None:
    subprocess.run(
        ["psql", "-h", "127.0.0.1", "-U", "postgres", "-d", "postgres", "-qAtc", sql], check=True
    )


def test_wait_for_migrations_gives_up_at_its_deadline_and_says_why():
    """An empty database (no migration applied): the init container fails, naming the Job."""
    dsn = child_config_store_dsn()
    dbname = f"duckgres_unmigrated_{os.getpid()}"
    current = dsn.split("?", 1)[0].rsplit("/", 1)[1]
    _psql(f"DROP DATABASE IF EXISTS {dbname}")
    _psql(f"CREATE DATABASE {dbname}")
    try:
        env = process_env(DUCKGRES_CONFIG_STORE=dsn.replace(f"/{current}?", f"/{dbname}?"))
        result = _manage("wait_for_migrations", "--timeout=3", "--interval=1", env=env)
        assert result.returncode == 1
        lines = result.stderr.splitlines()
        assert any("waiting for the migration Job" in line for line in lines)
        assert any("duckgres-admin-migrate" in line for line in lines)
    finally:
        _psql(f"DROP DATABASE IF EXISTS {dbname} WITH (FORCE)")


def documented_first_admin_command() -> list[str]:
    """The ``manage.py`` part of docs/kubernetes.md step 5, as an operator pastes it."""
    words = documented_command("manage.py create_first_admin").split()
    return words[words.index("manage.py") + 1 : words.index("<")]


@pytest.mark.django_db(transaction=True)
def test_the_documented_first_admin_command_creates_the_admin_once():
    args = documented_first_admin_command()
    assert args[0] == "create_first_admin"
    assert "--password-stdin" in args
    args = [a.replace("alice", "first-admin") for a in args]
    first = _manage(*args, env=process_env(), stdin="a-long-first-admin-password-1234\n")
    assert first.returncode == 0, first.stderr
    user = get_user_model().objects.get(username="first-admin")
    assert user.is_superuser
    assert user.is_staff
    assert user.check_password("a-long-first-admin-password-1234")
    # A second run never changes the existing admin: it fails and says why.
    second = _manage(*args, env=process_env(), stdin="another-password-that-must-not-win-5678\n")
    assert second.returncode != 0
    assert "already exists" in second.stderr
    user.refresh_from_db()
    assert user.check_password("a-long-first-admin-password-1234")


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("stdin", "message"),
    [
        ("", "no password on standard input"),
        ("short\n", "the password is refused"),
        ("two\nlines-of-a-long-password\n", "must be one line"),
    ],
)
def test_a_refused_first_admin_password_creates_nobody(stdin: str, message: str):
    result = _manage(
        "create_first_admin", "--username=nobody", "--email=n@example.test", "--password-stdin",
        env=process_env(), stdin=stdin,
    )  # fmt: skip
    assert result.returncode != 0
    assert message in result.stderr
    assert not get_user_model().objects.filter(username="nobody").exists()


@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    "command",
    [
        ("migrate", "--check"),
        ("wait_for_migrations", "--timeout=10"),
        ("create_first_admin", "--username=job-admin", "--email=job@ex.test", "--password-stdin"),
    ],
)
def test_the_schema_jobs_run_with_only_the_config_store_and_the_key(command):
    """The migration Job and the init containers get exactly two secrets (no shared secret, no
    broker): the commands they run, and the first admin's, must start with only those."""
    env = {
        "PATH": os.environ["PATH"],
        "PYTHONPATH": str(ROOT),
        "DJANGO_SECRET_KEY": "schema-job-key-" + "k" * 40,
        "DUCKGRES_CONFIG_STORE": child_config_store_dsn(),
    }
    result = _manage(*command, env=env, stdin="a-long-job-admin-password-0000\n")
    assert result.returncode == 0, result.stderr[-2000:]


# --- upgrades (docs/kubernetes.md "Upgrade") ---------------------------------------------------


def test_every_apply_path_re_creates_the_migration_job_without_a_hand_step():
    job = one("Job", "duckgres-admin-migrate")
    annotations = job["metadata"]["annotations"]
    # Argo CD: a hook is not tracked for drift, and is deleted before its next creation.
    assert annotations["argocd.argoproj.io/hook"] == "PreSync"
    assert annotations["argocd.argoproj.io/hook-delete-policy"] == "BeforeHookCreation"
    # Flux: an immutable field change re-creates the object instead of failing the apply.
    assert annotations["kustomize.toolkit.fluxcd.io/force"] == "enabled"
    # No TTL: a Job that vanished by itself would be re-created (and re-run) by a GitOps tool.
    assert "ttlSecondsAfterFinished" not in job["spec"]
    upgrade = (ROOT / "docs" / "kubernetes.md").read_text().split("## Upgrade", 1)[1]
    upgrade = upgrade.split("\n## ", 1)[0]
    assert "kubectl apply -k k8s/ --force" in upgrade
    assert "delete job" not in upgrade


def test_beat_starts_its_successor_before_it_stops():
    strategy = one("Deployment", "duckgres-admin-beat")["spec"]["strategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


def test_the_changelog_lists_every_migration_since_the_first_installs():
    changelog = (ROOT / "CHANGELOG.md").read_text()
    numbers = sorted(
        path.name[:4] for path in (ROOT / "duckgres_admin" / "migrations").glob("0*.py")
    )
    listed = [n for n in numbers if n >= "0020"]
    missing = [n for n in listed if n not in changelog]
    assert missing == [], f"CHANGELOG.md names no upgrade or rollback note for {missing}"
