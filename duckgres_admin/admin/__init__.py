"""Django admin: the operator screens (issue 6 item 1; docs/admin.md), one module per resource.

Everything is read-only through the admin's own forms: the control-plane rows are written by
the API services, the runner and the janitor (guarded CAS updates), never by a model form.
Operators act through the three reshard screens — start (dry-run plan first), cancel and the
``reshard_recover`` dry run — the restore screens and a store drain's pause / resume / cancel
buttons, which call the same services as the API and are refused on the server unless the user
may act (``adminui.roles``). Secrets exist only as references (``*_ref`` columns); no password
column exists, so none can be rendered.

Django's autodiscovery imports this package; importing the modules registers their screens.
"""

from duckgres_admin.admin import access, operations, stores, trino, warehouses

__all__ = ["access", "operations", "stores", "trino", "warehouses"]
