"""All models of Duckgres Admin live in this package (design §2)."""

from duckgres_admin.models.audit import AuditRecord, Operator, OperatorRole
from duckgres_admin.models.backups import BackupVerification, VerificationResult
from duckgres_admin.models.coordinates import ActiveTarget, BindingCoordinates
from duckgres_admin.models.drains import (
    ACTIVE_DRAIN_STATES,
    ENDED_DRAIN_STATES,
    PROGRESS_KEYS,
    DrainRule,
    DrainState,
    ItemState,
    StoreDrain,
    StoreDrainItem,
    progress_of,
)
from duckgres_admin.models.installation import Installation
from duckgres_admin.models.leases import ConnectionLease, Lease, LeasePurpose, LeaseState
from duckgres_admin.models.notifications import Notification, NotificationKind, NotificationState
from duckgres_admin.models.reshard import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    LogLevel,
    LogSource,
    OpKind,
    OpState,
    ReshardLogEntry,
    ReshardOperation,
    ReshardStepTiming,
    StepOutcome,
)
from duckgres_admin.models.stores import (
    LIBPQ_SSLMODES,
    STORE_NAME_PATTERN,
    MetadataStore,
    StoreKind,
)
from duckgres_admin.models.warehouses import (
    EXTERNAL_SSLMODES,
    Warehouse,
    WarehouseState,
)

__all__ = [
    "ACTIVE_DRAIN_STATES",
    "ACTIVE_STATES",
    "ENDED_DRAIN_STATES",
    "EXTERNAL_SSLMODES",
    "LIBPQ_SSLMODES",
    "PROGRESS_KEYS",
    "STORE_NAME_PATTERN",
    "TERMINAL_STATES",
    "ActiveTarget",
    "AuditRecord",
    "BackupVerification",
    "BindingCoordinates",
    "ConnectionLease",
    "DrainRule",
    "DrainState",
    "Installation",
    "ItemState",
    "Lease",
    "LeasePurpose",
    "LeaseState",
    "LogLevel",
    "LogSource",
    "MetadataStore",
    "Notification",
    "NotificationKind",
    "NotificationState",
    "OpKind",
    "OpState",
    "Operator",
    "OperatorRole",
    "ReshardLogEntry",
    "ReshardOperation",
    "ReshardStepTiming",
    "StepOutcome",
    "StoreDrain",
    "StoreDrainItem",
    "StoreKind",
    "VerificationResult",
    "Warehouse",
    "WarehouseState",
    "progress_of",
]

# Trino shared pools (spec trino-pools §2).
from duckgres_admin.models.trino import (
    InstancePhase,
    OperationKind,
    PendingIntent,
    PublicationState,
    TrinoApiMode,
    TrinoBackend,
    TrinoClusterBootstrap,
    TrinoOrgState,
    TrinoPool,
    TrinoPoolInstance,
    TrinoPoolOperation,
    TrinoPoolOperationStep,
    TrinoPoolPublication,
    TrinoTier,
    WarehouseTrino,
    clip_status_message,
)

__all__ += [
    "InstancePhase",
    "OperationKind",
    "PendingIntent",
    "PublicationState",
    "TrinoApiMode",
    "TrinoBackend",
    "TrinoClusterBootstrap",
    "TrinoOrgState",
    "TrinoPool",
    "TrinoPoolInstance",
    "TrinoPoolOperation",
    "TrinoPoolOperationStep",
    "TrinoPoolPublication",
    "TrinoTier",
    "WarehouseTrino",
    "clip_status_message",
]
