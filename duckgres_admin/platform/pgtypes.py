"""Reading PostgreSQL's ``'infinity'``/``'-infinity'`` timestamps through the ORM.

The leader-lease rows are seeded with ``expires_at = '-infinity'`` (spec reshard §2.9). psycopg 3
refuses to load infinite timestamps into ``datetime`` (``DataError``), which would break every
ORM read of those rows (the admin included). On each new connection Django registers its own
timestamptz loader; right after that (``connection_created``) we wrap it so that ``-infinity``
loads as ``datetime.min`` and ``infinity`` as ``datetime.max`` (both UTC). The mapping is
read-only: the lease protocol writes these columns only with SQL (``now()``), never from Python.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from django.db.backends.signals import connection_created
from psycopg import pq
from psycopg.postgres import types

TIMESTAMPTZ_OID = types["timestamptz"].oid
NEG_INFINITY = datetime.min.replace(tzinfo=UTC)
POS_INFINITY = datetime.max.replace(tzinfo=UTC)


def _install_infinity_loader(sender: Any, connection: Any, **kwargs: Any) -> None:
    if connection.vendor != "postgresql":
        return
    raw = connection.connection
    base: Any = raw.adapters.get_loader(TIMESTAMPTZ_OID, pq.Format.TEXT)
    if base is None or getattr(base, "_duckgres_infinity", False):
        return

    class InfinityAwareLoader(base):  # type: ignore[misc]
        _duckgres_infinity = True

        def load(self, data: Any) -> Any:
            text = bytes(data)
            if text == b"-infinity":
                return NEG_INFINITY
            if text == b"infinity":
                return POS_INFINITY
            return super().load(data)

    raw.adapters.register_loader("timestamptz", InfinityAwareLoader)


connection_created.connect(_install_infinity_loader, dispatch_uid="duckgres-infinity-loader")
