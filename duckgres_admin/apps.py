"""The one Django app of the project."""

from __future__ import annotations

import logging

from django.apps import AppConfig
from django.conf import settings


class DuckgresAdminConfig(AppConfig):
    name = "duckgres_admin"
    verbose_name = "Duckgres Admin"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        from duckgres_admin.logs import configure_logging

        configure_logging()
        log = logging.getLogger("duckgres.config")
        for warning in getattr(settings, "CONFIG_WARNINGS", []):
            log.warning(warning)
