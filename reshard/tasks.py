"""Celery tasks of the reshard domain (placeholder module; filled by the launch/janitor work)."""
