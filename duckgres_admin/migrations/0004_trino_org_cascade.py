# ruff: noqa: E501
"""Schema: the warehouse Trino row follows its warehouse in the database (spec trino-pools §2.1).

Django 5.2 emulates ``on_delete=CASCADE`` in Python only; the specification requires the
foreign key ``duckgres_managed_warehouse_trino.org_id → duckgres_managed_warehouses.org_id`` to
be ``ON DELETE CASCADE`` in the database, so a warehouse deleted by SQL takes its Trino row.
"""

from __future__ import annotations

from django.db import migrations

FORWARD = """
DO $$
DECLARE fk text;
BEGIN
    SELECT conname INTO fk FROM pg_constraint
     WHERE conrelid = 'duckgres_managed_warehouse_trino'::regclass AND contype = 'f';
    EXECUTE format('ALTER TABLE duckgres_managed_warehouse_trino DROP CONSTRAINT %I', fk);
END $$;
ALTER TABLE duckgres_managed_warehouse_trino
  ADD CONSTRAINT duckgres_managed_warehouse_trino_org_fk FOREIGN KEY (org_id)
  REFERENCES duckgres_managed_warehouses (org_id) ON DELETE CASCADE DEFERRABLE INITIALLY DEFERRED;
"""

BACKWARD = """
ALTER TABLE duckgres_managed_warehouse_trino DROP CONSTRAINT duckgres_managed_warehouse_trino_org_fk;
ALTER TABLE duckgres_managed_warehouse_trino
  ADD CONSTRAINT duckgres_managed_warehouse_trino_org_fk FOREIGN KEY (org_id)
  REFERENCES duckgres_managed_warehouses (org_id) DEFERRABLE INITIALLY DEFERRED;
"""


class Migration(migrations.Migration):
    dependencies = [("duckgres_admin", "0003_trino_tables")]

    operations = [migrations.RunSQL(FORWARD, BACKWARD)]
