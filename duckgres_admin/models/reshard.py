"""Reshard operations, their op log and step timings (spec reshard §2.5-§2.8).

The operation row is the single source of truth. Runner writes are fenced by
``(id, state='running', runner_id, runner_epoch)``; see ``reshard.fencing``.
There is no password column, on purpose.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now

from duckgres_admin.platform import names


class OpState(models.TextChoices):
    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"


class OpKind(models.TextChoices):
    """What an operation does. ``restore``: the catalog is replaced by a backup object of the
    org's own, restored onto a store (another, or in place) by the reshard step machine
    (docs/restore.md)."""

    RESHARD = "reshard"
    RESTORE = "restore"


ACTIVE_STATES = (OpState.PENDING.value, OpState.RUNNING.value)
TERMINAL_STATES = (OpState.SUCCEEDED.value, OpState.FAILED.value, OpState.CANCELLED.value)

COMPACTION_PRIOR_SHAPES = models.Q(compaction_prior__isnull=True) | models.Q(
    compaction_prior__in=[
        {"present": False},
        {"present": True, "value": True},
        {"present": True, "value": False},
    ]
)


class ReshardOperation(models.Model):
    id = models.BigAutoField(primary_key=True)
    org_id = models.TextField()
    created_by = models.TextField(default="", blank=True)

    source_kind = models.TextField()
    from_shard = models.TextField(default="", blank=True)
    source_endpoint = models.TextField(default="", blank=True)
    source_port = models.IntegerField(default=0)
    source_sslmode = models.TextField(default="", blank=True)
    source_user = models.TextField(default="", blank=True)
    source_database = models.TextField(default="", blank=True)
    source_password_secret_ref = models.TextField(default="", blank=True)
    compaction_prior = models.JSONField(null=True, blank=True)

    target_kind = models.TextField()
    to_shard = models.TextField(default="", blank=True)
    target_endpoint = models.TextField(default="", blank=True)
    target_port = models.IntegerField(default=0)
    target_sslmode = models.TextField(default="", blank=True)
    target_user = models.TextField(default="", blank=True)
    target_database = models.TextField(default="", blank=True)
    target_password_secret_ref = models.TextField(default="", blank=True)

    state = models.TextField(choices=OpState.choices, default=OpState.PENDING)
    step = models.TextField(default="", blank=True)
    error = models.TextField(default="", blank=True)
    cancel_requested = models.BooleanField(default=False)
    drain_timeout_seconds = models.BigIntegerField(default=1800)
    cutover_timeout_seconds = models.BigIntegerField(default=0)
    launcher = models.TextField()
    runner_id = models.TextField(default="", blank=True)
    runner_epoch = models.BigIntegerField(default=0)
    respawn_attempts = models.IntegerField(default=0)
    runner_image = models.CharField(max_length=1024, default="", blank=True)
    heartbeat_at = models.DateTimeField(null=True, blank=True)
    blocked_at = models.DateTimeField(null=True, blank=True)
    unblocked_at = models.DateTimeField(null=True, blank=True)

    # Milestones (§2.6): written only after positive observation.
    source_access_verified_at = models.DateTimeField(null=True, blank=True)
    source_fence_requested_at = models.DateTimeField(null=True, blank=True)
    source_fenced_at = models.DateTimeField(null=True, blank=True)
    target_rendered_at = models.DateTimeField(null=True, blank=True)
    target_login_ready_at = models.DateTimeField(null=True, blank=True)
    # The target database is this operation's: it created it, or found it holding nothing and
    # adopted it (reshard.engines.identity check 4). Only then does a rollback or recovery drop what
    # is in it; without it, nothing there is touched (docs/restore.md "What a rollback drops").
    target_claimed_at = models.DateTimeField(null=True, blank=True)
    external_verified_at = models.DateTimeField(null=True, blank=True)
    source_drop_committed_at = models.DateTimeField(null=True, blank=True)
    source_dropped_at = models.DateTimeField(null=True, blank=True)

    tables_copied = models.BigIntegerField(default=0)
    rows_copied = models.BigIntegerField(default=0)
    bytes_copied = models.BigIntegerField(default=0)
    progress = models.JSONField(default=dict, blank=True)
    backup_s3_uri = models.TextField(default="", blank=True)
    backup_bytes = models.BigIntegerField(default=0)
    # The backup object's identity as this operation wrote it (docs/backup.md "Authenticated
    # backups"): the SHA-256 of the bytes streamed through the part buffers, the ETag and the
    # VersionId (versioned buckets) the store reported. Only a recorded object is a backup.
    backup_sha256 = models.TextField(default="", blank=True, db_default="")
    backup_etag = models.TextField(default="", blank=True, db_default="")
    backup_version_id = models.TextField(default="", blank=True, db_default="")
    kind = models.TextField(choices=OpKind.choices, default=OpKind.RESHARD, db_default="reshard")
    # A restore: the backup object (a key under the org's bucket prefix, one of its own) and
    # the DuckLake fingerprint its operation recorded (None: that operation recorded none).
    restore_backup_key = models.TextField(default="", blank=True, db_default="")
    # The object as checked at the start: read from that bucket, only while its ETag is that.
    restore_backup_bucket = models.TextField(default="", blank=True, db_default="")
    restore_backup_etag = models.TextField(default="", blank=True, db_default="")
    # The identity its operation recorded: the restore reads that version and checks the digest
    # and the size while it streams.
    restore_backup_sha256 = models.TextField(default="", blank=True, db_default="")
    restore_backup_size = models.BigIntegerField(default=0, db_default=0)
    restore_backup_version_id = models.TextField(default="", blank=True, db_default="")
    restore_fingerprint = models.JSONField(null=True, blank=True)
    # What the backup holds, read from the fenced source when the copy was verified
    # (reshard.engines.verify.Verification.fingerprint): the restore test compares a restore against
    # it.
    catalog_fingerprint = models.JSONField(null=True, blank=True)
    # The copy's mode (docs/copy.md "Online copy"), decided at the start and never changed:
    # "offline" (the copy inside the block) or "online" (pre-copy while the tenant runs, catch-up
    # in the block), and why (the operator's words: asked for, or why online was not possible).
    copy_mode = models.TextField(default="offline", db_default="offline")
    copy_mode_reason = models.TextField(default="", blank=True, db_default="")
    # Online only: the full verification and the pre-flip backup run after the unblock (True),
    # or inside the window before the flip (docs/runner.md "The backup in the online mode").
    backup_after_unblock = models.BooleanField(default=False, db_default=False)
    # The change capture on the source (reshard.engines.capture): recorded before it is installed
    # (a crash in between still removes it) and when it is gone.
    capture_installed_at = models.DateTimeField(null=True, blank=True)
    capture_removed_at = models.DateTimeField(null=True, blank=True)
    # Online with the backup after the unblock: the warehouse was unblocked on the target (the
    # commit point); and why the source was kept instead of dropped, when it was.
    target_opened_at = models.DateTimeField(null=True, blank=True)
    source_kept_reason = models.TextField(default="", blank=True, db_default="")
    password_url = models.TextField(default="", blank=True)
    # The password pull's binding (safeguard reshard-79): the pod uid the current runner
    # claimed with (its POD_UID), and for a local runner the SHA-256 hex digest of its one-time
    # pull credential (set by the launcher at spawn, cleared when consumed; never the value).
    runner_pod_uid = models.TextField(db_default="", blank=True)
    password_pull_digest = models.TextField(db_default="", blank=True)

    recovery_required = models.BooleanField(default=False)
    recovery_owner = models.TextField(default="", blank=True)
    recovery_claimed_at = models.DateTimeField(null=True, blank=True)
    recovered_at = models.DateTimeField(null=True, blank=True)
    recovery_outcome = models.TextField(default="", blank=True)
    metrics_observed_at = models.DateTimeField(null=True, blank=True)
    # The store-drain item this operation moves (reshard/control/drains.py); unique: one launch
    # per item.
    drain_item = models.OneToOneField(
        "duckgres_admin.StoreDrainItem",
        null=True,
        blank=True,
        on_delete=models.PROTECT,
        related_name="operation",
    )

    created_at = models.DateTimeField(db_default=Now())
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "duckgres_reshard_operations"
        ordering = ["-id"]
        indexes = [
            models.Index(fields=["org_id", "-id"], name="reshard_op_org_recent"),
            models.Index(fields=["state"], name="reshard_op_state"),
        ]
        constraints = [
            models.UniqueConstraint(
                fields=["org_id"],
                condition=models.Q(state__in=ACTIVE_STATES),
                name="reshard_one_active_op_per_org",
            ),
            models.CheckConstraint(
                condition=models.Q(state__in=[s.value for s in OpState]),
                name="reshard_op_state_valid",
            ),
            models.CheckConstraint(
                condition=models.Q(source_kind__in=["cnpg", "external"])
                & models.Q(target_kind__in=["cnpg", "external"]),
                name="reshard_op_kinds_valid",
            ),
            models.CheckConstraint(
                condition=~(models.Q(source_kind="external") & models.Q(target_kind="external")),
                name="reshard_op_not_external_to_external",
            ),
            models.CheckConstraint(
                condition=(models.Q(target_kind="cnpg") & ~models.Q(to_shard=""))
                | (~models.Q(target_kind="cnpg") & models.Q(to_shard="")),
                name="reshard_op_to_shard_iff_cnpg",
            ),
            models.CheckConstraint(
                condition=models.Q(launcher__in=["pod", "local"]), name="reshard_op_launcher_valid"
            ),
            models.CheckConstraint(
                condition=(models.Q(kind="reshard") & models.Q(restore_backup_key=""))
                | (
                    models.Q(kind="restore")
                    & ~models.Q(restore_backup_key="")
                    & models.Q(target_kind="cnpg")
                ),
                name="reshard_op_restore_has_key_and_cnpg_target",
            ),
            models.CheckConstraint(
                condition=models.Q(runner_epoch__gte=0), name="reshard_op_epoch_nonnegative"
            ),
            models.CheckConstraint(
                condition=models.Q(respawn_attempts__gte=0),
                name="reshard_op_respawns_nonnegative",
            ),
            models.CheckConstraint(
                condition=models.Q(copy_mode__in=["offline", "online"]),
                name="reshard_op_copy_mode_valid",
            ),
            models.CheckConstraint(
                condition=COMPACTION_PRIOR_SHAPES, name="reshard_op_compaction_prior_shape"
            ),
            models.CheckConstraint(
                condition=models.Q(
                    recovery_outcome__in=["", "rolled_back", "rolled_forward", "left_blocked"]
                ),
                name="reshard_op_recovery_outcome_valid",
            ),
        ]

    def __str__(self) -> str:
        return f"reshard op {self.id} ({self.org_id}, {self.state})"

    @property
    def runner_name(self) -> str:
        return names.runner_name(self.id)

    @property
    def is_terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def direction(self) -> str:
        return f"{self.source_kind}_to_{self.target_kind}"

    @property
    def in_place(self) -> bool:
        """A restore onto the store the warehouse is on (docs/restore.md "Onto the current
        store"): the backup goes into a sibling database on the same server, the tenant role
        stays fenced until the replaced catalog is dropped."""
        return (
            self.kind == OpKind.RESTORE
            and self.source_kind == "cnpg"
            and self.target_kind == "cnpg"
            and bool(self.to_shard)
            and self.from_shard == self.to_shard
        )

    @property
    def copy_variant(self) -> str:
        """ "offline", "online" (backup after the unblock) or "online-backup-first"."""
        if self.copy_mode != "online":
            return "offline"
        return "online" if self.backup_after_unblock else "online-backup-first"

    @property
    def kind_key(self) -> tuple[str, bool, str]:
        """What picks the operation's kind object (``reshard.runner.kind.kind_of``)."""
        return (str(self.kind), self.in_place, self.copy_variant)


class LogLevel(models.TextChoices):
    INFO = "info"
    WARN = "warn"
    ERROR = "error"


class LogSource(models.TextChoices):
    API = "api"
    RUNNER = "runner"
    JANITOR = "janitor"
    POD_LOG = "pod-log"
    RECOVERY = "recovery"


class ReshardLogEntry(models.Model):
    id = models.BigAutoField(primary_key=True)
    operation_id = models.BigIntegerField()
    ts = models.DateTimeField(db_default=Now())
    level = models.TextField(choices=LogLevel.choices, default=LogLevel.INFO)
    message = models.TextField()
    runner_epoch = models.BigIntegerField(null=True, blank=True)
    source = models.TextField(choices=LogSource.choices)

    class Meta:
        db_table = "duckgres_reshard_operation_log"
        verbose_name = "reshard log entry"
        verbose_name_plural = "reshard log entries"
        indexes = [models.Index(fields=["operation_id", "id"], name="reshard_log_op_seq")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(level__in=["info", "warn", "error"]), name="reshard_log_level"
            ),
            models.CheckConstraint(
                condition=models.Q(source__in=[s.value for s in LogSource]),
                name="reshard_log_source",
            ),
        ]

    def __str__(self) -> str:
        return f"op {self.operation_id} #{self.id} {self.level}: {self.message[:60]}"


class StepOutcome(models.TextChoices):
    OPEN = ""
    OK = "ok"
    FAILED = "failed"
    CANCELLED = "cancelled"
    SUPERSEDED = "superseded"


class ReshardStepTiming(models.Model):
    id = models.BigAutoField(primary_key=True)
    operation_id = models.BigIntegerField()
    step = models.TextField()
    runner_epoch = models.BigIntegerField()
    started_at = models.DateTimeField(db_default=Now())
    ended_at = models.DateTimeField(null=True, blank=True)
    outcome = models.TextField(choices=StepOutcome.choices, default="", blank=True)

    class Meta:
        db_table = "duckgres_reshard_operation_steps"
        ordering = ["operation_id", "id"]
        indexes = [models.Index(fields=["operation_id", "id"], name="reshard_steps_op")]
        constraints = [
            models.CheckConstraint(
                condition=models.Q(outcome__in=["", "ok", "failed", "cancelled", "superseded"]),
                name="reshard_step_outcome_valid",
            )
        ]

    def __str__(self) -> str:
        return f"op {self.operation_id} {self.step} ({self.outcome or 'open'})"
