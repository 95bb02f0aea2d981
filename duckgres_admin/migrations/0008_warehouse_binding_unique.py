"""Schema migration: one live warehouse per catalog (the "hostile inputs" issue, item 5).

Two partial unique indexes on ``duckgres_managed_warehouses``, over live warehouses (state not
``deleting``/``deleted``):

- ``warehouse_cnpg_binding_unique``: (``metadata_store_name``, ``metadata_store_database``) of
  cnpg bindings: a cnpg binding's server is its store row;
- ``warehouse_external_binding_unique``: (``rtrim(lower(btrim(host)), '.')``, port, database)
  of external bindings.

Existing duplicates are never resolved here (which warehouse owns the catalog is a human
decision, and deleting or re-pointing a binding could strand a tenant): the migration stops,
listing each group and what to do, and changes nothing. Fix the rows, then run it again.
"""

from __future__ import annotations

import django.db.models.functions.text
from django.db import migrations, models

LIVE = "state NOT IN ('deleting', 'deleted')"
DUPLICATES = (
    (
        "cnpg store",
        f"""SELECT metadata_store_name, metadata_store_database,
                   string_agg(org_id, ', ' ORDER BY org_id)
              FROM duckgres_managed_warehouses
             WHERE metadata_store_kind = 'cnpg' AND {LIVE}
             GROUP BY metadata_store_name, metadata_store_database
            HAVING count(*) > 1
             ORDER BY 1, 2""",
    ),
    (
        "external server",
        f"""SELECT rtrim(lower(btrim(metadata_store_host)), '.') || ':' || metadata_store_port,
                   metadata_store_database, string_agg(org_id, ', ' ORDER BY org_id)
              FROM duckgres_managed_warehouses
             WHERE metadata_store_kind = 'external' AND {LIVE}
             GROUP BY 1, metadata_store_database
            HAVING count(*) > 1
             ORDER BY 1, 2""",
    ),
)


def refuse_duplicates(apps: object, schema_editor: object) -> None:
    connection = schema_editor.connection  # type: ignore[attr-defined]
    groups: list[str] = []
    with connection.cursor() as cursor:
        for what, query in DUPLICATES:
            cursor.execute(query)
            for server, database, orgs in cursor.fetchall():
                groups.append(f"database {database} on {what} {server}: warehouses {orgs}")
    if groups:
        listing = "\n  - ".join(groups)
        raise RuntimeError(
            "cannot add the one-warehouse-per-catalog unique indexes: live warehouses share a "
            f"catalog:\n  - {listing}\n"
            "A reshard of either would fence the other's sessions and drop its catalog. For each "
            "group, decide which warehouse owns the catalog; bind the others to their own "
            "database (PATCH /api/v1/warehouses/<org>) or mark them deleted; then run migrate "
            "again. Nothing was changed."
        )


class Migration(migrations.Migration):
    dependencies = [("duckgres_admin", "0007_trino_publication_revisions_text")]

    operations = [
        migrations.RunPython(refuse_duplicates, migrations.RunPython.noop),
        migrations.AddConstraint(
            model_name="warehouse",
            constraint=models.UniqueConstraint(
                condition=models.Q(
                    ("metadata_store_kind", "cnpg"),
                    models.Q(("state__in", ("deleting", "deleted")), _negated=True),
                ),
                fields=("metadata_store", "metadata_store_database"),
                name="warehouse_cnpg_binding_unique",
            ),
        ),
        migrations.AddConstraint(
            model_name="warehouse",
            constraint=models.UniqueConstraint(
                models.Func(
                    django.db.models.functions.text.Lower(
                        django.db.models.functions.text.Trim("metadata_store_host")
                    ),
                    models.Value("."),
                    function="RTRIM",
                ),
                models.F("metadata_store_port"),
                models.F("metadata_store_database"),
                condition=models.Q(
                    ("metadata_store_kind", "external"),
                    models.Q(("state__in", ("deleting", "deleted")), _negated=True),
                ),
                name="warehouse_external_binding_unique",
            ),
        ),
    ]
