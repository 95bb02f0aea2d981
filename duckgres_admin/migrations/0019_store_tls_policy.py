"""Store TLS policy (safeguard reshard-122; docs/configuration.md "Metadata-store TLS").

Adds ``tls_policy`` (``verify-full`` | ``allow-weaker``) and ``tls_policy_reason``, makes
``verify-full`` the default ``sslmode`` and lets the database refuse a weaker mode without the
opt-in. **Upgrade step, fail-closed:** a store whose ``sslmode`` (or ``pooler_sslmode``) was
weaker — before this migration ``require`` was the default, so it was rarely a choice — is set
to ``verify-full``; no opt-in is invented for it. A store whose server cannot pass
``verify-full`` against ``DUCKGRES_STORE_SSLROOTCERT`` then fails its connections with
``certificate verify failed`` until an operator sets ``tls_policy=allow-weaker``, a reason and
the weaker mode again (``PATCH /metadata-stores/<name>``). List the affected stores before
migrating with ``SELECT name, sslmode, pooler_sslmode FROM duckgres_metadata_stores WHERE
sslmode <> 'verify-full' OR pooler_sslmode NOT IN ('', 'verify-full')``.
"""

from typing import Any

from django.db import migrations, models


def verify_full_everywhere(apps: Any, schema_editor: Any) -> None:
    store = apps.get_model("duckgres_admin", "MetadataStore")
    store.objects.exclude(sslmode="verify-full").update(sslmode="verify-full")
    store.objects.exclude(pooler_sslmode__in=["", "verify-full"]).update(
        pooler_sslmode="verify-full"
    )


class Migration(migrations.Migration):
    dependencies = [
        ("duckgres_admin", "0018_backup_identity_and_target_claim"),
    ]

    operations = [
        migrations.AddField(
            model_name="metadatastore",
            name="tls_policy",
            field=models.TextField(
                choices=[("verify-full", "Verify Full"), ("allow-weaker", "Allow Weaker")],
                db_default="verify-full",
                default="verify-full",
            ),
        ),
        migrations.AddField(
            model_name="metadatastore",
            name="tls_policy_reason",
            field=models.TextField(blank=True, db_default="", default=""),
        ),
        migrations.AlterField(
            model_name="metadatastore",
            name="sslmode",
            field=models.TextField(default="verify-full"),
        ),
        migrations.RunPython(verify_full_everywhere, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="metadatastore",
            constraint=models.CheckConstraint(
                condition=models.Q(("tls_policy__in", ["verify-full", "allow-weaker"])),
                name="metadata_store_tls_policy_valid",
            ),
        ),
        migrations.AddConstraint(
            model_name="metadatastore",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    ("tls_policy", "allow-weaker"),
                    models.Q(
                        ("sslmode", "verify-full"), ("pooler_sslmode__in", ["", "verify-full"])
                    ),
                    _connector="OR",
                ),
                name="metadata_store_tls_weaker_opt_in",
            ),
        ),
        migrations.AddConstraint(
            model_name="metadatastore",
            constraint=models.CheckConstraint(
                condition=models.Q(
                    models.Q(("tls_policy", "allow-weaker"), _negated=True),
                    models.Q(("tls_policy_reason", ""), _negated=True),
                    _connector="OR",
                ),
                name="metadata_store_tls_reason",
            ),
        ),
    ]
