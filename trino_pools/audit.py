"""Ownership audit (spec trino-pools §4.14, safeguard 38).

Lists Trino-enabled orgs whose stored owner (``trino_cell_id``) is not one of the configured
stored ids -- empty owners and owners of removed pools included. Non-zero: one WARNING with the
count and a sample of at most 20 ``org_id=<id> owner=<owner or ''>`` pairs sorted by org id. The
count is set on ``duckgres_trino_unconfigured_owner_warehouses``.

It only reads. Where it can, it runs in a READ ONLY transaction, so even a future edit that
tried to write here would fail instead of changing a row. Such orgs fail closed until an
operator disables them or moves them while both pools are configured.

Runs at the start of the control and trino workers and in ``manage.py trino_check`` (log only),
and from beat every 5 minutes in the ``trino`` lease holder (log + gauge); never in
``AppConfig.ready()``, ``migrate`` or ``makemigrations``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from django.db import connection, transaction

from duckgres_admin.models import WarehouseTrino
from trino_pools import metrics
from trino_pools.config import TrinoSettings

_log = logging.getLogger("duckgres.trino.audit")

SAMPLE_SIZE = 20


@dataclass(frozen=True)
class AuditResult:
    count: int
    sample: tuple[tuple[str, str], ...]

    def describe(self) -> str:
        pairs = " ".join(f"org_id={org} owner={owner or chr(39) * 2}" for org, owner in self.sample)
        shown = f"first {len(self.sample)}" if self.count > len(self.sample) else "all"
        return (
            f"trino ownership audit: {self.count} Trino-enabled warehouse(s) have an owner that "
            f"is not a configured pool; they fail closed until an operator disables them or "
            f"moves them while both pools are configured ({shown}, by org id): {pairs}"
        )


def _query(stored_ids: frozenset[str]) -> AuditResult:
    rows = WarehouseTrino.objects.filter(enabled=True).exclude(trino_cell_id__in=stored_ids)
    count = rows.count()
    sample = tuple(
        (str(org), str(owner))
        for org, owner in rows.order_by("warehouse_id").values_list(
            "warehouse_id", "trino_cell_id"
        )[:SAMPLE_SIZE]
    )
    return AuditResult(count=count, sample=sample)


def run_audit(settings: TrinoSettings, *, set_gauge: bool = True) -> AuditResult | None:
    """Audit and log; set the gauge unless ``set_gauge`` is false (the start-up and
    ``trino_check`` runs are "log only", §4.14). ``None`` when Trino is not wired."""
    if not settings.wired:
        return None
    if connection.in_atomic_block:
        result = _query(settings.stored_ids)
    else:
        with transaction.atomic(), connection.cursor() as cursor:
            cursor.execute("SET TRANSACTION READ ONLY")
            result = _query(settings.stored_ids)
    if set_gauge:
        metrics.set_unconfigured_owners(result.count)
    if result.count:
        _log.warning(result.describe())
    else:
        _log.info("trino ownership audit: every Trino-enabled warehouse has a configured owner")
    return result
