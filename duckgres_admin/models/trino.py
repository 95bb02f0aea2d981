"""Trino shared-pool tables of the config store (spec trino-pools §2.1-§2.6).

Schema only: behaviour lives in ``trino_pools``. Defaults are database defaults (``db_default``)
because the placement and operator paths write these rows with guarded SQL statements, and a
default that exists only in Python would not apply to them. The catalog-store tables (§2.7) are
not here: they live in their own database, created by the writer's bootstrap DDL
(``docs/trino-catalog-store.sql``). Reserved names (§2.8) are kept free.

Decisions where the specification is silent:

- ``duckgres_trino_pool_instances.endpoint_url`` is NULL until the instance's endpoint is known,
  so several instances still being created never collide on the unique ``(pool_id,
  endpoint_url)`` index.
- ``duckgres_trino_pool_operations`` carries ``pool_id`` (the pool whose authority fences it).
- Step ``payload`` and a publication's ``pending_request_body`` are text: the exact bytes of the
  request, for identical re-sends (JSONB would normalise them).
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Length, Now
from django.db.models.lookups import LessThanOrEqual

from duckgres_admin.models.warehouses import Warehouse

STATUS_MESSAGE_MAX = 1024


def clip_status_message(text: str) -> str:
    """At most 1024 characters: longer text is cut to the first 1021 plus ``...`` (§2.1)."""
    if len(text) <= STATUS_MESSAGE_MAX:
        return text
    return text[: STATUS_MESSAGE_MAX - 3] + "..."


class TrinoTier(models.TextChoices):
    NONE = "", "none"
    FREE = "free"
    GROWTH = "growth"
    SCALE = "scale"


class TrinoOrgState(models.TextChoices):
    PENDING = "pending"
    PROVISIONING = "provisioning"
    READY = "ready"
    FAILED = "failed"


class TrinoBackend(models.TextChoices):
    DUCKLAKE = "ducklake"
    HOGLAKE = "hoglake"


class WarehouseTrino(models.Model):
    """One row per Trino-capable org (§2.1). ``trino_cell_id`` is the durable owner."""

    warehouse = models.OneToOneField(
        Warehouse,
        on_delete=models.CASCADE,
        to_field="org_id",
        db_column="org_id",
        primary_key=True,
        related_name="trino",
    )
    enabled = models.BooleanField(db_default=False)
    tier = models.TextField(choices=TrinoTier.choices, db_default="", blank=True)
    trino_cell_id = models.TextField(db_default="", blank=True)
    state = models.TextField(choices=TrinoOrgState.choices, db_default=TrinoOrgState.PENDING)
    status_message = models.TextField(db_default="", blank=True)
    ready_at = models.DateTimeField(null=True, blank=True)
    failed_at = models.DateTimeField(null=True, blank=True)
    backend = models.TextField(choices=TrinoBackend.choices, db_default=TrinoBackend.DUCKLAKE)
    backend_selected = models.BooleanField(db_default=True)
    catalog_name = models.TextField(db_default="", blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_managed_warehouse_trino"
        verbose_name = "warehouse Trino row"
        ordering = ["warehouse_id"]
        indexes = [
            models.Index(
                fields=["warehouse"],
                condition=models.Q(enabled=True),
                name="wh_trino_enabled",
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(tier__in=[t.value for t in TrinoTier]),
                name="wh_trino_tier_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=[s.value for s in TrinoOrgState]),
                name="wh_trino_state_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(backend__in=[b.value for b in TrinoBackend]),
                name="wh_trino_backend_valid",
            ),
            models.CheckConstraint(
                condition=LessThanOrEqual(Length("status_message"), STATUS_MESSAGE_MAX),
                name="wh_trino_status_message_len",
            ),
            models.UniqueConstraint(
                fields=["trino_cell_id", "catalog_name"],
                condition=~models.Q(catalog_name=""),
                name="wh_trino_catalog_name_per_pool",
            ),
        ]

    def __str__(self) -> str:
        owner = self.trino_cell_id or "unassigned"
        return f"{self.warehouse_id} trino ({'enabled' if self.enabled else 'disabled'}, {owner})"


class TrinoClusterBootstrap(models.Model):
    """A cell namespace whose pool Secrets were generated once (§2.2; created, not written)."""

    namespace = models.TextField(primary_key=True)
    bootstrapped_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_trino_cluster_bootstrap"
        verbose_name = "Trino cluster bootstrap"

    def __str__(self) -> str:
        return self.namespace


class TrinoApiMode(models.TextChoices):
    LEGACY = "legacy"
    SHARED_POOL = "shared-pool"


class TrinoPool(models.Model):
    """A cell's compute fleet and its fencing authority (§2.3)."""

    pool_id = models.TextField(primary_key=True)
    public_id = models.TextField()
    api_mode = models.TextField(choices=TrinoApiMode.choices, db_default=TrinoApiMode.SHARED_POOL)
    desired_release_id = models.TextField(db_default="", blank=True)
    desired_blueprint_digest = models.TextField(db_default="", blank=True)
    desired_generation = models.BigIntegerField(db_default=0)
    desired_instances = models.IntegerField(db_default=3)
    min_serving = models.IntegerField(db_default=3)
    max_surge = models.IntegerField(db_default=1)
    max_repair = models.IntegerField(db_default=1)
    authority_epoch = models.BigIntegerField(db_default=0)
    authority_owner = models.TextField(db_default="", blank=True)
    publication_revision = models.BigIntegerField(db_default=0)
    admitted_revision = models.BigIntegerField(db_default=0)
    frozen = models.BooleanField(db_default=False)
    frozen_reason = models.TextField(db_default="", blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_trino_pools"
        verbose_name = "Trino pool"
        ordering = ["pool_id"]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(api_mode__in=[m.value for m in TrinoApiMode]),
                name="trino_pool_api_mode_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(pool_id__startswith="registered:"),
                name="trino_pool_id_registered",
            ),
            models.CheckConstraint(
                condition=models.Q(desired_generation__gte=0), name="trino_pool_generation_gte_0"
            ),
            models.CheckConstraint(
                condition=models.Q(desired_instances__gte=1), name="trino_pool_desired_gte_1"
            ),
            models.CheckConstraint(
                condition=models.Q(min_serving__gte=1)
                & models.Q(min_serving__lte=models.F("desired_instances")),
                name="trino_pool_min_serving_bounds",
            ),
            models.CheckConstraint(
                condition=models.Q(max_surge__gte=0), name="trino_pool_max_surge_gte_0"
            ),
            models.CheckConstraint(
                condition=models.Q(max_repair__gte=0), name="trino_pool_max_repair_gte_0"
            ),
            models.CheckConstraint(
                condition=models.Q(authority_epoch__gte=0), name="trino_pool_epoch_gte_0"
            ),
        ]

    def __str__(self) -> str:
        return self.pool_id


class InstancePhase(models.TextChoices):
    PENDING = "PENDING"
    CREATING = "CREATING"
    PREPARING = "PREPARING"
    VALIDATING = "VALIDATING"
    ADMITTED = "ADMITTED"
    SERVING = "SERVING"
    DRAINING = "DRAINING"
    SEALED = "SEALED"
    RETIRING = "RETIRING"
    RETIRED = "RETIRED"
    SUSPECT = "SUSPECT"
    LOST = "LOST"
    FAILURE_RETIRED = "FAILURE_RETIRED"
    FAILED_PREPARING = "FAILED_PREPARING"


# Phases whose endpoint no longer needs to be unique within the pool (§2.4).
ENDPOINT_RELEASED_PHASES = (
    InstancePhase.RETIRED,
    InstancePhase.FAILURE_RETIRED,
    InstancePhase.FAILED_PREPARING,
)


class TrinoPoolInstance(models.Model):
    """One immutable Trino cluster (§2.4); rows are never reused and retired rows are kept."""

    instance_id = models.TextField(primary_key=True)
    pool = models.ForeignKey(
        TrinoPool, on_delete=models.PROTECT, db_column="pool_id", related_name="instances"
    )
    release_id = models.TextField(db_default="", blank=True)
    spec_digest = models.TextField(db_default="", blank=True)
    blueprint_snapshot = models.JSONField(db_default=models.Value({}, models.JSONField()))
    phase = models.TextField(choices=InstancePhase.choices, db_default=InstancePhase.PENDING)
    phase_changed_at = models.DateTimeField(db_default=Now())
    owner_epoch = models.BigIntegerField(db_default=0)
    repair = models.BooleanField(db_default=False)
    repair_for = models.TextField(db_default="", blank=True)
    coordinator_deployment_name = models.TextField(db_default="", blank=True)
    coordinator_deployment_uid = models.TextField(db_default="", blank=True)
    worker_deployment_name = models.TextField(db_default="", blank=True)
    worker_deployment_uid = models.TextField(db_default="", blank=True)
    service_name = models.TextField(db_default="", blank=True)
    service_uid = models.TextField(db_default="", blank=True)
    config_map_name = models.TextField(db_default="", blank=True)
    config_map_uid = models.TextField(db_default="", blank=True)
    worker_config_map_name = models.TextField(db_default="", blank=True)
    worker_config_map_uid = models.TextField(db_default="", blank=True)
    coordinator_pod_uid = models.TextField(db_default="", blank=True)
    coordinator_node_id = models.TextField(db_default="", blank=True)
    coordinator_boot_id = models.TextField(db_default="", blank=True)
    coordinator_id = models.TextField(db_default="", blank=True)
    coordinator_container_id = models.TextField(db_default="", blank=True)
    endpoint_url = models.TextField(null=True, blank=True)
    tls_server_name = models.TextField(db_default="", blank=True)
    gateway_incarnation = models.TextField(db_default="", blank=True)
    gateway_backend_name = models.TextField(db_default="", blank=True)
    gateway_state = models.TextField(db_default="", blank=True)
    gateway_generation = models.BigIntegerField(null=True, blank=True)
    applied_catalog_revision = models.BigIntegerField(null=True, blank=True)
    validation_receipt = models.JSONField(null=True, blank=True)
    validated_at = models.DateTimeField(null=True, blank=True)
    retirement_receipt = models.JSONField(null=True, blank=True)
    failure_reason = models.TextField(db_default="", blank=True)
    last_error = models.TextField(db_default="", blank=True)
    node_replacement_evidence = models.JSONField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_trino_pool_instances"
        verbose_name = "Trino pool instance"
        ordering = ["instance_id"]
        indexes = [models.Index(fields=["pool", "phase"], name="trino_instance_pool_phase")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(phase__in=[p.value for p in InstancePhase]),
                name="trino_instance_phase_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(instance_id__regex=r"^cell-[0-9a-f]{8}$"),
                name="trino_instance_id_format",
            ),
            models.UniqueConstraint(
                fields=["pool", "endpoint_url"],
                condition=~models.Q(phase__in=[p.value for p in ENDPOINT_RELEASED_PHASES]),
                name="trino_instance_live_endpoint_unique",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.instance_id} ({self.phase})"


class OperationKind(models.TextChoices):
    REPLACE = "replace"
    SCALE_UP = "scale_up"
    REPAIR = "repair"
    RETIRE = "retire"
    PUBLISH = "publish"


class TrinoPoolOperation(models.Model):
    """The durable intent journal around external effects (§2.5, §4.7)."""

    operation_id = models.TextField(primary_key=True)
    pool = models.ForeignKey(
        TrinoPool, on_delete=models.PROTECT, db_column="pool_id", related_name="operations"
    )
    kind = models.TextField(choices=OperationKind.choices)
    intent_hash = models.TextField()
    owner_epoch = models.BigIntegerField()
    step = models.TextField(db_default="", blank=True)
    phase = models.TextField(db_default="pending")
    receipts = models.JSONField(db_default=models.Value({}, models.JSONField()))
    attempts = models.IntegerField(db_default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    terminal_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_trino_pool_operations"
        verbose_name = "Trino pool operation"
        ordering = ["created_at", "operation_id"]
        indexes = [
            models.Index(
                fields=["pool", "next_attempt_at"],
                condition=models.Q(terminal_at__isnull=True),
                name="trino_op_open_by_pool",
            )
        ]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(kind__in=[k.value for k in OperationKind]),
                name="trino_op_kind_valid",
            ),
            models.CheckConstraint(condition=models.Q(attempts__gte=0), name="trino_op_attempts"),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id} ({self.kind})"


class StepOutcome(models.TextChoices):
    PENDING = "pending"
    OK = "ok"
    UNKNOWN = "unknown"
    FAILED = "failed"


class TrinoPoolOperationStep(models.Model):
    """One external call of an operation; ``payload`` is the exact body for identical re-sends."""

    pk = models.CompositePrimaryKey("operation_id", "step_id")
    operation = models.ForeignKey(
        TrinoPoolOperation,
        on_delete=models.CASCADE,
        db_column="operation_id",
        related_name="steps",
    )
    step_id = models.TextField()
    payload_hash = models.TextField()
    payload = models.TextField(db_default="", blank=True)
    outcome = models.TextField(choices=StepOutcome.choices, db_default=StepOutcome.PENDING)
    result = models.JSONField(null=True, blank=True)
    owner_epoch = models.BigIntegerField()
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_trino_pool_operation_steps"
        verbose_name = "Trino pool operation step"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(outcome__in=[o.value for o in StepOutcome]),
                name="trino_step_outcome_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.operation_id}/{self.step_id} ({self.outcome})"


class PublicationState(models.TextChoices):
    PENDING = "pending"
    PUBLISHED = "published"
    ADMITTING = "admitting"
    ADMITTED = "admitted"
    FAILED = "failed"
    REVOKED = "revoked"


class PendingIntent(models.TextChoices):
    NONE = "", "none"
    PRINCIPALS = "principals"
    REVOKE = "revoke"


class TrinoPoolPublication(models.Model):
    """One row per pool and org (§2.6). Revoked rows are kept: deleting reads as "never"."""

    pk = models.CompositePrimaryKey("pool_id", "org_id")
    pool = models.ForeignKey(
        TrinoPool, on_delete=models.PROTECT, db_column="pool_id", related_name="publications"
    )
    org_id = models.TextField()
    desired_revision = models.BigIntegerField(db_default=0)
    published_revision = models.BigIntegerField(db_default=0)
    admitted_revision = models.BigIntegerField(db_default=0)
    publication_id = models.TextField(db_default="", blank=True)
    publication_operation_id = models.TextField(db_default="", blank=True)
    state = models.TextField(choices=PublicationState.choices, db_default=PublicationState.PENDING)
    gateway_receipt = models.JSONField(null=True, blank=True)
    last_error = models.TextField(db_default="", blank=True)
    principal_revision = models.TextField(db_default="", blank=True)
    target_revision = models.TextField(db_default="", blank=True)
    admitted_target_revision = models.TextField(db_default="", blank=True)
    attempt = models.BigIntegerField(db_default=0)
    attempts = models.IntegerField(db_default=0)
    next_attempt_at = models.DateTimeField(null=True, blank=True)
    pending_intent = models.TextField(
        choices=PendingIntent.choices, db_default=PendingIntent.NONE, blank=True
    )
    pending_request_body = models.TextField(db_default="", blank=True)
    created_at = models.DateTimeField(db_default=Now())
    updated_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "duckgres_trino_pool_publications"
        verbose_name = "Trino pool publication"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(state__in=[s.value for s in PublicationState]),
                name="trino_pub_state_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(pending_intent__in=[i.value for i in PendingIntent]),
                name="trino_pub_pending_intent_valid",
            ),
            models.CheckConstraint(condition=models.Q(attempt__gte=0), name="trino_pub_attempt"),
        ]

    def __str__(self) -> str:
        return f"{self.pool_id}/{self.org_id} ({self.state})"
