"""Model options only: admin names that read correctly ("reshard log entries", "Trino pool…").

No schema change (AlterModelOptions).
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("duckgres_admin", "0008_warehouse_binding_unique"),
    ]

    operations = [
        migrations.AlterModelOptions(
            name="reshardlogentry",
            options={
                "verbose_name": "reshard log entry",
                "verbose_name_plural": "reshard log entries",
            },
        ),
        migrations.AlterModelOptions(
            name="trinoclusterbootstrap",
            options={"verbose_name": "Trino cluster bootstrap"},
        ),
        migrations.AlterModelOptions(
            name="trinopool",
            options={"ordering": ["pool_id"], "verbose_name": "Trino pool"},
        ),
        migrations.AlterModelOptions(
            name="trinopoolinstance",
            options={"ordering": ["instance_id"], "verbose_name": "Trino pool instance"},
        ),
        migrations.AlterModelOptions(
            name="trinopooloperation",
            options={
                "ordering": ["created_at", "operation_id"],
                "verbose_name": "Trino pool operation",
            },
        ),
        migrations.AlterModelOptions(
            name="trinopooloperationstep",
            options={"verbose_name": "Trino pool operation step"},
        ),
        migrations.AlterModelOptions(
            name="trinopoolpublication",
            options={"verbose_name": "Trino pool publication"},
        ),
    ]
