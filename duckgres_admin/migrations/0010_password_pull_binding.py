"""The password pull's binding (safeguard reshard-79): ``runner_pod_uid`` (the pod uid the
current runner claimed with) and ``password_pull_digest`` (SHA-256 hex of a local runner's
one-time pull credential). Both default to '' in the database, so existing rows and raw inserts
stay valid."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [
        ("duckgres_admin", "0009_model_verbose_names"),
    ]

    operations = [
        migrations.AddField(
            model_name="reshardoperation",
            name="password_pull_digest",
            field=models.TextField(blank=True, db_default=""),
        ),
        migrations.AddField(
            model_name="reshardoperation",
            name="runner_pod_uid",
            field=models.TextField(blank=True, db_default=""),
        ),
    ]
