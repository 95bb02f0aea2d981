"""Django settings for Duckgres Admin, parsed strictly from the environment (spec reshard §6).

A bad value refuses to start the process (``ImproperlyConfigured``) naming the variable; there
is no silent fallback (no eager Celery, no default broker, no default config store).
"""

from __future__ import annotations

import ipaddress
import secrets
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

import django_stubs_ext
from psycopg.conninfo import conninfo_to_dict

from duckgres_admin.api import admission
from duckgres_admin.housekeeping import policy as retention_policy
from duckgres_admin.lib import endpoints, secretrefs
from duckgres_admin.notifications import config as webhook_config
from duckgres_admin.platform import queues
from duckgres_admin.platform.config import EnvReader, environ
from reshard.backups import retention

django_stubs_ext.monkeypatch()

BASE_DIR = Path(__file__).resolve().parent.parent
env = EnvReader(environ())

# The runner (`manage.py reshard_runner`) needs only the runner secret; every other process
# needs all three shared secrets.
IS_RUNNER = len(sys.argv) > 1 and sys.argv[1] == "reshard_runner"
# `manage.py collectstatic` runs at image build, where there is no secret, config store or
# broker: it requires none of them (a value that is set and bad is still refused).
IS_COLLECTSTATIC = len(sys.argv) > 1 and sys.argv[1] == "collectstatic"
# The restore test's sandbox (`manage.py restore_stream`, reshard/engines/restore/sandbox.py):
# streams one backup into pg_restore and nothing else. It gets no config store, no shared secret, no
# signing key and no broker: only the scratch login and an S3 session for that one object.
IS_SANDBOX = len(sys.argv) > 1 and sys.argv[1] == "restore_stream"
# The schema commands (the migration Job, the init containers' wait, the first admin's) touch
# only the config store: they need DJANGO_SECRET_KEY and DUCKGRES_CONFIG_STORE, never a shared
# secret or the broker, so that Job and the init containers are not given them.
SCHEMA_COMMANDS = frozenset(
    {"migrate", "wait_for_migrations", "createsuperuser", "create_first_admin"}
)
IS_SCHEMA_COMMAND = len(sys.argv) > 1 and sys.argv[1] in SCHEMA_COMMANDS

# A runner signs nothing (no session, cookie, CSRF token or password hash), so it is never given
# Django's signing key (issue 25 item 3): a key drawn for the process satisfies Django, and
# whatever DJANGO_SECRET_KEY an older launcher still passes is not read.
if IS_RUNNER or IS_SANDBOX:
    SECRET_KEY = secrets.token_urlsafe(64)
    SECRET_KEY_FALLBACKS: list[str] = []
else:
    SECRET_KEY = env.string("DJANGO_SECRET_KEY", required=not IS_COLLECTSTATIC)
    # Rotation with an overlap window, as for the shared secrets: the previous key still verifies
    # what it signed (sessions, CSRF tokens, password-reset links) while new signatures use
    # DJANGO_SECRET_KEY; unset it once the sessions signed with it have expired.
    _previous_key = env.string("DJANGO_SECRET_KEY_PREVIOUS")
    SECRET_KEY_FALLBACKS = [_previous_key] if _previous_key else []
DEBUG = env.boolean("DUCKGRES_DEBUG", False)

# --- config store -------------------------------------------------------------------------
_config_store = env.string("DUCKGRES_CONFIG_STORE", required=not (IS_COLLECTSTATIC or IS_SANDBOX))
_db: dict[str, Any] = {}
if _config_store:
    try:
        _db = conninfo_to_dict(_config_store)
    except Exception:  # noqa: BLE001 - the message must never echo the DSN (it may hold a password)
        env.errors.append(
            "DUCKGRES_CONFIG_STORE is not a valid PostgreSQL DSN "
            "(postgresql://user@host:port/db?sslmode=...)"
        )
if _db and not str(_db.get("port") or "5432").isdigit():
    env.errors.append("DUCKGRES_CONFIG_STORE has a port that is not a number")
    _db = {}
_db_options = {
    k: v
    for k, v in _db.items()
    if k not in {"dbname", "user", "password", "host", "port"} and v is not None
}
# Only a writable server is a config store: after a failover a new connection never lands on
# a standby that the DSN's host still names (the DSN may set its own value).
_db_options.setdefault("target_session_attrs", "read-write")
# Persistent connections (docs/configuration.md): each thread that served a request keeps its
# connection for this long (0: a new connection per request; bounded by the threads, 16 per API
# process), and checks it with a round trip before it reuses it in the next request, so a
# connection the server closed (failover, restart, pg_terminate_backend) is replaced, never
# handed to a view. A connection whose request raised a database error is closed after it.
DUCKGRES_CONFIG_STORE_CONN_MAX_AGE = env.integer(
    "DUCKGRES_CONFIG_STORE_CONN_MAX_AGE", 60, minimum=0, maximum=3600
)
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _db.get("dbname", "duckgres_admin"),
        "USER": _db.get("user", ""),
        "PASSWORD": _db.get("password", ""),
        "HOST": _db.get("host", ""),
        "PORT": str(_db.get("port", "")),
        "OPTIONS": {"application_name": "duckgres-admin", **_db_options},
        "CONN_MAX_AGE": DUCKGRES_CONFIG_STORE_CONN_MAX_AGE,
        "CONN_HEALTH_CHECKS": True,
        "TEST": {"NAME": env.string("DUCKGRES_TEST_DATABASE", "") or None},
    }
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# --- shared secrets (spec §5, §6) -------------------------------------------------------------
SECRET_MIN_LENGTH = 32
_SHARED_SECRETS = (
    "DUCKGRES_INTERNAL_SECRET",
    "DUCKGRES_RUNNER_SECRET",
    "DUCKGRES_DATAPLANE_SECRET",
)
if IS_COLLECTSTATIC or IS_SCHEMA_COMMAND or IS_SANDBOX:
    _required: set[str] = set()
elif IS_RUNNER:
    # A runner needs the runner secret only when it must pull a password (spec §6).
    _required = {"DUCKGRES_RUNNER_SECRET"} if env.string("DUCKGRES_RESHARD_PASSWORD_URL") else set()
else:
    _required = set(_SHARED_SECRETS)
_secrets: dict[str, str] = {}
for _name in _SHARED_SECRETS:
    _value = env.string(_name, required=_name in _required)
    if _value and len(_value) < SECRET_MIN_LENGTH:
        env.errors.append(f"{_name} must be at least {SECRET_MIN_LENGTH} characters")
    if _value:
        _secrets[_name] = _value
_seen: dict[str, str] = {}
for _name, _value in _secrets.items():
    if _value in _seen:
        env.errors.append(f"{_seen[_value]} and {_name} are equal: the three secrets must differ")
    _seen[_value] = _name
# Rotation with an overlap window (docs/configuration.md "Rotating a shared secret"): the API
# also accepts <NAME>_PREVIOUS while it is set. Never required, never sent by our own clients;
# as long as, and as distinct from every other secret as, the current values.
_previous: dict[str, str] = {}
for _name in _SHARED_SECRETS:
    _prev_name = f"{_name}_PREVIOUS"
    _value = env.string(_prev_name)
    if _value and len(_value) < SECRET_MIN_LENGTH:
        env.errors.append(f"{_prev_name} must be at least {SECRET_MIN_LENGTH} characters")
    if _value and _value == _secrets.get(_name):
        env.errors.append(
            f"{_prev_name} equals {_name}: set the new value in {_name}, or unset {_prev_name}"
        )
    elif _value:
        _previous[_prev_name] = _value
for _name, _value in _previous.items():
    if _value in _seen:
        env.errors.append(f"{_seen[_value]} and {_name} are equal: every secret must differ")
    _seen[_value] = _name
DUCKGRES_INTERNAL_SECRET = _secrets.get("DUCKGRES_INTERNAL_SECRET", "")
DUCKGRES_RUNNER_SECRET = _secrets.get("DUCKGRES_RUNNER_SECRET", "")
DUCKGRES_DATAPLANE_SECRET = _secrets.get("DUCKGRES_DATAPLANE_SECRET", "")
DUCKGRES_INTERNAL_SECRET_PREVIOUS = _previous.get("DUCKGRES_INTERNAL_SECRET_PREVIOUS", "")
DUCKGRES_RUNNER_SECRET_PREVIOUS = _previous.get("DUCKGRES_RUNNER_SECRET_PREVIOUS", "")
DUCKGRES_DATAPLANE_SECRET_PREVIOUS = _previous.get("DUCKGRES_DATAPLANE_SECRET_PREVIOUS", "")
# Personal API tokens (django-rest-knox, docs/api.md "Personal tokens"): the default lifetime of
# a new token, in days (`manage.py create_api_token --days` and the admin's expiry field say
# otherwise per token).
DUCKGRES_API_TOKEN_TTL_DAYS = env.integer(
    "DUCKGRES_API_TOKEN_TTL_DAYS", 90, minimum=1, maximum=3650
)

# --- reshard ----------------------------------------------------------------------------------
DUCKGRES_RESHARD_LAUNCHER = env.choice("DUCKGRES_RESHARD_LAUNCHER", "local", ("local", "pod"))
DUCKGRES_RESHARD_POD_CPU = env.string("DUCKGRES_RESHARD_POD_CPU", "2")
DUCKGRES_RESHARD_POD_MEMORY = env.string("DUCKGRES_RESHARD_POD_MEMORY", "8Gi")
# The runner pods' own ServiceAccount: no RBAC, no token (docs/kubernetes.md "Identities").
DUCKGRES_RESHARD_RUNNER_SERVICE_ACCOUNT = env.string(
    "DUCKGRES_RESHARD_RUNNER_SERVICE_ACCOUNT", "duckgres-admin-runner"
)
# Where the pod launcher creates runner pods and their per-op Secrets (docs/kubernetes.md
# "The runner namespace"). Empty: the control plane's own namespace (POD_NAMESPACE). k8s/base
# sets duckgres-runners: a namespace whose only ServiceAccounts have no rights and no token, so
# whoever holds the launcher's token cannot start a pod with a more powerful identity.
DUCKGRES_RESHARD_RUNNER_NAMESPACE = env.string("DUCKGRES_RESHARD_RUNNER_NAMESPACE", "")
DUCKGRES_RESHARD_LOCAL_STATE_DIR = env.string(
    "DUCKGRES_RESHARD_LOCAL_STATE_DIR", str(BASE_DIR / "var" / "reshard-runners")
)
DUCKGRES_RESHARD_FLIP_TIMEOUT = env.lenient_duration("DUCKGRES_RESHARD_FLIP_TIMEOUT", 900)
if DUCKGRES_RESHARD_FLIP_TIMEOUT <= 0:
    env.warnings.append("DUCKGRES_RESHARD_FLIP_TIMEOUT <= 0 is ignored; using 900s")
    DUCKGRES_RESHARD_FLIP_TIMEOUT = 900
DUCKGRES_CONFIG_POLL_INTERVAL = env.lenient_duration("DUCKGRES_CONFIG_POLL_INTERVAL", 30)

DUCKGRES_RESHARD_STALE_SECONDS = env.integer("DUCKGRES_RESHARD_STALE_SECONDS", 300, minimum=1)
DUCKGRES_RESHARD_PENDING_GRACE_SECONDS = env.integer(
    "DUCKGRES_RESHARD_PENDING_GRACE_SECONDS", 120, minimum=1
)
DUCKGRES_RESHARD_SPAWN_GRACE_SECONDS = env.integer(
    "DUCKGRES_RESHARD_SPAWN_GRACE_SECONDS", 120, minimum=1
)
DUCKGRES_RESHARD_REAP_AFTER_SECONDS = env.integer(
    "DUCKGRES_RESHARD_REAP_AFTER_SECONDS", 300, minimum=1
)
DUCKGRES_RESHARD_HEARTBEAT_SECONDS = env.integer(
    "DUCKGRES_RESHARD_HEARTBEAT_SECONDS", 30, minimum=1
)
DUCKGRES_RESHARD_POLL_SECONDS = env.integer("DUCKGRES_RESHARD_POLL_SECONDS", 5, minimum=1)
DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS = env.integer(
    "DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS", 570, minimum=1
)
if DUCKGRES_RESHARD_STALE_SECONDS < 60 + 2 * DUCKGRES_RESHARD_HEARTBEAT_SECONDS:
    env.errors.append(
        "DUCKGRES_RESHARD_STALE_SECONDS must be >= 60 + 2 x DUCKGRES_RESHARD_HEARTBEAT_SECONDS "
        f"({DUCKGRES_RESHARD_STALE_SECONDS} < 60 + 2 x {DUCKGRES_RESHARD_HEARTBEAT_SECONDS}), "
        "so that one failed heartbeat never self-fences"
    )
if DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS >= 600:
    env.errors.append(
        "DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS must be < 600 (the runner pod's grace period)"
    )
DUCKGRES_RESHARD_MAX_PARTS = env.integer(
    "DUCKGRES_RESHARD_MAX_PARTS", 10000, minimum=1, maximum=10000
)
# The pre-flip backup's pg_dump compression (reshard.engines.backup.COMPRESSION_LEVELS): gzip (zlib)
# levels only, so that every archive stays readable by the stock pg_restore the restore line
# names (lz4/zstd need a PostgreSQL 16+ pg_dump/pg_restore built with them). Default gzip:1
# (pg_dump's own default, zlib 6, is CPU-bound; figures in docs/backup.md).
DUCKGRES_RESHARD_BACKUP_COMPRESSION = env.choice(
    "DUCKGRES_RESHARD_BACKUP_COMPRESSION",
    "gzip:1",
    ("none", *(f"gzip:{level}" for level in range(1, 10))),
)
# The pre-flip backup runs beside the cutover, the copy and the verification (it reads the same
# fenced source) and is joined before anything irreversible; false runs it alone, first, as
# before (docs/runner.md "The backup beside the copy").
DUCKGRES_RESHARD_BACKUP_OVERLAP = env.boolean("DUCKGRES_RESHARD_BACKUP_OVERLAP", True)
# The copy's mode when a start does not name one (docs/copy.md "Online copy"): "offline" copies
# inside the block; "online" pre-copies while the tenant runs and catches up inside it (cnpg →
# cnpg, PostgreSQL 13+ sources; anything else runs offline, saying why). Read by the API at the
# start and frozen on the operation row: no runner reads it.
DUCKGRES_RESHARD_COPY_MODE = env.choice(
    "DUCKGRES_RESHARD_COPY_MODE", "offline", ("offline", "online")
)
# The online mode's whole-catalog comparison and pre-flip backup (docs/runner.md "The backup in
# the online mode"): "after_unblock" (the window does not pay for them; the source is dropped only
# once both passed) or "before_flip" (inside the window, as the offline move). Frozen per op.
DUCKGRES_RESHARD_ONLINE_BACKUP = env.choice(
    "DUCKGRES_RESHARD_ONLINE_BACKUP", "after_unblock", ("after_unblock", "before_flip")
)
# The janitor's sweep of open backup uploads left by lost processes (reshard.engines.uploads); 0 =
# off.
DUCKGRES_RESHARD_UPLOAD_SWEEP_SECONDS = env.integer(
    "DUCKGRES_RESHARD_UPLOAD_SWEEP_SECONDS", 900, minimum=0
)
DUCKGRES_RESHARD_COPY_PARALLELISM = env.integer(
    "DUCKGRES_RESHARD_COPY_PARALLELISM", 2, minimum=1, maximum=16
)
DUCKGRES_PG_BIN_DIRS = env.string("DUCKGRES_PG_BIN_DIRS", "/usr/lib/postgresql/*/bin")
# The CA that metadata-store certificates must chain to (libpq sslrootcert): an absolute path to
# a PEM bundle, or "system" (the OS trust store; implies verify-full). Empty: libpq's default
# (~/.postgresql/root.crt). See duckgres_admin/lib/pgadmin.py and docs/configuration.md.
DUCKGRES_STORE_SSLROOTCERT = env.string("DUCKGRES_STORE_SSLROOTCERT", "")
if DUCKGRES_STORE_SSLROOTCERT not in ("", "system") and not DUCKGRES_STORE_SSLROOTCERT.startswith(
    "/"
):
    env.errors.append("DUCKGRES_STORE_SSLROOTCERT must be an absolute path or 'system'")

DUCKGRES_JANITOR_LEASE_SECONDS = env.integer("DUCKGRES_JANITOR_LEASE_SECONDS", 90, minimum=1)
DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS = env.integer(
    "DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS", 60, minimum=1
)
if DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS >= DUCKGRES_JANITOR_LEASE_SECONDS:
    env.errors.append(
        "DUCKGRES_JANITOR_RENEW_DEADLINE_SECONDS must be < DUCKGRES_JANITOR_LEASE_SECONDS"
    )
# The default worker's exporter (Celery task outcomes of its prefork children), served by its main
# process when PROMETHEUS_MULTIPROC_DIR is set (k8s/base/worker.yaml); 0 disables it.
DUCKGRES_WORKER_METRICS_PORT = env.integer(
    "DUCKGRES_WORKER_METRICS_PORT", 9111, minimum=0, maximum=65535
)
DUCKGRES_CONTROL_METRICS_PORT = env.integer(
    "DUCKGRES_CONTROL_METRICS_PORT", 9108, minimum=0, maximum=65535
)


# --- hostile inputs: secret references, store hosts, request bodies (docs/configuration.md) -----
# Secret references are allowed only inside these allowlists, per purpose (unset: nothing is);
# the control plane's own secrets are never allowed, whatever they say (lib/secretrefs.py).
def _allowlist(variable: str) -> tuple[secretrefs.AllowEntry, ...]:
    entries, problems = secretrefs.parse_allowlist(variable, env.string(variable))
    env.errors.extend(problems)
    return entries


DUCKGRES_SECRET_REF_ALLOW_PROVISIONER = _allowlist("DUCKGRES_SECRET_REF_ALLOW_PROVISIONER")
DUCKGRES_SECRET_REF_ALLOW_TENANT = _allowlist("DUCKGRES_SECRET_REF_ALLOW_TENANT")
# Where each reference's secret may be sent: "<ref entry>=<host>:<port>[,…];…" (unset: anywhere,
# warned with the pod launcher; set: a reference no entry names goes nowhere). reshard-124.
DUCKGRES_SECRET_REF_ENDPOINTS, _problems = secretrefs.parse_endpoint_bindings(
    "DUCKGRES_SECRET_REF_ENDPOINTS", env.string("DUCKGRES_SECRET_REF_ENDPOINTS")
)
env.errors.extend(_problems)
if (
    not DUCKGRES_SECRET_REF_ENDPOINTS
    and DUCKGRES_RESHARD_LAUNCHER == "pod"  # the shipped manifests; not dev, demo and tests
    and (DUCKGRES_SECRET_REF_ALLOW_PROVISIONER or DUCKGRES_SECRET_REF_ALLOW_TENANT)
):
    env.warnings.append(
        "DUCKGRES_SECRET_REF_ENDPOINTS is unset: secret references are not bound to endpoints, "
        "so a reference's password may be sent to any store endpoint a caller names; bind each "
        "reference to its servers (docs/configuration.md)"
    )
# Endpoints whose TLS is terminated in front of PostgreSQL (no SCRAM channel binding possible):
# channel_binding=prefer there, require_auth still (safeguard reshard-123).
DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT, _problems = endpoints.parse_patterns(
    "DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT", env.string("DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT")
)
env.errors.extend(_problems)
# Addresses no metadata store may have (the host, its pooler, an external binding or target, and
# every address a name resolves to): link-local, the cloud metadata endpoints, "any".
DEFAULT_STORE_HOST_DENYLIST = (
    "169.254.0.0/16,fe80::/10,169.254.169.254/32,fd00:ec2::254/128,0.0.0.0/32,::/128"
)
DUCKGRES_STORE_HOST_DENYLIST: tuple[ipaddress.IPv4Network | ipaddress.IPv6Network, ...] = ()
_denylist: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
for _item in env.csv("DUCKGRES_STORE_HOST_DENYLIST", DEFAULT_STORE_HOST_DENYLIST):
    try:
        _denylist.append(ipaddress.ip_network(_item, strict=True))
    except ValueError:
        env.errors.append(
            f"DUCKGRES_STORE_HOST_DENYLIST: {_item!r} is not a network: write CIDRs such as "
            "169.254.0.0/16 or fd00:ec2::254/128 (host bits zero), comma-separated"
        )
DUCKGRES_STORE_HOST_DENYLIST = tuple(_denylist)
# Largest JSON request body the API reads (413 beyond it).
DUCKGRES_API_MAX_BODY_BYTES = env.integer(
    "DUCKGRES_API_MAX_BODY_BYTES", 1024 * 1024, minimum=1024, maximum=64 * 1024 * 1024
)
# Django's own reads (form posts, request.body) stop at the same limit.
DATA_UPLOAD_MAX_MEMORY_SIZE = DUCKGRES_API_MAX_BODY_BYTES
# All the request bytes the API worker holds at once, every connection together
# (docs/configuration.md "Request admission"); a large body beyond it is answered 503 unread.
DUCKGRES_API_BUFFER_BUDGET_BYTES = env.integer(
    "DUCKGRES_API_BUFFER_BUDGET_BYTES", 128 * 1024 * 1024, minimum=0, maximum=4 * 1024**3
)
_least_budget = admission.minimum_budget(DUCKGRES_API_MAX_BODY_BYTES)
if _least_budget > DUCKGRES_API_BUFFER_BUDGET_BYTES:
    env.errors.append(
        f"DUCKGRES_API_BUFFER_BUDGET_BYTES={DUCKGRES_API_BUFFER_BUDGET_BYTES} is below "
        f"{_least_budget}, the reserve for request heads "
        "and small bodies plus one body of DUCKGRES_API_MAX_BODY_BYTES: raise it, or lower "
        "DUCKGRES_API_MAX_BODY_BYTES"
    )
# Admin login throttling (django-axes, docs/configuration.md "Admin login throttling"): this
# many failed logins for one username lock it out, even with the right password, for this long.
DUCKGRES_ADMIN_LOGIN_FAILURE_LIMIT = env.integer(
    "DUCKGRES_ADMIN_LOGIN_FAILURE_LIMIT", 5, minimum=1, maximum=100
)
DUCKGRES_ADMIN_LOGIN_COOLOFF_SECONDS = env.integer(
    "DUCKGRES_ADMIN_LOGIN_COOLOFF_SECONDS", 900, minimum=1, maximum=7 * 86400
)
# The API process's own Prometheus exporter (authentication failures); 0 disables it.
DUCKGRES_API_METRICS_PORT = env.integer("DUCKGRES_API_METRICS_PORT", 9110, minimum=0, maximum=65535)

# --- password handoff (spec §4.17) -------------------------------------------------------------
DUCKGRES_ADVERTISE_ADDRESS = env.string("DUCKGRES_ADVERTISE_ADDRESS", "")
DUCKGRES_ADVERTISE_PORT = env.integer("DUCKGRES_ADVERTISE_PORT", 8080, minimum=1, maximum=65535)
DUCKGRES_ADVERTISE_SCHEME = env.choice("DUCKGRES_ADVERTISE_SCHEME", "http", ("http", "https"))
# The password route's own listener (safeguard reshard-79): gunicorn binds this port next to the
# main one, the password URL names it, the route answers only there and nothing else does. 0:
# no separate listener (the route is served on the main port; single-machine installs only).
DUCKGRES_PASSWORD_PULL_PORT = env.integer(
    "DUCKGRES_PASSWORD_PULL_PORT", 0, minimum=0, maximum=65535
)
# The audience of the runner pod's projected ServiceAccount token: the launcher puts it in the
# pod spec, the API's TokenReview demands it. Used for nothing else.
DUCKGRES_PASSWORD_PULL_AUDIENCE = env.string(
    "DUCKGRES_PASSWORD_PULL_AUDIENCE", "duckgres-admin-password-pull"
)
POD_NAME = env.string("POD_NAME", "")
POD_NAMESPACE = env.string("POD_NAMESPACE", "")
POD_IP = env.string("POD_IP", "")

# --- S3 ---------------------------------------------------------------------------------------
DUCKGRES_AWS_REGION = env.string("DUCKGRES_AWS_REGION", "")
DUCKGRES_S3_ENDPOINT_URL = env.string("DUCKGRES_S3_ENDPOINT_URL", "")
DUCKGRES_S3_ADDRESSING_STYLE = env.choice(
    "DUCKGRES_S3_ADDRESSING_STYLE", "auto", ("auto", "path", "virtual")
)
# STS (AssumeRole, GetFederationToken). Empty: AWS_ENDPOINT_URL_STS when set, else the S3
# endpoint when DUCKGRES_S3_ENDPOINT_URL is set (S3-compatible servers serve STS there), else
# AWS's regional STS.
DUCKGRES_STS_ENDPOINT_URL = env.string("DUCKGRES_STS_ENDPOINT_URL", "")
# What S3 authority a runner holds (docs/launchers.md "S3 credentials"): "operation" (default)
# = a session the launcher mints per launch, limited by a session policy to the operation's own
# backup keys (and a restore's one source object); "ambient" = the control plane's own
# credentials, as before (only for S3 servers without STS).
DUCKGRES_RUNNER_S3_CREDENTIALS = env.choice(
    "DUCKGRES_RUNNER_S3_CREDENTIALS", "operation", ("operation", "ambient")
)
DUCKGRES_RUNNER_S3_SESSION_SECONDS = env.integer(
    "DUCKGRES_RUNNER_S3_SESSION_SECONDS", 3600, minimum=900, maximum=43200
)
# Set by a launcher in a runner's environment only: a description of the operation-scoped
# session the runner was given (never a secret). When set, no role is assumed in this process:
# its credentials are that session's (duckgres_admin/lib/s3.py).
DUCKGRES_RESHARD_S3_SESSION = env.string("DUCKGRES_RESHARD_S3_SESSION", "")

# --- Kubernetes API (pod launcher) -------------------------------------------------------------
# Empty: in-cluster service-account configuration. Tests point it at the real test apiserver.
DUCKGRES_KUBE_API_URL = env.string("DUCKGRES_KUBE_API_URL", "")
DUCKGRES_KUBE_TOKEN = env.string("DUCKGRES_KUBE_TOKEN", "")
DUCKGRES_KUBE_VERIFY_TLS = env.boolean("DUCKGRES_KUBE_VERIFY_TLS", True)

# With the pod launcher, secret-bearing allowlisted names cannot reach runner pods as files.
if DUCKGRES_RESHARD_LAUNCHER == "pod":
    for _name in sorted(env.from_file):
        if _name in {
            "DUCKGRES_CONFIG_STORE",
            "DUCKGRES_RUNNER_SECRET",
            "AWS_ACCESS_KEY_ID",
            "AWS_SECRET_ACCESS_KEY",
        }:
            env.errors.append(
                f"{_name} is supplied as {_name}_FILE, which cannot be passed to runner pods: "
                "supply it as a secretKeyRef env var"
            )

# --- Celery (spec §6): no default broker, never eager -------------------------------------------
# Runners never talk to the broker; every other process needs it (no eager fallback).
CELERY_BROKER_URL = env.string(
    "DUCKGRES_BROKER_URL",
    required=not (IS_RUNNER or IS_COLLECTSTATIC or IS_SCHEMA_COMMAND or IS_SANDBOX),
)
CELERY_TASK_ALWAYS_EAGER = False
CELERY_TASK_DEFAULT_QUEUE = str(queues.QueueName.DEFAULT)
# The queues and routes come from the one table of queue and task names
# (duckgres_admin.platform.queues):
# duckgres.control is a broadcast queue, so every control-worker replica receives every janitor
# tick and the lease decides which one acts; the Trino tasks all go to duckgres.trino.
CELERY_TASK_QUEUES = queues.celery_queues()
CELERY_TASK_ROUTES = queues.celery_routes()
# --- Trino (spec trino-pools §4.3) --------------------------------------------------------------
# The Trino variables are parsed and validated by trino_pools.config from AppConfig.ready().
# --- end Trino ------------------------------------------------------------------------------------
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_BROKER_CONNECTION_RETRY_ON_STARTUP = True
CELERY_BEAT_SCHEDULER = "django_celery_beat.schedulers:DatabaseScheduler"
CELERY_TIMEZONE = "UTC"
CELERY_RESULT_BACKEND = None
CELERY_TASK_IGNORE_RESULT = True

# --- HTTP: static files and a TLS-terminating proxy (docs/configuration.md) --------------------
# Static files are served by WhiteNoise. `manifest`: the compressed, hashed files collectstatic
# wrote to STATIC_ROOT, and nothing else ({% static %} raises for a file missing from the manifest:
# the image sets this). `plain`: unhashed names, files served from the apps (dev, tests). `auto`:
# `manifest` once collectstatic wrote STATIC_ROOT/staticfiles.json (and for collectstatic itself),
# else `plain`, so a checkout that never ran collectstatic renders the admin.
_static_root = env.absolute_path("DUCKGRES_STATIC_ROOT", str(BASE_DIR / "var" / "static"))
_static_storage = env.choice("DUCKGRES_STATIC_STORAGE", "auto", ("auto", "manifest", "plain"))
# "*" stays the default for dev, tests and the demo; production sets the names it is reached by.
_allowed_hosts = env.csv("DUCKGRES_ALLOWED_HOSTS", "*")
if not _allowed_hosts:
    env.errors.append("DUCKGRES_ALLOWED_HOSTS names no host: list host names, comma-separated")
_csrf_trusted_origins = env.https_origins("DUCKGRES_CSRF_TRUSTED_ORIGINS")
# Opt-in: only a proxy that overwrites the header may be trusted with it.
_proxy_ssl_header = env.header_name("DUCKGRES_SECURE_PROXY_SSL_HEADER")
# On unless DEBUG: browsers keep Secure cookies on http://localhost, so only plain HTTP on
# another address (no proxy, no port-forward) needs DUCKGRES_SECURE_COOKIES=false.
_secure_cookies = env.boolean("DUCKGRES_SECURE_COOKIES", not DEBUG)
# Sent only on requests Django sees as HTTPS (through the proxy header), never on plain HTTP.
_hsts_seconds = env.integer("DUCKGRES_HSTS_SECONDS", 0 if DEBUG else 31536000, minimum=0)
_hsts_include_subdomains = env.boolean("DUCKGRES_HSTS_INCLUDE_SUBDOMAINS", False)

# --- backup retention (docs/backup.md "Retention"): off until an operator opts in -------------
DUCKGRES_BACKUP_RETENTION = retention.policy_from_env(env)
# --- restore tests (docs/backup.md "Restore tests"): off until a scratch store is named --------
DUCKGRES_RESTORE_TEST_STORE = env.string("DUCKGRES_RESTORE_TEST_STORE", "")
DUCKGRES_RESTORE_TEST_TIMEOUT_SECONDS = env.integer(
    "DUCKGRES_RESTORE_TEST_TIMEOUT_SECONDS", 3600, minimum=30, maximum=86400
)
DUCKGRES_RESTORE_TEST_MAX_PER_RUN = env.integer(
    "DUCKGRES_RESTORE_TEST_MAX_PER_RUN", 3, minimum=1, maximum=100
)
# What one restored archive may write on the scratch store (its database; temp files too where
# the provisioner may set temp_file_limit), and whether a store that serves warehouses may be
# the scratch store at all (docs/backup.md "What a restore test may do to its store").
DUCKGRES_RESTORE_TEST_MAX_DATABASE_BYTES = env.integer(
    "DUCKGRES_RESTORE_TEST_MAX_DATABASE_BYTES", 20 << 30, minimum=1 << 20
)
DUCKGRES_RESTORE_TEST_ALLOW_SERVING_STORE = env.boolean(
    "DUCKGRES_RESTORE_TEST_ALLOW_SERVING_STORE", False
)

# --- notifications: the webhook (docs/notifications.md) ---------------------------------------
DUCKGRES_WEBHOOK = webhook_config.from_env(
    env, shared_secrets=(*_secrets.values(), *_previous.values())
)
# --- retention of the config store's growing tables (docs/operations.md "Retention") ---------
DUCKGRES_RETENTION = retention_policy.from_env(
    env, webhook_lookback_seconds=DUCKGRES_WEBHOOK.lookback_seconds
)

DUCKGRES_LOG_LEVEL = env.choice("DUCKGRES_LOG_LEVEL", "INFO", ("DEBUG", "INFO", "WARNING", "ERROR"))

env.raise_if_errors()
CONFIG_WARNINGS = list(env.warnings)

# --- Django ----------------------------------------------------------------------------------
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "knox",
    "drf_spectacular",
    "django_celery_beat",
    "axes",
    "duckgres_admin",
]
MIDDLEWARE = [
    # Request rate, errors and latency per route (django-prometheus), on the API's exporter
    # (DUCKGRES_API_METRICS_PORT): first and next-to-last, so it times everything in between and
    # counts the answer a lockout (axes, last) turns into a 429.
    "django_prometheus.middleware.PrometheusBeforeMiddleware",
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    # 413/411/417 from the headers, before CSRF or a view reads a body
    # (duckgres_admin/api/admission.py)
    "duckgres_admin.api.admission.BodyAdmissionMiddleware",
    # Before sessions, auth and every view: on the password-pull port only the password route
    # exists, and it exists only there (WhiteNoise above serves only the public /static/ files).
    "duckgres_admin.api.pullport.PullPortMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "django_prometheus.middleware.PrometheusAfterMiddleware",
    # Last (django-axes): turns a login refused for a lockout into its 429 page.
    "axes.middleware.AxesMiddleware",
]
# Admin login throttling (django-axes; docs/configuration.md "Admin login throttling"). Its
# backend comes first and refuses a locked-out username before any password is checked. Only
# the admin site's login counts (the API authenticates by secrets and tokens, never here); a
# lockout is per username (behind the proxy every browser has the proxy's address); an attempt
# during a lockout is refused and not recorded, so the lock ends one cool-off after the failure
# that set it; a success clears the count. Unlock early: `manage.py axes_reset_username NAME`.
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",
    "django.contrib.auth.backends.ModelBackend",
]
AXES_ONLY_ADMIN_SITE = True
# Passwords set through the admin, `createsuperuser` and `create_first_admin` are checked by
# Django's validators: at least 12 characters, not common, not all digits, not like the user.
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {
        "NAME": "django.contrib.auth.password_validation.MinimumLengthValidator",
        "OPTIONS": {"min_length": 12},
    },
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AXES_FAILURE_LIMIT = DUCKGRES_ADMIN_LOGIN_FAILURE_LIMIT
AXES_COOLOFF_TIME = DUCKGRES_ADMIN_LOGIN_COOLOFF_SECONDS / 3600  # hours, as a float
AXES_LOCKOUT_PARAMETERS = ["username"]
AXES_RESET_ON_SUCCESS = True
AXES_RESET_COOL_OFF_ON_FAILURE_DURING_LOCKOUT = False
AXES_HANDLER = "axes.handlers.database.AxesDatabaseHandler"
AXES_DISABLE_ACCESS_LOG = True
AXES_ENABLE_ADMIN = False
AXES_VERBOSE = False
AXES_SENSITIVE_PARAMETERS = ["username", "ip_address", "csrfmiddlewaretoken"]
ROOT_URLCONF = "duckgres_admin.urls"
WSGI_APPLICATION = "duckgres_admin.wsgi.application"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ]
        },
    }
]
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = False
USE_TZ = True

# --- static files (WhiteNoise) ------------------------------------------------------------------
STATIC_URL = "static/"
STATIC_ROOT = Path(_static_root)
STATIC_MANIFEST = _static_storage == "manifest" or (
    _static_storage == "auto" and (IS_COLLECTSTATIC or (STATIC_ROOT / "staticfiles.json").is_file())
)
STORAGES: dict[str, dict[str, Any]] = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": (
            "whitenoise.storage.CompressedManifestStaticFilesStorage"
            if STATIC_MANIFEST
            else "django.contrib.staticfiles.storage.StaticFilesStorage"
        )
    },
}
# Manifest: serve what collectstatic wrote, indexed once at start. Plain: find the files in the
# apps on each request (no collectstatic needed, edits show up at once).
WHITENOISE_USE_FINDERS = not STATIC_MANIFEST
WHITENOISE_AUTOREFRESH = not STATIC_MANIFEST

# --- behind a TLS-terminating proxy -------------------------------------------------------------
ALLOWED_HOSTS = list(_allowed_hosts)
if "*" not in ALLOWED_HOSTS:
    # Allowing these is not an operator's chore: a bare Service name's in-cluster forms in the
    # pod's own namespace (so no ConfigMap value spells the namespace, which kustomize could not
    # rewrite), the loopback names a `kubectl port-forward` is reached by, and the pod's own
    # addresses (the kubelet's probes, Host: <POD_IP>:8080; the runner's password pull).
    _derived = [
        f"{_name}.{POD_NAMESPACE}.{_suffix}"
        for _name in _allowed_hosts
        if POD_NAMESPACE and _name.isascii() and "." not in _name and ":" not in _name
        for _suffix in ("svc", "svc.cluster.local")
    ]
    for _own in (*_derived, "localhost", "127.0.0.1", "[::1]", POD_IP, DUCKGRES_ADVERTISE_ADDRESS):
        _host = f"[{_own}]" if ":" in _own and not _own.startswith("[") else _own
        if _host and _host.lower() not in ALLOWED_HOSTS:
            ALLOWED_HOSTS.append(_host.lower())
CSRF_TRUSTED_ORIGINS = _csrf_trusted_origins
# A failed check names the setting that fixes it (Secure cookies on plain HTTP, a foreign origin).
CSRF_FAILURE_VIEW = "duckgres_admin.adminui.csrf.csrf_failure"
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_" + _proxy_ssl_header.upper().replace("-", "_"), "https") if _proxy_ssl_header else None
)
SESSION_COOKIE_SECURE = _secure_cookies
CSRF_COOKIE_SECURE = _secure_cookies
SECURE_HSTS_SECONDS = _hsts_seconds
SECURE_HSTS_INCLUDE_SUBDOMAINS = _hsts_include_subdomains
SECURE_CONTENT_TYPE_NOSNIFF = True
SECURE_REFERRER_POLICY = "same-origin"
X_FRAME_OPTIONS = "DENY"
# Never redirected to HTTPS here: the proxy redirects browsers, and the pod's own plain-HTTP
# callers (kubelet probes /livez and /readyz, the runner's password pull to POD_IP:8080, the
# in-cluster lease calls) must get their answer, not a 301 to a port nobody listens on.
SECURE_SSL_REDIRECT = False
SILENCED_SYSTEM_CHECKS = [
    # SECURE_SSL_REDIRECT is off by design (above); HTTPS redirection is the proxy's.
    "security.W008",
    # HSTS preload commits a whole registrable domain and is submitted at its apex
    # (hstspreload.org): a decision of the domain's owner, not one this admin app can make.
    "security.W021",
    # django-axes wants the client address in the lockout key; behind the proxy every browser
    # has the proxy's (forwarded headers are not trusted), so the key is the username alone,
    # summed over every address and User-Agent (settings above, docs/configuration.md).
    "axes.W006",
]

REST_FRAMEWORK: dict[str, Any] = {
    "DEFAULT_AUTHENTICATION_CLASSES": [],
    "DEFAULT_PERMISSION_CLASSES": [],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "UNAUTHENTICATED_USER": None,
}
# Personal tokens: stored as SHA-512 digests, never refreshed by use (a request writes nothing),
# sent as `Authorization: Token <token>` (the runner's own credential is a Bearer one).
REST_KNOX: dict[str, Any] = {
    "TOKEN_TTL": timedelta(days=DUCKGRES_API_TOKEN_TTL_DAYS),
    "AUTO_REFRESH": False,
    "AUTH_HEADER_PREFIX": "Token",
    "TOKEN_PREFIX": "dgadm_",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "Duckgres Admin API",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/schema/ takes the operator identities, like every operator read (docs/api.md).
    "SERVE_AUTHENTICATION": [],
    "SERVE_PERMISSIONS": ["duckgres_admin.api.auth.SchemaPermission"],
}

LOGGING: dict[str, Any] = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "formatter": "plain"}},
    "root": {"handlers": ["stderr"], "level": DUCKGRES_LOG_LEVEL},
    "loggers": {
        "django.db.backends": {"level": "WARNING"},
        "botocore": {"level": "WARNING"},
        "urllib3": {"level": "WARNING"},
        "kubernetes": {"level": "WARNING"},
        # django-axes: its per-attempt INFO lines would be a flood during a lockout.
        "axes": {"level": "WARNING"},
    },
}
