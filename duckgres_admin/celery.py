"""The Celery application. Tasks are thin: they read rows and call domain services."""

from __future__ import annotations

import os

from celery import Celery

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "duckgres_admin.settings")

app = Celery("duckgres_admin")
app.config_from_object("django.conf:settings", namespace="CELERY")
app.autodiscover_tasks(["reshard", "trino_pools"])
