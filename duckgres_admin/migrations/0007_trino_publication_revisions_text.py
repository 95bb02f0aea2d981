"""Schema migration: a publication's binding and target revisions are strings (spec §4.11).

``principal_revision`` (the binding revision last published: 32 hex), ``target_revision``
(``b<binding revision>.a<attempt>``) and ``admitted_target_revision`` (the last target the
Gateway admitted; empty = never admitted, the §4.10 ready gate) were created as bigint. They
become text with an empty default; an existing 0 (never set) becomes ''.
"""

from __future__ import annotations

from django.db import migrations, models

COLUMNS = ("principal_revision", "target_revision", "admitted_target_revision")


def _sql(column: str) -> str:
    return (
        f"ALTER TABLE duckgres_trino_pool_publications "
        f"ALTER COLUMN {column} DROP DEFAULT, "
        f"ALTER COLUMN {column} TYPE text USING "
        f"(CASE WHEN {column} = 0 THEN '' ELSE {column}::text END), "
        f"ALTER COLUMN {column} SET DEFAULT ''"
    )


def _reverse_sql(column: str) -> str:
    return (
        f"ALTER TABLE duckgres_trino_pool_publications "
        f"ALTER COLUMN {column} DROP DEFAULT, "
        f"ALTER COLUMN {column} TYPE bigint USING 0, "
        f"ALTER COLUMN {column} SET DEFAULT 0"
    )


class Migration(migrations.Migration):
    dependencies = [("duckgres_admin", "0006_trino_operator_beat")]

    operations = [
        migrations.SeparateDatabaseAndState(
            database_operations=[
                migrations.RunSQL(_sql(column), _reverse_sql(column)) for column in COLUMNS
            ],
            state_operations=[
                migrations.AlterField(
                    model_name="trinopoolpublication",
                    name=column,
                    field=models.TextField(blank=True, db_default=""),
                )
                for column in COLUMNS
            ],
        )
    ]
