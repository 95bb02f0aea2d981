"""Process environment for the test suite, set before Django configures itself.

Every value is a test default (``setdefault``), so CI or a developer can point the suite at
other services. Thresholds are shortened through the spec's settings, never by sleeping.
"""

import os

TEST_ENV = {
    "DJANGO_SETTINGS_MODULE": "duckgres_admin.settings",
    "DJANGO_SECRET_KEY": "test-only-django-secret-key-0123456789abcdef",
    "DUCKGRES_CONFIG_STORE": "postgresql://postgres@127.0.0.1:5432/duckgres_admin?sslmode=prefer",
    "DUCKGRES_BROKER_URL": "redis://127.0.0.1:6379/5",
    "DUCKGRES_INTERNAL_SECRET": "test-internal-secret-0123456789abcdefghijkl",
    "DUCKGRES_RUNNER_SECRET": "test-runner-secret-0123456789abcdefghijklmno",
    "DUCKGRES_DATAPLANE_SECRET": "test-dataplane-secret-0123456789abcdefghijk",
    "DUCKGRES_RESHARD_LAUNCHER": "local",
    "DUCKGRES_CONFIG_POLL_INTERVAL": "1",
    "DUCKGRES_RESHARD_POLL_SECONDS": "1",
    "DUCKGRES_RESHARD_HEARTBEAT_SECONDS": "1",
    "DUCKGRES_RESHARD_STALE_SECONDS": "62",
    "DUCKGRES_CONTROL_METRICS_PORT": "0",
    # Test services (.ci/services.sh): the provisioner login on the store clusters 5433/5434
    # (same default as the script) and the real kube-apiserver.
    "DUCKGRES_TEST_PROVISIONER_PASSWORD": "ci-provisioner-password-4f1e2d3c",
    "DUCKGRES_TEST_KUBE_URL": "https://127.0.0.1:16443",
    "DUCKGRES_TEST_KUBE_TOKEN": "ci-token",
}
for _key, _value in TEST_ENV.items():
    os.environ.setdefault(_key, _value)

# One test database per pytest process, so that concurrent runs on one machine (developers,
# agents) never drop each other's database. Stale ones are dropped by tests/conftest.py.
os.environ.setdefault("DUCKGRES_TEST_DATABASE", f"test_duckgres_admin_{os.getpid()}")
