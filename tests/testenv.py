"""Process environment for the test suite, set before Django configures itself.

Every value is a test default (``setdefault``), so CI or a developer can point the suite at
other services. Thresholds are shortened through the spec's settings, never by sleeping.

Concurrent pytest runs on one machine (developers, agents) are isolated: each process gets its
own test database (``test_duckgres_admin_<pid>``) and its own Redis db for the Celery broker.
"""

import os

# One Redis db per pytest process (unless DUCKGRES_BROKER_URL is set): a Celery worker of a
# concurrent run must never take this run's launch messages. A db is claimed with an owner key
# (SET NX); the claim of a dead process is taken over. Redis down: db 5.
BROKER_OWNER_KEY = "duckgres-tests:broker-owner"
BROKER_DBS = range(5, 16)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _claim_broker_db() -> int:
    try:
        import redis
    except ImportError:
        return 5
    me = str(os.getpid())
    for db in BROKER_DBS:
        client = redis.Redis(host="127.0.0.1", port=6379, db=db, socket_timeout=1)
        try:
            if client.set(BROKER_OWNER_KEY, me, nx=True):
                return db
            owner = client.get(BROKER_OWNER_KEY)
            stale = owner is not None and owner.isdigit() and not _alive(int(owner))
            if stale and client.getset(BROKER_OWNER_KEY, me) == owner:
                client.flushdb()
                client.set(BROKER_OWNER_KEY, me)
                return db
        except redis.RedisError:
            return 5
        finally:
            client.close()
    return 5


# pytest-xdist workers inherit their controller's environment, so without this every worker
# would share the db the controller claimed, and one worker's Celery workers (or the factory's
# flush) would take another's messages. A db this module claimed is marked with the pytest
# process it is for (``""``: not an xdist worker); a worker that inherited another's claims
# its own. A DUCKGRES_BROKER_URL set by the caller carries no mark and is kept.
_XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER", "")
if os.environ.get("DUCKGRES_TEST_BROKER_FOR", _XDIST_WORKER) != _XDIST_WORKER:
    os.environ.pop("DUCKGRES_BROKER_URL", None)
if "DUCKGRES_BROKER_URL" not in os.environ:
    os.environ["DUCKGRES_TEST_BROKER_FOR"] = _XDIST_WORKER

TEST_ENV = {
    "DJANGO_SETTINGS_MODULE": "duckgres_admin.settings",
    "DJANGO_SECRET_KEY": "test-only-django-secret-key-0123456789abcdef",
    "DUCKGRES_CONFIG_STORE": "postgresql://postgres@127.0.0.1:5432/duckgres_admin?sslmode=prefer",
    "DUCKGRES_BROKER_URL": os.environ.get("DUCKGRES_BROKER_URL")
    or f"redis://127.0.0.1:6379/{_claim_broker_db()}",
    "DUCKGRES_INTERNAL_SECRET": "test-internal-secret-0123456789abcdefghijkl",
    "DUCKGRES_RUNNER_SECRET": "test-runner-secret-0123456789abcdefghijklmno",
    "DUCKGRES_DATAPLANE_SECRET": "test-dataplane-secret-0123456789abcdefghijk",
    "DUCKGRES_RESHARD_LAUNCHER": "local",
    "DUCKGRES_CONFIG_POLL_INTERVAL": "1",
    "DUCKGRES_RESHARD_POLL_SECONDS": "1",
    "DUCKGRES_RESHARD_HEARTBEAT_SECONDS": "1",
    "DUCKGRES_RESHARD_STALE_SECONDS": "62",
    "DUCKGRES_CONTROL_METRICS_PORT": "0",
    # The janitor's upload sweep lists every warehouse's bucket: off unless a test turns it on.
    "DUCKGRES_RESHARD_UPLOAD_SWEEP_SECONDS": "0",
    # Test services (.ci/services.sh): the provisioner login on the store clusters 5433/5434
    # (same default as the script) and the real kube-apiserver.
    "DUCKGRES_TEST_PROVISIONER_PASSWORD": "ci-provisioner-password-4f1e2d3c",
    "DUCKGRES_TEST_KUBE_URL": "https://127.0.0.1:16443",
    "DUCKGRES_TEST_KUBE_TOKEN": "ci-token",
    # Secret references the tests may name (docs/configuration.md): the fixtures' variables
    # (DUCKGRES_TEST_PROVISIONER_PASSWORD, DUCKGRES_TEST_PW_<tenant>, secret_env's
    # DUCKGRES_TEST_SECRET_*) and the literal names and Secrets some API tests use.
    "DUCKGRES_SECRET_REF_ALLOW_PROVISIONER": "env:DUCKGRES_TEST_*,env:PROV_PW,k8s:duckgres/shard-*",
    "DUCKGRES_SECRET_REF_ALLOW_TENANT": (
        "env:DUCKGRES_TEST_*,env:ACME_PW,env:EXT_PW,env:TENANT_PW,env:TENANT_PASSWORD,"
        "env:CONTRACT_TENANT_PASSWORD,env:X,k8s:duckgres/acme*,k8s:tenants/*"
    ),
}
for _key, _value in TEST_ENV.items():
    os.environ.setdefault(_key, _value)

# The test CA (.ci/test-ca.sh): once it has issued the store clusters' certificates, every
# metadata-store connection of the product verifies them (DUCKGRES_STORE_SSLROOTCERT), as in
# production. Without it (the script was not run) the clusters' self-signed certificates are
# used with sslmode=require and no verification, and the verify-full tests skip.
TEST_CA = os.path.join(os.environ.get("CI_STATE_DIR", "/var/tmp/duckgres-ci"), "ca", "ca.crt")
if os.path.isfile(TEST_CA):
    os.environ.setdefault("DUCKGRES_STORE_SSLROOTCERT", TEST_CA)

# One test database per pytest process, so that concurrent runs never drop each other's
# database. Databases of dead processes are dropped by tests/conftest.py at session start.
os.environ.setdefault("DUCKGRES_TEST_DATABASE", f"test_duckgres_admin_{os.getpid()}")
