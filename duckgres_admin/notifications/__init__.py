"""Notifications: the outbox of terminal events and their signed webhook delivery
(docs/notifications.md). ``config`` is imported by the settings, so this package imports nothing
of Django at import time."""
