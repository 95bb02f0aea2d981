"""Operator screens in the Django admin (issue 6 item 1): roles, progress, views."""
