"""``manage.py wait_for_migrations``: block until the config store's schema is fully migrated.

The init container of every Deployment (k8s/): beat and the workers must never start against an
unmigrated schema (a beat row or a column a task needs may not exist yet). The migration itself
runs once, in the ``duckgres-admin-migrate`` Job; this command only waits for it.

Each poll opens a fresh connection, reads the migration plan and logs what it observed (the
number of unapplied migrations and the first of them, or the connection error). It exits 0 as
soon as nothing is unapplied, and 1 at the deadline (``--timeout``), so the kubelet restarts the
init container with its back-off and ``kubectl describe pod`` shows why the pod is not starting.
It never migrates anything itself.
"""

from __future__ import annotations

import sys
import time
from typing import Any

from django.core.management.base import BaseCommand, CommandParser
from django.db import DEFAULT_DB_ALIAS, connections
from django.db import Error as DbError
from django.db.migrations.executor import MigrationExecutor

from duckgres_admin.platform.logs import configure_logging, get_logger

EXIT_TIMEOUT = 1


def unapplied_migrations(alias: str = DEFAULT_DB_ALIAS) -> list[str]:
    """``app.name`` of every migration not yet applied to the database, in plan order."""
    connection = connections[alias]
    executor = MigrationExecutor(connection)
    targets = executor.loader.graph.leaf_nodes()
    return [f"{m.app_label}.{m.name}" for m, _backwards in executor.migration_plan(targets)]


class Command(BaseCommand):
    help = "Wait until every migration is applied to the config store (init containers)."

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("--timeout", type=float, default=600.0, help="seconds (default 600)")
        parser.add_argument("--interval", type=float, default=2.0, help="seconds between polls")

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging()
        log = get_logger("duckgres.migrations")
        timeout = max(0.0, float(options["timeout"]))
        interval = max(0.1, float(options["interval"]))
        deadline = time.monotonic() + timeout
        polls = 0
        while True:
            polls += 1
            try:
                pending = unapplied_migrations()
            except DbError as exc:
                log.warning("config store not reachable yet", error=str(exc).strip()[:300])
                pending = None
            finally:
                connections.close_all()
            if pending == []:
                log.info("schema is migrated", polls=polls)
                return
            if pending:
                log.info(
                    "waiting for the migration Job",
                    unapplied=len(pending),
                    first=pending[0],
                    polls=polls,
                )
            if time.monotonic() + interval > deadline:
                log.error(
                    "schema still not migrated at the deadline: is the duckgres-admin-migrate "
                    "Job running? (kubectl -n duckgres logs job/duckgres-admin-migrate)",
                    timeout_seconds=timeout,
                    polls=polls,
                )
                sys.exit(EXIT_TIMEOUT)
            time.sleep(interval)
