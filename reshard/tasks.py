"""Celery tasks of the reshard domain (spec reshard §4.13, §4.15, §6). Thin: id in, service out.

Queues come from ``CELERY_TASK_ROUTES`` in settings (the per-task ``queue`` attribute is
deprecated in Celery 5).

- ``reshard.launch_runner(op_id)`` on ``duckgres.default``: ``acks_late`` (the launch service is
  idempotent: a duplicate delivery never kills a live runner), no autoretry (a failure leaves
  the op ``pending`` for the janitor, which is the retry policy).
- ``reshard.reconcile()`` on ``duckgres.control`` (beat every 30 s, expires 30 s): one janitor
  tick. Not ``acks_late``: a tick lost with its worker is simply the next tick.
"""

from __future__ import annotations

from celery import shared_task
from celery.signals import worker_ready

from duckgres_admin.platform.queues import TaskName
from reshard.backups import tasks as backup_tasks
from reshard.control import janitor, launch, worker

# Celery's autodiscovery imports reshard.tasks only: importing reshard.backups.tasks registers
# reshard.backup_retention and reshard.backup_restore_test in every worker and beat.
assert backup_tasks


@shared_task(
    name=TaskName.LAUNCH_RUNNER,
    acks_late=True,
    autoretry_for=(),
    max_retries=0,
    ignore_result=True,
)
def launch_runner_task(op_id: int) -> str:
    return launch.launch_runner(int(op_id))


@shared_task(name=TaskName.RECONCILE, acks_late=False, ignore_result=True)
def reconcile_task() -> dict[str, object]:
    report = janitor.reconcile()
    return {"leader": report.leader, "stopped": report.stopped, "actions": report.actions}


worker_ready.connect(
    worker.on_worker_ready, weak=False, dispatch_uid="reshard.control-worker-ready"
)
