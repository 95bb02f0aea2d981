"""On-demand restore tests (docs/backup.md "On demand"): queue the restore test of one backup.

``POST /api/v1/warehouses/<org>/backups/restore-test``, ``duckgres backups test`` and the
admin's backups page call :func:`queue_restore_test`: it checks the request and queues the
existing task ``reshard.backup_restore_test`` on ``duckgres.default`` with the backup as its
arguments; the default worker restores it exactly as a beat run would
(``reshard.backups.restore_test`` with :class:`reshard.backups.restore_test.Only`), and writes the
result where a beat run does (the ``backup_verification`` row, the listing's ``verified``, the
backup's operation log).

Invariants:

- **Nothing is restored in the caller's process.** This module lists the bucket and sends one
  message by task name (the API never imports the Celery task modules); ``pg_restore`` runs
  only in the worker.
- **No no-op is queued.** With no restore-test store configured in this process
  (``DUCKGRES_RESTORE_TEST_STORE`` empty: 409 ``restore_test_disabled``), or one naming no
  cnpg store (409 ``restore_test_store_invalid``), or one whose server serves warehouses
  without ``DUCKGRES_RESTORE_TEST_ALLOW_SERVING_STORE`` (409 ``restore_test_store_serving``),
  nothing is sent.
- **Only one of the org's own backups**, by the listing's rules (``reshard.backups.inventory``), of
  an operation that has ended (409 otherwise: its fingerprint may not be recorded yet). Without a
  key: the org's newest such backup.
- **An asked-for test replaces the backup's earlier result**, whatever it was: that is how a
  failed backup is retried (before this, only by deleting its ``backup_verification`` row).
- The queueing is written to the backup's operation log (who asked, the task id); the view or
  admin action that called this writes the audit row.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from typing import Any

from celery import current_app
from django.conf import settings

from duckgres_admin.base.errors import ServiceError
from duckgres_admin.models import ACTIVE_STATES, MetadataStore
from duckgres_admin.platform.queues import QueueName, TaskName
from reshard.backups import inventory, restore_test
from reshard.operation import oplog

TASK = TaskName.BACKUP_RESTORE_TEST
QUEUE = QueueName.DEFAULT
STORE_VAR = "DUCKGRES_RESTORE_TEST_STORE"


@dataclass(frozen=True)
class Queued:
    """A queued restore test: which backup, on which store, and its result until now."""

    org_id: str
    key: str
    uri: str
    op_id: int
    store: str
    task_id: str
    previous: bool | None  # the latest result before this test (None: never tested)
    previous_at: str | None
    previous_detail: str

    @property
    def description(self) -> str:
        before = {None: "never tested", True: "passed", False: "failed"}[self.previous]
        return (
            f"restore test of {self.uri} (op {self.op_id}; until now {before}) queued on store "
            f"{self.store}: task {self.task_id}"
        )

    def body(self) -> dict[str, Any]:
        return {
            "org_id": self.org_id,
            "backup_key": self.key,
            "uri": self.uri,
            "op_id": self.op_id,
            "store": self.store,
            "task": str(TASK),
            "task_id": self.task_id,
            "previous": {
                "verified": self.previous,
                "verified_at": self.previous_at,
                "verification_detail": self.previous_detail,
            },
            "note": (
                "queued: the default worker restores the backup into a scratch database on the "
                "store and records the result, replacing any earlier one; read it with GET "
                "/api/v1/warehouses/<org>/backups (verified) or in the operation's log"
            ),
        }


def scratch_store() -> MetadataStore:
    """The configured restore-test store, or the 409 that says why there is none."""
    name: str = settings.DUCKGRES_RESTORE_TEST_STORE
    if not name:
        raise ServiceError(
            409,
            f"no restore-test store is configured ({STORE_VAR} is empty), so no restore test "
            f"can run: nothing was queued; set {STORE_VAR} to the name of a cnpg metadata "
            'store (docs/backup.md "Restore tests")',
            code="restore_test_disabled",
        )
    store = MetadataStore.objects.filter(name=name).first()
    if store is None or store.kind != "cnpg":
        problem = "names no metadata store" if store is None else "names an external store"
        raise ServiceError(
            409,
            f"{STORE_VAR}={name!r} {problem}: nothing was queued; name a cnpg store, whose "
            "provisioner login creates and drops the scratch databases",
            code="restore_test_store_invalid",
        )
    serving = restore_test.serving_refusal(store)
    if serving:
        raise ServiceError(409, f"{serving}: nothing was queued", code="restore_test_store_serving")
    return store


def _pick(listing: dict[str, Any], key: str) -> dict[str, Any]:
    entries: list[dict[str, Any]] = list(listing["backups"])
    bucket = listing["bucket"]
    if not bucket:
        raise ServiceError(409, "the warehouse has no data bucket: it has no backups to test")
    more = ""
    if listing["truncated"]:
        more = " (the listing was truncated; an older backup is not seen)"
    if key:
        found = next((b for b in entries if b["key"] == key), None)
        if found is None:
            raise ServiceError(
                404,
                f"backup_key: {key} is not a backup of this warehouse in s3://{bucket}{more} "
                "(GET /api/v1/warehouses/<org>/backups lists them)",
            )
        if found["op_state"] in ACTIVE_STATES:
            raise ServiceError(
                409,
                f"the backup's operation {found['op_id']} is still {found['op_state']}: its "
                "backup is tested once the operation has ended",
            )
        return found
    ended = [b for b in entries if b["op_state"] not in ACTIVE_STATES]
    if not ended:
        raise ServiceError(
            404,
            f"the warehouse has no backup of an ended operation in s3://{bucket}/"
            f"{listing['prefix']}{more}: nothing to test",
        )
    return ended[0]


def _send(task_id: str, org_id: str, key: str, op_id: int) -> None:
    try:
        current_app.send_task(
            str(TASK),
            kwargs={"org_id": org_id, "backup_key": key, "op_id": op_id},
            queue=str(QUEUE),
            task_id=task_id,
        )
    except Exception as exc:  # noqa: BLE001 - any broker failure is the same refusal
        raise ServiceError(
            503,
            f"cannot queue {TASK}: the broker did not take the message "
            f"({type(exc).__name__}: {exc}); nothing was queued, try again",
        ) from None


def queue_restore_test(*, org_id: str, key: str, actor: str) -> Queued:
    """Check, then queue the restore test of ``key`` (``""``: the newest backup); module doc."""
    store = scratch_store()
    listing = inventory.backups_for_org(org_id, with_plan=False)  # 404, 502, 503
    found = _pick(listing, key)
    task_id = str(uuid.uuid4())
    _send(task_id, org_id, str(found["key"]), int(found["op_id"]))
    queued = Queued(
        org_id=org_id,
        key=str(found["key"]),
        uri=str(found["uri"]),
        op_id=int(found["op_id"]),
        store=store.name,
        task_id=task_id,
        previous=found["verified"],
        previous_at=found["verified_at"],
        previous_detail=str(found["verification_detail"] or ""),
    )
    oplog.append(queued.op_id, f"{queued.description}, asked by {actor} (on demand)", source="api")
    return queued
