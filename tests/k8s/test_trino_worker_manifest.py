"""The trino worker's manifest (k8s/base/trino-worker.yaml): its metrics exporter and the Trino
variables (spec trino-pools §6.1, §7). The strict schema check and the server-side dry run of
every manifest are in ``test_manifests.py``."""

from __future__ import annotations

from tests.fixtures.manifests import BASE_DIR, env_of, one
from trino_pools import config

TRINO_VARIABLES = {
    "DUCKGRES_TRINO_CELLS_FILE",
    "DUCKGRES_TRINO_DEFAULT_CELL",
    "DUCKGRES_TRINO_POOL_ENABLED",
    "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED",
    "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED",
    "DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE",
    "DUCKGRES_TRINO_POOL_CATALOG_SCHEMA",
    "DUCKGRES_TRINO_POOL_CATALOG_BOOTSTRAP",
    "DUCKGRES_TRINO_POOL_GATEWAY_URL",
    "DUCKGRES_TRINO_MANAGED_GATEWAY_URL",
    "DUCKGRES_TRINO_MANAGED_GATEWAY_SERVER_NAME",
    "DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE",
    "DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP",
    "DUCKGRES_TRINO_POOL_CONFIG_NAMESPACE",
    "DUCKGRES_TRINO_POOL_CONFIG_REGISTRY_KEY",
    "DUCKGRES_TRINO_POOL_PUBLISHER_IMAGE",
    "DUCKGRES_TRINO_POOL_NODE_DISRUPTION_ENABLED",
    "DUCKGRES_TRINO_AWS_REGION",
    "DUCKGRES_TRINO_TENANT_SECRET_MOUNT_PATH",
    "DUCKGRES_TRINO_S3_MAX_CONNECTIONS",
    "DUCKGRES_TRINO_FILESYSTEM_CACHE_ENABLED",
    "DUCKGRES_TRINO_MANAGED_HOGLAKE_URI",
    "DUCKGRES_TRINO_HOGLAKE_DATA_PATH",
    "DUCKGRES_TRINO_HOGLAKE_NAMESPACE",
    "DUCKGRES_TRINO_SERVICE_AUTH_SECRET_FILE",
}


def _trino_worker() -> dict:  # type: ignore[type-arg]
    return one("Deployment", "duckgres-admin-trino-worker")


def test_the_exporter_port_is_named_scraped_and_matches_the_configured_default():
    deployment = _trino_worker()
    template = deployment["spec"]["template"]
    [container] = template["spec"]["containers"]
    assert container["ports"] == [
        {"name": "metrics", "containerPort": config.DEFAULT_METRICS_PORT, "protocol": "TCP"}
    ]
    env = env_of(deployment)
    assert env["DUCKGRES_TRINO_METRICS_PORT"] == {
        "name": "DUCKGRES_TRINO_METRICS_PORT",
        "value": str(config.DEFAULT_METRICS_PORT),
    }
    assert template["metadata"]["annotations"] == {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(config.DEFAULT_METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }
    # Its own port: the control worker's exporter (9108) never shows the Trino metrics.
    control = one("Deployment", "duckgres-admin-control-worker")["spec"]["template"]["spec"]
    assert control["containers"][0]["ports"][0]["containerPort"] != config.DEFAULT_METRICS_PORT
    service = one("Service", "duckgres-admin-trino-worker")["spec"]
    assert service["selector"] == template["metadata"]["labels"]
    assert service["ports"] == [
        {
            "name": "metrics",
            "port": config.DEFAULT_METRICS_PORT,
            "targetPort": "metrics",
            "protocol": "TCP",
        }
    ]


CONTROL_PLANE = (
    "duckgres-admin-api",
    "duckgres-admin-worker",
    "duckgres-admin-control-worker",
    "duckgres-admin-beat",
    "duckgres-admin-trino-worker",
)


def test_every_control_plane_process_gets_the_same_trino_configuration():
    """Each process validates Trino at start, so all of them read the same optional sources."""
    for name in CONTROL_PLANE:
        spec = one("Deployment", name)["spec"]["template"]["spec"]
        [container] = spec["containers"]
        component = name.removeprefix("duckgres-admin-")
        assert container["envFrom"] == [
            {"configMapRef": {"name": "duckgres-admin"}},
            {"configMapRef": {"name": "duckgres-admin-trino", "optional": True}},
            {"configMapRef": {"name": f"duckgres-admin-{component}-extra", "optional": True}},
            {"secretRef": {"name": f"duckgres-admin-{component}-extra", "optional": True}},
        ], name
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        assert mounts["trino-registry"]["mountPath"] == "/etc/duckgres/trino/registry", name
        assert mounts["trino-secrets"]["mountPath"] == "/etc/duckgres/trino/secrets", name
        # The Trino sources are read-only; /tmp (the read-only root's scratch space) is not.
        assert all(mounts[n]["readOnly"] for n in ("trino-registry", "trino-secrets")), name
        assert set(mounts) == {"trino-registry", "trino-secrets", "tmp"}, name
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes["trino-registry"]["configMap"] == {
            "name": "duckgres-admin-trino-registry",
            "optional": True,
        }, name
        assert volumes["trino-secrets"]["secret"] == {
            "secretName": "duckgres-admin-trino",
            "optional": True,
        }, name
    declared = {n for n in env_of(_trino_worker()) if n.startswith("DUCKGRES_TRINO_")}
    assert declared == {"DUCKGRES_TRINO_METRICS_PORT"}, "Trino variables come only via envFrom"


def test_the_shipped_trino_configmap_example_names_every_variable():
    example = (BASE_DIR / "configmap.yaml").read_text()
    missing = sorted(name for name in TRINO_VARIABLES if f"#   {name}:" not in example)
    assert missing == []


def test_no_manifest_carries_a_retired_trino_variable():
    retired = set(config.RETIRED_VARIABLES) | set(config.OLDER_RETIRED_VARIABLES)
    retired |= set(config.UNSUPPORTED_VARIABLES)
    for path in sorted(BASE_DIR.glob("*.yaml")):
        text = path.read_text()
        for name in retired:
            assert name not in text, f"{path.name} mentions the retired {name}"
