"""Names of a reshard operation that every layer spells alike (spec reshard §2.6, §4.13).

The lowest layer of the project: it imports nothing of it, so the models, ``duckgres_admin.lib``
and the reshard domain all take these names from here and none spells them itself.
"""

from __future__ import annotations

RUNNER_NAME_PREFIX = "duckgres-reshard-op-"


def runner_name(op_id: int | str, suffix: str = "") -> str:
    """The deterministic name of the runner of op ``op_id``: ``duckgres-reshard-op-<id>``.

    It is the runner's pod name, its local ``POD_NAME``, its log prefix, the
    ``application_name`` of its sessions on the metadata stores and its S3 session name. A
    ``suffix`` names one of the runner's own helpers by the same stem: ``-log`` its op-log
    connection to the config store, ``-pg_dump`` the dump of the backup step.
    """
    return f"{RUNNER_NAME_PREFIX}{op_id}{suffix}"


# The milestone columns of an operation (§2.6, written only after positive observation), in
# the order a reshard reaches them: the admin detail page and the recovery command show them.
MILESTONES = (
    "source_access_verified_at",
    "source_fence_requested_at",
    "source_fenced_at",
    "target_rendered_at",
    "capture_installed_at",
    "capture_removed_at",
    "target_login_ready_at",
    "target_opened_at",
    "external_verified_at",
    "source_drop_committed_at",
    "source_dropped_at",
)
