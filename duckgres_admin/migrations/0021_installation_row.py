"""The installation's one row: a random tag, and for an installation that already has
operations, the address-derived tag their names were made with (``previous_tag``)."""

from __future__ import annotations

import hashlib
import secrets
from typing import Any

from django.db import migrations


def create_row(apps: Any, schema_editor: Any) -> None:
    installation = apps.get_model("duckgres_admin", "Installation")
    operations = apps.get_model("duckgres_admin", "ReshardOperation")
    if installation.objects.using(schema_editor.connection.alias).exists():
        return
    previous = ""
    if operations.objects.using(schema_editor.connection.alias).exists():
        db = schema_editor.connection.settings_dict
        where = f"{db.get('HOST', '')}:{db.get('PORT', '')}/{db.get('NAME', '')}"
        previous = hashlib.sha256(where.encode()).hexdigest()[:8]
    installation.objects.using(schema_editor.connection.alias).create(
        id=1, tag=secrets.token_hex(6), previous_tag=previous
    )


class Migration(migrations.Migration):
    dependencies = [("duckgres_admin", "0020_installation")]

    operations = [migrations.RunPython(create_row, migrations.RunPython.noop)]
