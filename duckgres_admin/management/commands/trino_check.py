"""``manage.py trino_check``: the Trino start-up validation, run by hand (spec trino-pools §4.1).

Steps 1-6 (environment and registry) already ran in ``AppConfig.ready()``: an invalid
configuration never reaches this command -- the process stops with the list of problems. This
command re-runs them against the current environment, prints what is configured, then runs
step 7: the catalog-writer connection with the schema pinned (writer enabled), the bootstrap
DDL when ``DUCKGRES_TRINO_POOL_CATALOG_BOOTSTRAP`` is true, and the ownership audit.

Exit status: 0 when every check passes (an ownership-audit finding is printed as a warning but
does not fail the check: such orgs fail closed and are reported, §4.14); 1 on any failure.
Secrets (token, DSN) are never printed.
"""

from __future__ import annotations

import os
from typing import Any

from django.core.exceptions import ImproperlyConfigured
from django.core.management.base import BaseCommand, CommandError
from django.db import DatabaseError

from trino_pools import audit, catalog_store, config


class Command(BaseCommand):
    help = "Validate the Trino configuration, the catalog store and warehouse ownership."

    def handle(self, *args: Any, **options: Any) -> None:
        try:
            settings = config.load(os.environ)
        except ImproperlyConfigured as exc:
            raise CommandError(str(exc)) from None
        for warning in settings.warnings:
            self.stdout.write(f"warning: {warning}")
        if not settings.wired:
            self.stdout.write(
                "Trino is not wired (neither DUCKGRES_TRINO_CELLS_FILE nor "
                "DUCKGRES_TRINO_DEFAULT_CELL is set): nothing to check"
            )
            return
        mode = "operator enabled" if settings.operator_enabled else "read-only operator"
        self.stdout.write(f"registry {settings.cells_file}: {len(settings.cells)} pool(s), {mode}")
        for cell in settings.cells:
            default = " (default cell)" if cell.id == settings.default_cell else ""
            self.stdout.write(
                f"  pool {cell.id}{default}: stored id {cell.stored_id}, namespace "
                f"{cell.namespace}, routing group {cell.routing_group}, client {cell.client_url}, "
                f"tenant admission {'on' if cell.pool.tenant_admission else 'off'}"
            )
        if settings.catalog_writer_enabled:
            try:
                schema = catalog_store.check_writer(settings, bootstrap=settings.catalog_bootstrap)
            except catalog_store.CatalogStoreError as exc:
                raise CommandError(str(exc)) from None
            done = "; bootstrap DDL applied" if settings.catalog_bootstrap else ""
            self.stdout.write(f"catalog store: connected, search_path pinned to {schema}{done}")
        else:
            self.stdout.write("catalog store: writer disabled, not checked")
        try:
            result = audit.run_audit(settings, set_gauge=False)
        except DatabaseError as exc:
            raise CommandError(f"ownership audit: cannot read the config store: {exc}") from None
        if result is None or result.count == 0:
            self.stdout.write(
                "ownership audit: every Trino-enabled warehouse has a configured owner"
            )
        else:
            self.stdout.write(f"warning: {result.describe()}")
        self.stdout.write("trino_check: OK")
