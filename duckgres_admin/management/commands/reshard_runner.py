"""``python manage.py reshard_runner``: run one reshard operation (spec reshard §4.2).

Thin: read ``DUCKGRES_RESHARD_OP_ID``, install signal handlers that only set flags, log the
AWS context (region, S3 endpoint, credential source; never a secret) to the op log and the
process log, hand over to ``reshard.runner.execute``, then — as the very last act of a local
runner (``POD_UID`` starting with ``local-``) — write
``<DUCKGRES_RESHARD_LOCAL_STATE_DIR>/op-<id>.exit`` holding the exit code (the local launcher's
contract, §4.13).
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path
from traceback import format_exc
from types import FrameType
from typing import Any

import structlog
from django.conf import settings
from django.core.management.base import BaseCommand

from duckgres_admin.base.scrub import Scrubber, process_scrubber
from duckgres_admin.lib.s3 import describe_aws_context
from duckgres_admin.platform.logs import configure_logging
from reshard.runner.context import RunContext
from reshard.runner.execute import EXIT_INFRA, run_process, runner_identity
from reshard.runner.logwriter import OpLogWriter


def write_exit_file(op_id: int, code: int) -> None:
    """The local launcher's exit file, written atomically (tmp + rename)."""
    if not os.environ.get("POD_UID", "").startswith("local-"):
        return
    state_dir = Path(settings.DUCKGRES_RESHARD_LOCAL_STATE_DIR)
    state_dir.mkdir(parents=True, exist_ok=True)
    final = state_dir / f"op-{op_id}.exit"
    tmp = state_dir / f".op-{op_id}.exit.{os.getpid()}"
    tmp.write_text(f"{code}\n", encoding="utf-8")
    tmp.replace(final)


def log_aws_context(op_id: int, scrubber: Scrubber) -> None:
    """The runner's first op-log line (mirrored to the process log): its AWS context. Like
    every op-log append it never fails the run."""
    oplog = OpLogWriter(op_id, scrubber)
    try:
        oplog.info(describe_aws_context())
    except Exception as exc:  # noqa: BLE001 - a log line never stops the runner
        structlog.get_logger("duckgres.reshard.runner").warning(
            "cannot log the AWS context", op_id=op_id, error=scrubber.scrub(str(exc))
        )
    finally:
        oplog.close()


class Command(BaseCommand):
    help = "Run one reshard operation (DUCKGRES_RESHARD_OP_ID); started by a launcher."

    def handle(self, *args: Any, **options: Any) -> None:
        configure_logging()
        log = structlog.get_logger("duckgres.reshard.runner")
        raw = os.environ.get("DUCKGRES_RESHARD_OP_ID", "")
        try:
            op_id = int(raw)
            if op_id <= 0:
                raise ValueError
        except ValueError:
            log.error("DUCKGRES_RESHARD_OP_ID must be a positive integer", value=raw[:40])
            sys.exit(EXIT_INFRA)
        # The config store's password is secret-bearing too (spec §6): scrub it like the rest.
        scrubber = process_scrubber(str(settings.DATABASES["default"].get("PASSWORD") or ""))
        ctx = RunContext(op_id=op_id, runner_id=runner_identity(), scrubber=scrubber)

        def on_signal(signum: int, _frame: FrameType | None) -> None:
            ctx.request_stop(signal.Signals(signum).name)

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        code = EXIT_INFRA
        try:
            log_aws_context(op_id, scrubber)
            code = run_process(op_id, ctx)
        except Exception:  # noqa: BLE001 - logged (scrubbed), then the infra exit code
            log.error("runner crashed", op_id=op_id, error=ctx.scrubber.scrub(format_exc()))
        finally:
            try:
                write_exit_file(op_id, code)
            finally:
                sys.exit(code)
