"""Test-only fault injection (never set in production manifests).

``DUCKGRES_RESHARD_TEST_KILL_AT=<point>`` SIGKILLs the runner itself at ``<point>``, but only when
``DUCKGRES_RESHARD_TEST_HOOKS=1`` is also set. Points: ``step:<name>`` (right after the step was
stamped, before it does anything), ``after_nologin`` (``ALTER ROLE … NOLOGIN`` sent, before
``source_fenced_at``), ``after_source_drop`` (``DROP DATABASE`` done, before
``source_dropped_at``), ``after_flip`` (binding switched, before the cutover wait),
``backup_part_uploaded`` (a backup part is stored, the multipart upload still open),
``copy_table_done`` (one table copied and committed on the target, the copy not finished).

``DUCKGRES_RESHARD_TEST_PAUSE_AT=<point>`` with ``DUCKGRES_RESHARD_TEST_PAUSE_SECONDS=<s>``
(default 3) sleeps there instead (the heartbeat keeps running), so a test can act mid-step
(e.g. set the cancel flag while the runner is in ``orphaning_source``).
"""

from __future__ import annotations

import os
import signal
import time


def kill_point(point: str) -> None:
    if os.environ.get("DUCKGRES_RESHARD_TEST_HOOKS") != "1":
        return
    if os.environ.get("DUCKGRES_RESHARD_TEST_KILL_AT", "") == point:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get("DUCKGRES_RESHARD_TEST_PAUSE_AT", "") == point:
        time.sleep(float(os.environ.get("DUCKGRES_RESHARD_TEST_PAUSE_SECONDS", "3")))
