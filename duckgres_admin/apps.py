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
        from duckgres_admin.platform.logs import configure_logging

        configure_logging()
        log = logging.getLogger("duckgres.config")
        for warning in getattr(settings, "CONFIG_WARNINGS", []):
            log.warning(warning)

        # Trino (spec trino-pools §4.1 steps 1-6): environment and registry only -- never the
        # database or the network, so `migrate` works on an empty database. A bad configuration
        # raises ImproperlyConfigured and the process does not start.
        # The operation kinds (reshard.kinds): the runner finds them in its registry, which
        # importing the package fills, in every process that may read an operation.
        import reshard.kinds  # noqa: F401
        from trino_pools import config as trino_config
        from trino_pools import metrics as trino_metrics

        trino_metrics.mark_configured(trino_config.validate_process())
