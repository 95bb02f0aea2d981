"""The backup object's recorded identity (SHA-256, ETag, VersionId), the identity a restore
pins, and the target claim (docs/backup.md "Authenticated backups", docs/restore.md "What a
rollback drops"). Backups written before this migration have no recorded digest: they are no
longer offered for restore (CHANGELOG.md)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    dependencies = [("duckgres_admin", "0017_restore_operations")]

    operations = [
        migrations.AddField(
            model_name="reshardoperation",
            name="target_claimed_at",
            field=models.DateTimeField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name="reshardoperation",
            name="backup_sha256",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
        migrations.AddField(
            model_name="reshardoperation",
            name="backup_etag",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
        migrations.AddField(
            model_name="reshardoperation",
            name="backup_version_id",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
        migrations.AddField(
            model_name="reshardoperation",
            name="restore_backup_sha256",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
        migrations.AddField(
            model_name="reshardoperation",
            name="restore_backup_size",
            field=models.BigIntegerField(db_default=0, default=0),
        ),
        migrations.AddField(
            model_name="reshardoperation",
            name="restore_backup_version_id",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
    ]
