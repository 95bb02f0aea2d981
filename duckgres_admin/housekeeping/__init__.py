"""Bounded retention of the config store's growing tables (docs/operations.md "Retention")."""
