"""The CLI prints no terminal escape sequence a server sent (safeguard reshard-126).

Op-log lines and an operation's error are printed by the real console script against the live
API (the hostile text stored in the real database); server error messages come from a real HTTP
server on 127.0.0.1 that answers every request with a hostile error.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.utils import timezone

from duckgres_admin.models import LogSource, ReshardLogEntry, ReshardOperation
from duckgres_cli.text import clean
from tests.fixtures.cli import Cli

pytestmark = pytest.mark.safeguard("reshard-126")

HOSTILE = "a\x1b]0;pwned\x07b\x1b[2Jc\x9b31md\rover\x1b]52;c;Y2xpcA==\x1b\\e\x9d0;t\x9cf\x08g\x7fh"
FORBIDDEN = ("\x1b", "\x9b", "\x9d", "\x9c", "\x07", "\r", "\x08", "\x7f", "pwned", "[2J")


def assert_clean(text: str) -> None:
    for piece in FORBIDDEN:
        assert piece not in text, (piece, text)


def test_clean_removes_every_sequence_and_control() -> None:
    assert clean(HOSTILE) == "abcdoverefgh"
    assert clean("one\ntwo\tthree") == "onetwo\tthree"  # tabs separate table columns
    assert clean("one\ntwo", multiline=True) == "one\ntwo"
    assert clean("unterminated \x1b]0;title") == "unterminated "
    assert clean("csi at the end \x1b[") == "csi at the end "
    assert clean("plain text: ünïcode → ok") == "plain text: ünïcode → ok"


def test_follow_prints_op_log_lines_and_the_error_without_escapes(
    cli: Cli, make_store, make_warehouse, make_op, transactional_db
) -> None:
    warehouse = make_warehouse(
        store=make_store(),
        database_name="db_esc",
        metadata_store_database="db_esc",
        metadata_store_user="user_esc",
        metadata_store_password_ref="env:DUCKGRES_TEST_TENANT_ESC",
    )
    op = make_op(warehouse, to_store=make_store(), state="running")
    ReshardLogEntry.objects.create(
        operation_id=op.id, level="info", source=LogSource.RUNNER, message=f"step {HOSTILE}"
    )
    ReshardLogEntry.objects.create(
        operation_id=op.id, level="warn", source=LogSource.RUNNER, message="two\nlines"
    )
    ReshardOperation.objects.filter(pk=op.id).update(
        state="failed", finished_at=timezone.now(), error=f"boom {HOSTILE}"
    )
    result = cli("reshard", "follow", str(op.id), "--interval", "0.2", "--deadline", "30")
    assert result.returncode == 4, result.stderr
    assert_clean(result.stdout)
    lines = result.stdout.splitlines()
    assert lines[0].endswith("[runner/info] step abcdoverefgh"), lines
    assert lines[1].endswith("[runner/warn] twolines")  # one entry, one line
    assert lines[-1] == f"reshard {op.id} failed: boom abcdoverefgh"
    shown = cli("reshard", "show", str(op.id))
    assert shown.returncode == 0, shown.stderr
    assert "boom abcdoverefgh" in shown.stdout
    assert_clean(shown.stdout)


class HostileApi:
    """A real HTTP server on 127.0.0.1 standing in for a compromised or spoofed API: every
    request is answered ``status`` with ``{"error": HOSTILE}``."""

    def __init__(self, status: int) -> None:
        body = json.dumps({"error": f"refused {HOSTILE}\nsecond line"}).encode()

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_POST = do_GET

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.parametrize("status", [400, 503])
def test_server_error_messages_are_printed_without_escapes(cli: Cli, status: int) -> None:
    api = HostileApi(status)
    try:
        result = cli("reshard", "show", "1", DUCKGRES_API_URL=api.url)
    finally:
        api.close()
    assert result.returncode != 0
    assert "refused abcdoverefgh" in result.stderr, result.stderr
    assert_clean(result.stderr)
