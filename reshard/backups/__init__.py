"""Backups: what a warehouse's catalog backups are after their operation ends
(docs/backup.md).

``inventory`` (the backups a warehouse has, listed from its bucket prefix, and the retention
run), ``retention`` (the policy's settings; Django-free: settings import it), ``restore_test``
(are they restorable?), ``requests`` (an on-demand restore test) and ``tasks`` (their Celery
tasks). Writing a backup is an engine: ``reshard.engines.backup``.
"""
