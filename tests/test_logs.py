"""Process logs are one JSON object per line, carry op id / epoch fields, and never a shared
secret (design §6, spec reshard §2.7)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from tests.testenv import TEST_ENV

ROOT = Path(__file__).resolve().parent.parent

CODE = """
import django, logging, os
django.setup()
log = logging.getLogger("duckgres.test")
log.info("stdlib line", extra={"op_id": 7, "epoch": 3})
log.warning("leaked " + os.environ["DUCKGRES_INTERNAL_SECRET"])
"""


def test_log_lines_are_json_with_extra_fields_and_no_shared_secret():
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUCKGRES_", "DJANGO_"))}
    env.update(TEST_ENV)
    result = subprocess.run(
        [sys.executable, "-c", CODE], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines() if line.startswith("{")]
    first = next(line for line in lines if line["event"] == "stdlib line")
    assert (first["op_id"], first["epoch"], first["level"]) == (7, 3, "info")
    assert "timestamp" in first
    leaked = next(line for line in lines if line["event"].startswith("leaked"))
    assert leaked["event"] == "leaked ***"
    assert TEST_ENV["DUCKGRES_INTERNAL_SECRET"] not in result.stderr
