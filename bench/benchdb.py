"""The config-store database a benchmark runs against: dropped and created afresh, migrated,
with Django set up on it (local services of ``.ci/services.sh``: PostgreSQL on 5432)."""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
ADMIN_DSN = "postgresql://postgres@127.0.0.1:5432/postgres?sslmode=prefer"


def recreate(name: str) -> None:
    with psycopg.connect(ADMIN_DSN, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        admin.execute(f'CREATE DATABASE "{name}"')


def setup_django(config_db: str) -> None:
    """Django on ``config_db`` (already created), migrated; warnings and below silenced."""
    sys.path.insert(0, str(ROOT))
    os.environ["DUCKGRES_CONFIG_STORE"] = (
        f"postgresql://postgres@127.0.0.1:5432/{config_db}?sslmode=prefer"
    )
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "duckgres_admin.settings")
    import django

    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0)
    logging.disable(logging.WARNING)
