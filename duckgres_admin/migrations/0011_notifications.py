"""The notification outbox ``duckgres_notifications`` (docs/notifications.md): one row per
terminal event, unique by (kind, subject_id, event)."""

import django.db.models.functions.datetime
from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("duckgres_admin", "0010_password_pull_binding"),
    ]

    operations = [
        migrations.CreateModel(
            name="Notification",
            fields=[
                ("id", models.BigAutoField(primary_key=True, serialize=False)),
                ("kind", models.TextField(choices=[("reshard", "Reshard")])),
                ("subject_id", models.BigIntegerField()),
                ("event", models.TextField()),
                ("payload", models.JSONField()),
                (
                    "state",
                    models.TextField(
                        choices=[
                            ("pending", "Pending"),
                            ("sending", "Sending"),
                            ("delivered", "Delivered"),
                            ("failed", "Failed"),
                        ],
                        default="pending",
                    ),
                ),
                ("attempts", models.IntegerField(default=0)),
                ("last_status", models.IntegerField(blank=True, null=True)),
                ("last_error", models.TextField(blank=True, default="")),
                (
                    "created_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                (
                    "next_attempt_at",
                    models.DateTimeField(db_default=django.db.models.functions.datetime.Now()),
                ),
                ("claimed_until", models.DateTimeField(blank=True, null=True)),
                ("last_attempt_at", models.DateTimeField(blank=True, null=True)),
                ("delivered_at", models.DateTimeField(blank=True, null=True)),
            ],
            options={
                "verbose_name": "notification",
                "db_table": "duckgres_notifications",
                "indexes": [
                    models.Index(
                        condition=models.Q(("state__in", ["pending", "sending"])),
                        fields=["next_attempt_at"],
                        name="notification_due",
                    )
                ],
                "constraints": [
                    models.UniqueConstraint(
                        fields=("kind", "subject_id", "event"), name="notification_one_per_event"
                    ),
                    models.CheckConstraint(
                        condition=models.Q(
                            ("state__in", ["pending", "sending", "delivered", "failed"])
                        ),
                        name="notification_state_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("kind__in", ["reshard"])),
                        name="notification_kind_valid",
                    ),
                    models.CheckConstraint(
                        condition=models.Q(("attempts__gte", 0)),
                        name="notification_attempts_nonnegative",
                    ),
                ],
            },
        ),
    ]
