"""Test-only fault injection (never set in production manifests).

``DUCKGRES_RESHARD_TEST_KILL_AT=<point>`` SIGKILLs the runner itself at ``<point>``, but only when
``DUCKGRES_RESHARD_TEST_HOOKS=1`` is also set. Points: ``step:<name>`` (right after the step was
stamped, before it does anything), ``after_nologin`` (``ALTER ROLE … NOLOGIN`` sent, before
``source_fenced_at``), ``after_source_drop`` (``DROP DATABASE`` done, before
``source_dropped_at``), ``after_flip`` (binding switched, before the cutover wait).
"""

from __future__ import annotations

import os
import signal


def kill_point(point: str) -> None:
    if os.environ.get("DUCKGRES_RESHARD_TEST_HOOKS") != "1":
        return
    if os.environ.get("DUCKGRES_RESHARD_TEST_KILL_AT", "") == point:
        os.kill(os.getpid(), signal.SIGKILL)
