"""The runner's environment contract (spec reshard §4.13), shared by both launchers.

A runner receives only the allowlisted names below, copied from the control plane, plus what the
launcher sets itself (op id, pod identity, password URL, and for a local runner the fd number
of its pull-credential pipe). The internal and data-plane secrets and Django's signing key are
never passed: a runner holds at most the runner secret, which alone no longer pulls a password
(safeguard reshard-79), and signs nothing (it draws a signing key of its own at start). The AWS
keys of the allowlist are copied only with ``DUCKGRES_RUNNER_S3_CREDENTIALS=ambient``; by
default both launchers drop them and hand over an operation-scoped session instead
(``reshard.launchers.s3scope``, safeguard reshard-137).
"""

from __future__ import annotations

# In spec order. Names in SECRET_BEARING travel only as references (pod launcher: secretKeyRef).
ALLOWLIST: tuple[str, ...] = (
    "DJANGO_SETTINGS_MODULE",
    "DUCKGRES_CONFIG_STORE",
    "DUCKGRES_CONFIG_POLL_INTERVAL",
    "DUCKGRES_RUNNER_SECRET",
    "DUCKGRES_AWS_REGION",
    "DUCKGRES_S3_ENDPOINT_URL",
    "DUCKGRES_S3_ADDRESSING_STYLE",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "DUCKGRES_LOG_LEVEL",
    "DUCKGRES_RESHARD_FLIP_TIMEOUT",
    "DUCKGRES_RESHARD_STALE_SECONDS",
    "DUCKGRES_RESHARD_PENDING_GRACE_SECONDS",
    "DUCKGRES_RESHARD_SPAWN_GRACE_SECONDS",
    "DUCKGRES_RESHARD_REAP_AFTER_SECONDS",
    "DUCKGRES_RESHARD_HEARTBEAT_SECONDS",
    "DUCKGRES_RESHARD_POLL_SECONDS",
    "DUCKGRES_RESHARD_SIGTERM_BUDGET_SECONDS",
    "DUCKGRES_RESHARD_MAX_PARTS",
    "DUCKGRES_RESHARD_BACKUP_COMPRESSION",
    "DUCKGRES_RESHARD_BACKUP_OVERLAP",
    "DUCKGRES_PG_BIN_DIRS",
    "DUCKGRES_STORE_SSLROOTCERT",
    "DUCKGRES_STORE_CHANNEL_BINDING_EXEMPT",
    "DUCKGRES_SECRET_REF_ENDPOINTS",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_PATH",
)

SECRET_BEARING: frozenset[str] = frozenset(
    {
        "DUCKGRES_CONFIG_STORE",
        "DUCKGRES_RUNNER_SECRET",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    }
)

# Never given to a runner, whatever the allowlist says (spec §4.13, safeguard 50).
NEVER_PASSED: frozenset[str] = frozenset(
    {
        "DUCKGRES_INTERNAL_SECRET",
        "DUCKGRES_DATAPLANE_SECRET",
        # A runner signs nothing; it draws a key of its own (settings, issue 25 item 3).
        "DJANGO_SECRET_KEY",
        "DJANGO_SECRET_KEY_PREVIOUS",
    }
)

# The local launcher additionally passes these through from its own environment.
LOCAL_PASSTHROUGH: tuple[str, ...] = (
    "PATH",
    "HOME",
    "LANG",
    "PYTHONPATH",
    "VIRTUAL_ENV",
    "DUCKGRES_RESHARD_LOCAL_STATE_DIR",
    "DUCKGRES_RESHARD_LAUNCHER",
)

OP_ID_VAR = "DUCKGRES_RESHARD_OP_ID"
PASSWORD_URL_VAR = "DUCKGRES_RESHARD_PASSWORD_URL"
# The password pull's credential (safeguard reshard-79), never itself in the environment: a
# runner pod reads its projected ServiceAccount token from PULL_TOKEN_PATH; a local runner reads
# its one-time credential from the inherited pipe whose fd number PULL_FD_VAR names.
# Defined next to the code that reads them (which must not load the launchers).
from reshard.runner.password import (  # noqa: E402
    PULL_FD_VAR,
    PULL_TOKEN_DIR,
    PULL_TOKEN_FILE,
    PULL_TOKEN_PATH,
    PULL_TOKEN_SECONDS,
)

__all__ = [
    "ALLOWLIST",
    "LOCAL_PASSTHROUGH",
    "NEVER_PASSED",
    "OP_ID_VAR",
    "PASSWORD_URL_VAR",
    "PULL_FD_VAR",
    "PULL_TOKEN_DIR",
    "PULL_TOKEN_FILE",
    "PULL_TOKEN_PATH",
    "PULL_TOKEN_SECONDS",
    "SECRET_BEARING",
]

assert SECRET_BEARING.issubset(ALLOWLIST)
assert not NEVER_PASSED & set(ALLOWLIST)
