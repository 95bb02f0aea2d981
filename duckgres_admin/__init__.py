"""Duckgres Admin: the control plane of a fleet of Duckgres warehouses."""

from duckgres_admin.celery import app as celery_app

__all__ = ["celery_app"]
