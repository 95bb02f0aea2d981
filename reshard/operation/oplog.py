"""Direct op-log appends for the API, the janitor and recovery (spec reshard §2.7).

The runner uses its own buffered writer (``reshard.runner.logwriter``) because its appends must
never fail a step. Every message passes through a scrubber here, the one place this sink is
written from these processes. An exception passed as ``exc`` is rendered with its traceback and
scrubbed as part of the line (safeguard reshard-70).
"""

from __future__ import annotations

import logging
import traceback

from duckgres_admin.base.scrub import Scrubber, process_scrubber
from duckgres_admin.models import ReshardLogEntry

_log = logging.getLogger("duckgres.reshard.oplog")


def append(
    op_id: int,
    message: str,
    *,
    level: str = "info",
    source: str = "api",
    epoch: int | None = None,
    scrubber: Scrubber | None = None,
    exc: BaseException | None = None,
) -> None:
    """Append one op-log line (scrubbed) and mirror it to the process log; with ``exc`` the
    line carries its rendered traceback, scrubbed with the rest."""
    if exc is not None:
        message = f"{message}\n" + "".join(traceback.format_exception(exc)).rstrip()
    text = (scrubber or process_scrubber()).scrub(message)
    ReshardLogEntry.objects.create(
        operation_id=op_id, level=level, message=text, runner_epoch=epoch, source=source
    )
    py_level = {"info": logging.INFO, "warn": logging.WARNING, "error": logging.ERROR}[level]
    _log.log(py_level, text, extra={"op_id": op_id, "epoch": epoch, "source": source})
