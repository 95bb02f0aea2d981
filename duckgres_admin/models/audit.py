"""Operator roles (spec §2.10) and the audit log of mutating requests (§2.11)."""

from __future__ import annotations

from django.db import models
from django.db.models.functions import Now


class OperatorRole(models.TextChoices):
    VIEWER = "viewer"
    ADMIN = "admin"


class Operator(models.Model):
    email = models.TextField(unique=True)
    role = models.TextField(choices=OperatorRole.choices, default=OperatorRole.VIEWER)
    created_at = models.DateTimeField(db_default=Now())
    disabled = models.BooleanField(default=False)

    class Meta:
        db_table = "duckgres_operators"
        constraints = [
            models.CheckConstraint(
                condition=models.Q(role__in=["viewer", "admin"]), name="operator_role_valid"
            ),
            models.CheckConstraint(
                condition=models.Q(email=models.functions.Lower("email")),
                name="operator_email_lowercase",
            ),
        ]

    def __str__(self) -> str:
        return f"{self.email} ({self.role})"


class AuditRecord(models.Model):
    id = models.BigAutoField(primary_key=True)
    at = models.DateTimeField(db_default=Now())
    actor = models.TextField()
    role = models.TextField(default="", blank=True)
    source = models.TextField()
    method = models.TextField()
    path = models.TextField()
    org_id = models.TextField(default="", blank=True)
    status = models.IntegerField()
    client_ip = models.TextField(default="", blank=True)
    action = models.TextField(default="", blank=True)
    detail = models.TextField(default="", blank=True)

    class Meta:
        db_table = "duckgres_audit_log"
        indexes = [
            models.Index(fields=["org_id", "-id"], name="audit_org_recent"),
            models.Index(fields=["at"], name="audit_at"),
        ]

    def __str__(self) -> str:
        return f"{self.at} {self.actor} {self.method} {self.path} {self.status}"
