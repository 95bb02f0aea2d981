#!/usr/bin/env python3
"""Run a command with the test suite's environment defaults (tests/testenv.py) applied.

Used by the Makefile for `manage.py` checks outside pytest, so that `make lint` and `make test`
see exactly the settings the suite uses. Values already in the environment win.

    .venv/bin/python scripts/with_test_env.py manage.py makemigrations --check --dry-run
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: with_test_env.py <program-or-script.py> [args...]", file=sys.stderr)
        return 2
    sys.path.insert(0, str(ROOT))
    import tests.testenv  # noqa: F401  (applies the defaults to os.environ)

    command = [sys.executable, *argv] if argv[0].endswith(".py") else argv
    return subprocess.call(command, env=os.environ.copy())


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
