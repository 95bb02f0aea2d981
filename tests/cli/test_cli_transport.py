"""The CLI's identity and transport (docs/cli.md "Identity and target"): a personal token is sent
as ``Authorization: Token`` and acts as its person (audited by name, refused as a viewer or once
revoked); plain ``http://`` to a host that is not loopback is refused before any connection
unless ``--insecure-http`` (or ``DUCKGRES_INSECURE_HTTP=1``) says so."""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from knox.models import AuthToken

from duckgres_admin.models import AuditRecord
from tests.fixtures.cli import as_person, person_token


@pytest.mark.safeguard("reshard-120")
def test_a_personal_token_acts_as_its_person(cli, tmp_path):
    admin_token = person_token("ops@example.com", "admin")
    viewer_token = person_token("reader@example.com", "viewer")
    person = as_person(cli)

    listed = person("reshard", "list", DUCKGRES_API_TOKEN=viewer_token)
    assert listed.returncode == 0, listed.stderr
    refused = person("reshard", "cancel", "999999", DUCKGRES_API_TOKEN=viewer_token)
    assert refused.returncode == 1
    assert "HTTP 403: admin role required" in refused.stderr

    # From a file named by --token-file (the token never on the command line).
    path = tmp_path / "token"
    path.write_text(admin_token + "\n")
    cancel = person("--token-file", str(path), "reshard", "cancel", "999999")
    assert cancel.returncode == 1  # no such operation: the API's 404, audited all the same
    assert "HTTP 404" in cancel.stderr
    rows = list(AuditRecord.objects.order_by("id").values_list("actor", "role", "source", "status"))
    assert rows == [
        ("reader@example.com", "viewer", "personal-token", 403),
        ("ops@example.com", "admin", "personal-token", 404),
    ]

    AuthToken.objects.filter(user__email="ops@example.com").delete()
    revoked = person("--token-file", str(path), "reshard", "list")
    assert revoked.returncode == 1
    assert "HTTP 401: invalid credentials" in revoked.stderr
    for text in person.outputs:
        assert admin_token not in text
        assert viewer_token not in text


@pytest.mark.safeguard("reshard-120")
def test_one_identity_at_a_time(cli, tmp_path):
    path = tmp_path / "token"
    path.write_text("dgadm_" + "0" * 64)
    both = cli("reshard", "list", DUCKGRES_API_TOKEN="dgadm_" + "0" * 64)
    assert both.returncode == 2
    assert "supply exactly one" in both.stderr
    twice = as_person(cli)("--token-file", str(path), "reshard", "list", DUCKGRES_API_TOKEN="x")
    assert twice.returncode == 2
    assert "--token-file and DUCKGRES_API_TOKEN" in twice.stderr
    spaced = as_person(cli)("reshard", "list", DUCKGRES_API_TOKEN="dgadm_ 0")
    assert spaced.returncode == 2
    assert "whitespace" in spaced.stderr


class Recorder:
    """A plain-HTTP server on a non-loopback address of this machine, recording requests."""

    def __init__(self, host: str) -> None:
        self.requests: list[dict[str, str]] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                recorder.requests.append({"path": self.path, **dict(self.headers.items())})
                body = json.dumps({"operations": [], "next_before": None}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                return None

        self.server = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)


def non_loopback_address() -> str | None:
    """This machine's address on its default route (no packet is sent), if it has one."""
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("192.0.2.123", 9))
        address = str(probe.getsockname()[0])
    except OSError:
        return None
    finally:
        probe.close()
    return None if address.startswith("127.") or address == "0.0.0.0" else address


@pytest.fixture
def recorder() -> Iterator[Recorder]:
    host = non_loopback_address()
    if host is None:
        pytest.skip("this machine has no non-loopback IPv4 address to listen on")
    server = Recorder(host)
    try:
        yield server
    finally:
        server.close()


@pytest.mark.safeguard("reshard-120")
def test_plain_http_to_a_non_loopback_host_needs_the_flag(cli, recorder):
    token = "dgadm_" + "5" * 64
    person = as_person(cli)
    refused = person("reshard", "list", DUCKGRES_API_URL=recorder.url, DUCKGRES_API_TOKEN=token)
    assert refused.returncode == 2
    assert "refusing to send credentials over plain http://" in refused.stderr
    assert "--insecure-http" in refused.stderr
    assert "DUCKGRES_INSECURE_HTTP=1" in refused.stderr
    # The internal secret is refused the same way; nothing reached the server.
    assert cli("reshard", "list", DUCKGRES_API_URL=recorder.url).returncode == 2
    assert recorder.requests == []

    flagged = person(
        "--insecure-http", "reshard", "list", DUCKGRES_API_URL=recorder.url,
        DUCKGRES_API_TOKEN=token,
    )  # fmt: skip
    assert flagged.returncode == 0, flagged.stderr
    by_env = person(
        "reshard", "list", DUCKGRES_API_URL=recorder.url, DUCKGRES_API_TOKEN=token,
        DUCKGRES_INSECURE_HTTP="1",
    )  # fmt: skip
    assert by_env.returncode == 0, by_env.stderr
    assert [r["Authorization"] for r in recorder.requests] == [f"Token {token}"] * 2
    assert all(r["path"].startswith("/api/v1/reshards") for r in recorder.requests)

    bad = person(
        "reshard", "list", DUCKGRES_API_URL=recorder.url, DUCKGRES_API_TOKEN=token,
        DUCKGRES_INSECURE_HTTP="maybe",
    )  # fmt: skip
    assert bad.returncode == 2
    assert "DUCKGRES_INSECURE_HTTP must be" in bad.stderr
    # https:// is never refused by this rule (the server speaks plain HTTP: a TLS error, 3).
    https = person(
        "reshard", "list", DUCKGRES_API_URL=recorder.url.replace("http:", "https:"),
        DUCKGRES_API_TOKEN=token,
    )  # fmt: skip
    assert https.returncode == 3, https.stderr


@pytest.mark.safeguard("reshard-120")
def test_plain_http_to_loopback_is_accepted(cli):
    port = cli.url.rsplit(":", 1)[1]
    for url in (f"http://127.0.0.1:{port}", f"http://localhost:{port}"):
        result = cli("reshard", "list", DUCKGRES_API_URL=url)
        assert result.returncode == 0, (url, result.stderr)
    # The rest of 127.0.0.0/8 and ::1 are loopback too: the CLI tries to connect (nobody
    # listens there: a transport error, exit 3), it does not refuse (exit 2).
    for url in ("http://127.0.0.2:1", "http://[::1]:1"):
        result = cli("reshard", "list", DUCKGRES_API_URL=url)
        assert result.returncode == 3, (url, result.stderr)
        assert "cannot reach the API" in result.stderr
