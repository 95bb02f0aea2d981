"""``python manage.py restore_stream``: the restore test's sandbox
(``reshard.engines.restore.sandbox``).

Thin: run the job named in the environment, print its one-line result, write it to the pod's
termination message (``/dev/termination-log``, when it exists), exit with the outcome's code.
"""

from __future__ import annotations

import contextlib
import os
import sys
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand

from reshard.engines.restore import sandbox

TERMINATION_LOG = Path("/dev/termination-log")


class Command(BaseCommand):
    help = "Stream one backup into pg_restore (the restore test's sandbox; never run by hand)."

    def handle(self, *args: Any, **options: Any) -> None:
        code, message = sandbox.run(os.environ)
        print(message, flush=True)
        if TERMINATION_LOG.exists():
            with contextlib.suppress(OSError):
                TERMINATION_LOG.write_text(message)
        sys.exit(code)
