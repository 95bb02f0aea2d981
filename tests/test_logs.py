"""Process logs are one JSON object per line, carry op id / epoch fields, and never a shared
secret, raw or URL-encoded (design §6, spec reshard §2.7, docs/logging.md). The real Celery,
beat and gunicorn processes: tests/test_process_logging.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import quote, quote_plus

from django.utils.encoding import escape_uri_path

from tests.fixtures.secrets_scan import find_secret, unique_password
from tests.testenv import TEST_ENV

ROOT = Path(__file__).resolve().parent.parent

CODE = """
import django, logging, os
django.setup()
log = logging.getLogger("duckgres.test")
log.info("stdlib line", extra={"op_id": 7, "epoch": 3})
log.warning("leaked " + os.environ["DUCKGRES_INTERNAL_SECRET"])
"""


FORMS = """
import django, logging, os, structlog
from urllib.parse import quote, quote_plus
from django.utils.encoding import escape_uri_path
django.setup()
from duckgres_admin.platform.logs import configure_logging
configure_logging()  # again (the runner, Celery's signals): still one JSON line per record
secret = os.environ["DUCKGRES_INTERNAL_SECRET"]
log = logging.getLogger("duckgres.test")
class Holder:
    def __repr__(self):
        return f"<Holder {secret}>"
log.info(
    "forms %s %s %s %s",
    secret, quote(secret, safe=""), quote_plus(secret), escape_uri_path(secret),
    extra={"op_id": 7, "epoch": 3, "pool_id": 9, "nested": {"k": [secret]}, "obj": Holder()},
)
structlog.get_logger("duckgres.test").info("native", op_id=7, dsn="u:" + quote(secret, safe=""))
try:
    raise RuntimeError("boom " + quote(secret))
except RuntimeError:
    log.exception("failed", extra={"op_id": 7})
"""


def _run(code: str, **env_extra: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUCKGRES_", "DJANGO_"))}
    env.update(TEST_ENV, **env_extra)
    return subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )


def test_log_lines_are_json_with_extra_fields_and_no_shared_secret():
    result = _run(CODE)
    assert result.returncode == 0, result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    first = next(line for line in lines if line["event"] == "stdlib line")
    assert (first["op_id"], first["epoch"], first["level"]) == (7, 3, "info")
    assert "timestamp" in first
    leaked = next(line for line in lines if line["event"].startswith("leaked"))
    assert leaked["event"] == "leaked ***"
    assert TEST_ENV["DUCKGRES_INTERNAL_SECRET"] not in result.stderr


def test_every_form_of_a_shared_secret_is_masked_in_every_field():
    secret = unique_password()
    result = _run(FORMS, DUCKGRES_INTERNAL_SECRET=secret)
    assert result.returncode == 0, result.stderr
    assert not find_secret(secret, result.stderr), result.stderr
    assert quote(secret) not in result.stderr
    assert escape_uri_path(secret) not in result.stderr
    lines = [json.loads(line) for line in result.stderr.splitlines()]
    assert [line["event"] for line in lines] == ["forms *** *** *** ***", "native", "failed"]
    forms, native, failed = lines
    assert (forms["op_id"], forms["epoch"], forms["pool_id"]) == (7, 3, 9)
    assert forms["nested"] == {"k": ["***"]}
    assert forms["obj"] == "<Holder ***>"
    assert (native["op_id"], native["dsn"]) == (7, "u:***")
    assert failed["op_id"] == 7
    assert failed["exception"].endswith("RuntimeError: boom ***")
    assert quote_plus(secret) not in result.stdout + result.stderr
