"""Restore tests of the pre-flip catalog backups (docs/backup.md "Restore tests").

One ``BackupVerification`` row per backup object (``bucket``, ``key``) that a restore test has
run on, holding the latest result: ``passed`` when stock ``pg_restore`` restored it into a
scratch database and the restored catalog matched the DuckLake fingerprint its operation
recorded, ``failed`` otherwise (``detail`` says why). A backup with no row is unverified.
"""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class VerificationResult(models.TextChoices):
    PASSED = "passed"
    FAILED = "failed"


class BackupVerification(models.Model):
    id = models.BigAutoField(primary_key=True)
    org_id = models.TextField()
    bucket = models.TextField()
    key = models.TextField()
    op_id = models.BigIntegerField()
    result = models.TextField(choices=VerificationResult.choices)
    detail = models.TextField(default="", blank=True)
    store = models.TextField()  # the metadata store the scratch database was restored on
    object_bytes = models.BigIntegerField(default=0)
    object_modified = models.DateTimeField(null=True, blank=True)  # the object's LastModified
    snapshot_id = models.BigIntegerField(null=True, blank=True)
    data_files = models.BigIntegerField(null=True, blank=True)
    restore_seconds = models.FloatField(default=0)
    checked_at = models.DateTimeField(db_default=Now())

    class Meta:
        db_table = "backup_verification"
        constraints = [
            models.UniqueConstraint(
                fields=["bucket", "key"], name="backup_verification_one_per_object"
            ),
            models.CheckConstraint(
                condition=models.Q(result__in=["passed", "failed"]),
                name="backup_verification_result_valid",
            ),
        ]
        indexes = [models.Index(fields=["org_id", "result", "checked_at"])]

    def __str__(self) -> str:
        return f"{self.key}: {self.result}"
