"""The launcher interface shared by the pod and local-process launchers (spec reshard §4.13).

Phase is not liveness: only the op row's ``heartbeat_at`` is. ``exited`` means Succeeded or
Failed. ``terminating`` means deletion was requested and the object is not gone yet.
``capture_log`` copies a runner's log into the op log before its object is deleted (invariant
13); every launcher implements it with ``reshard.launchers.capture`` over its own ``read_log``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

from django.conf import settings

from duckgres_admin.models import MetadataStore, ReshardOperation, Warehouse
from duckgres_admin.platform.names import (
    runner_name as runner_name,  # the one definition, re-exported
)

PHASES = ("absent", "Pending", "Running", "Succeeded", "Failed", "Unknown")

RUNNER_APP_LABEL = "duckgres-reshard"  # label `app`; the runner NetworkPolicy selects it
LOGIN_APP_LABEL = "duckgres-reshard-login"  # label `app` of a runner's config-store login Secret
OP_ID_LABEL = "duckgres-op-id"
SPAWNED_AT_ANNOTATION = "duckgres.posthog.com/runner-spawned-at"
DEFAULT_GRACE_SECONDS = 600  # the runner pod's terminationGracePeriodSeconds


class LauncherError(RuntimeError):
    """A launch/delete/inspect failure, with a message fit for the op log."""


class StillTerminating(LauncherError):
    """``create`` found a same-name runner that has not exited or is still terminating.

    The janitor waits for a later tick without consuming a relaunch attempt (spec §4.15).
    ``existing`` is the runner found (None when only the create call reported AlreadyExists):
    the launch task can tell a live runner (leave it alone) from an exited one.
    """

    def __init__(self, existing: RunnerStatus | None = None) -> None:
        super().__init__("previous runner pod still terminating")
        self.existing = existing


@dataclass(frozen=True)
class RunnerStatus:
    phase: str  # one of PHASES
    terminating: bool = False
    spawned_at: datetime | None = None
    reason: str = ""  # container termination reason / exit description
    uid: str = ""

    @property
    def exited(self) -> bool:
        return self.phase in ("Succeeded", "Failed")


@dataclass(frozen=True)
class RunnerObject:
    name: str
    op_id_label: str  # raw `duckgres-op-id` label; may be unparsable
    status: RunnerStatus


class Launcher(Protocol):
    kind: str

    def create(self, op: ReshardOperation, replace: bool) -> RunnerStatus: ...

    def get_phase(self, op_id: int) -> RunnerStatus: ...

    def list(self) -> list[RunnerObject]: ...

    def delete(self, op_id: int, grace_seconds: int | None = None) -> None: ...

    def read_log(self, op_id: int, limit_bytes: int = 5 * 1024 * 1024) -> str: ...

    def forget_login(self, op_id: int) -> None:
        """Remove what holds the op's config-store login outside the config store (the pod
        launcher's per-op Secret); the janitor calls it before dropping the login."""
        ...

    def capture_log(self, op_id: int, status: RunnerStatus) -> bool:
        """Copy the log of runner ``status`` into the op log unless it is durable there
        already; False when reading it failed (a warn line says so; never blocks a delete)."""
        ...


def runner_namespace() -> str:
    """The namespace of runner pods: ``DUCKGRES_RESHARD_RUNNER_NAMESPACE``, else the control
    plane's own (``POD_NAMESPACE``); '' when neither is set."""
    return str(settings.DUCKGRES_RESHARD_RUNNER_NAMESPACE or settings.POD_NAMESPACE or "")


def runner_secret_refs(op: ReshardOperation) -> list[str]:
    """Every reference the runner of ``op`` may resolve: the op's source and target password
    references, the warehouse binding's, and the provisioner references of both stores."""
    refs = [op.source_password_secret_ref, op.target_password_secret_ref]
    binding = Warehouse.objects.filter(org_id=op.org_id).first() if op.org_id else None
    if binding is not None:
        refs.append(binding.metadata_store_password_ref)
    names = [name for name in (op.from_shard, op.to_shard) if name]
    if names:
        refs.extend(
            MetadataStore.objects.filter(name__in=names).values_list(
                "provisioner_password_ref", flat=True
            )
        )
    return [ref for ref in refs if ref]
