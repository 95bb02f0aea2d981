"""The runner's password pull (spec §4.2 step 4) against a real local HTTP server."""

from __future__ import annotations

import itertools
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from reshard.runner.password import PasswordPullError, PullRequest, pull_password

SECRET = "0123456789abcdef0123456789abcdef-password!"


@dataclass
class Script:
    """Responses to serve in order (the last one repeats) and what the server saw."""

    responses: list[tuple[int, bytes]]
    seen: list[tuple[float, dict[str, str]]] = field(default_factory=list)


@pytest.fixture
def password_server() -> Iterator[tuple[str, Script]]:
    script = Script(responses=[(200, b"{}")])

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            script.seen.append((time.monotonic(), dict(self.headers.items())))
            index = min(len(script.seen), len(script.responses)) - 1
            status, body = script.responses[index]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}/api/v1/reshards/7/password"
    try:
        yield url, script
    finally:
        server.shutdown()
        server.server_close()


CREDENTIAL = "pod-token-or-one-time-credential"


def request(url: str) -> PullRequest:
    return PullRequest(
        url=url,
        runner_secret="runner-secret-x" * 3,
        epoch=4,
        runner_id="pod-7",
        credential=CREDENTIAL,
    )


@pytest.mark.safeguard("reshard-7")
def test_200_returns_the_password_and_sends_the_identity_headers(password_server):
    url, script = password_server
    script.responses = [(200, json.dumps({"password": SECRET}).encode())]
    assert pull_password(request(url), threading.Event()) == SECRET
    assert len(script.seen) == 1
    headers = script.seen[0][1]
    assert headers["X-Duckgres-Runner-Secret"] == "runner-secret-x" * 3
    assert headers["X-Duckgres-Op-Epoch"] == "4"
    assert headers["X-Duckgres-Runner-Id"] == "pod-7"
    assert headers["Authorization"] == f"Bearer {CREDENTIAL}"


@pytest.mark.safeguard("reshard-7")
def test_404_is_final_after_exactly_one_attempt(password_server):
    url, script = password_server
    script.responses = [(404, b'{"error":"password not available"}')]
    with pytest.raises(PasswordPullError, match="HTTP 404"):
        pull_password(request(url), threading.Event())
    assert len(script.seen) == 1


@pytest.mark.safeguard("reshard-79")
@pytest.mark.parametrize("status", [401, 403])
def test_a_refused_credential_is_final_after_exactly_one_attempt(password_server, status):
    url, script = password_server
    script.responses = [(status, b'{"error":"runner identity not proven for this operation"}')]
    with pytest.raises(PasswordPullError, match=f"refused \\(HTTP {status}") as info:
        pull_password(request(url), threading.Event())
    assert len(script.seen) == 1
    assert CREDENTIAL not in str(info.value)


@pytest.mark.safeguard("reshard-79")
def test_the_credential_channels(tmp_path):
    import os

    from reshard.runner.password import read_pod_token, take_inherited_credential

    token = tmp_path / "token"
    token.write_text("a.projected.token\n")
    assert read_pod_token(str(token)) == "a.projected.token"
    assert read_pod_token(str(tmp_path / "absent")) == ""
    read_end, write_end = os.pipe()
    os.write(write_end, b"one-time-credential")
    os.close(write_end)
    env = {"DUCKGRES_RESHARD_PASSWORD_PULL_FD": str(read_end)}
    assert take_inherited_credential(env) == "one-time-credential"
    with pytest.raises(OSError):
        os.fstat(read_end)  # read once, then closed
    assert take_inherited_credential(env) == ""
    assert take_inherited_credential({}) == ""


@pytest.mark.safeguard("reshard-7")
def test_5xx_is_retried_three_times_two_seconds_apart(password_server):
    url, script = password_server
    script.responses = [(500, b"oops")]
    with pytest.raises(PasswordPullError, match="after 3 attempts; last: attempt 3/3: HTTP 500"):
        pull_password(request(url), threading.Event())
    times = [t for t, _ in script.seen]
    assert len(times) == 3
    gaps = [b - a for a, b in itertools.pairwise(times)]
    assert all(1.9 <= gap < 4 for gap in gaps), gaps


@pytest.mark.safeguard("reshard-7")
def test_a_5xx_then_200_succeeds_on_the_second_attempt(password_server):
    url, script = password_server
    script.responses = [(503, b""), (200, json.dumps({"password": SECRET}).encode())]
    assert pull_password(request(url), threading.Event()) == SECRET
    assert len(script.seen) == 2


@pytest.mark.safeguard("reshard-7")
@pytest.mark.parametrize(
    ("body", "message"),
    [
        (b'{"password": ""}', "carries no password"),
        (b"{}", "carries no password"),
        (b"not json", "not valid JSON"),
    ],
)
def test_empty_or_unparsable_answers_are_final_errors(password_server, body, message):
    url, script = password_server
    script.responses = [(200, body)]
    with pytest.raises(PasswordPullError, match=message):
        pull_password(request(url), threading.Event())
    assert len(script.seen) == 1


def test_transport_errors_retry_and_the_pause_aborts_on_stop():
    stop = threading.Event()
    url = "http://127.0.0.1:9/api/v1/reshards/7/password"  # discard port: refused
    with pytest.raises(PasswordPullError, match="after 3 attempts"):
        pull_password(request(url), stop, pause=0.05)
    stop.set()
    started = time.monotonic()
    with pytest.raises(PasswordPullError, match="interrupted"):
        pull_password(request(url), stop)
    assert time.monotonic() - started < 1.5


def test_an_error_never_quotes_the_body(password_server):
    url, script = password_server
    script.responses = [(200, b'{"password": 12, "leak": "' + SECRET.encode() + b'"}')]
    with pytest.raises(PasswordPullError) as info:
        pull_password(request(url), threading.Event())
    assert SECRET not in str(info.value)


@pytest.mark.safeguard("reshard-7")
def test_a_runner_pulls_after_its_claim_and_never_logs_the_value(
    password_server, cnpg_world, runner_state_dir
):
    from tests.fixtures.runner import op_log, reload, run_runner

    url, script = password_server
    script.responses = [(200, json.dumps({"password": SECRET}).encode())]
    runner = run_runner(cnpg_world.op.id, runner_state_dir, DUCKGRES_RESHARD_PASSWORD_URL=url)
    assert runner.proc.returncode == 0, runner.output()
    assert len(script.seen) == 1
    headers = script.seen[0][1]
    assert headers["X-Duckgres-Op-Epoch"] == "1"  # the claimed epoch
    assert headers["X-Duckgres-Runner-Id"] == f"duckgres-reshard-op-{cnpg_world.op.id}"
    lines = op_log(cnpg_world.op.id)
    assert "pulled the ephemeral external target password" in lines
    assert not [line for line in lines if SECRET in line]
    assert SECRET not in runner.output()
    assert reload(cnpg_world.op).state in ("succeeded", "failed", "cancelled")


@pytest.mark.safeguard("reshard-7")
def test_a_failed_pull_is_a_warning_not_an_infrastructure_error(
    password_server, cnpg_world, runner_state_dir
):
    from tests.fixtures.runner import op_log, reload, run_runner

    url, script = password_server
    script.responses = [(404, b"{}")]
    runner = run_runner(cnpg_world.op.id, runner_state_dir, DUCKGRES_RESHARD_PASSWORD_URL=url)
    assert runner.proc.returncode == 0, runner.output()
    assert len(script.seen) == 1
    assert any(
        line.startswith("could not pull the external target password: password not available")
        for line in op_log(cnpg_world.op.id)
    )
    # cnpg→cnpg never needs the pulled password: the op still completes
    assert reload(cnpg_world.op).state == "succeeded"


class _Recorder:
    """A second HTTP server that records every request it gets (it must get none)."""

    def __init__(self) -> None:
        self.seen: list[str] = []
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def _any(self) -> None:
                recorder.seen.append(f"{self.command} {self.path} {dict(self.headers.items())}")
                body = json.dumps({"password": "stolen"}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            do_GET = do_CONNECT = _any

            def log_message(self, format: str, *args: object) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def recorder() -> Iterator[_Recorder]:
    server = _Recorder()
    try:
        yield server
    finally:
        server.close()


@pytest.mark.safeguard("reshard-77")
def test_a_redirect_is_never_followed(password_server, recorder):
    """A 302 to another host would hand it the runner secret: it is a failure, not a hop."""
    _, script = password_server
    # the fixture server cannot set Location; the redirect comes from a tiny handler instead
    location = f"{recorder.url}/steal"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            script.seen.append((time.monotonic(), dict(self.headers.items())))
            self.send_response(302)
            self.send_header("Location", location)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: object) -> None:
            return

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        redirecting = f"http://127.0.0.1:{server.server_address[1]}/api/v1/reshards/7/password"
        with pytest.raises(PasswordPullError, match="HTTP 302"):
            pull_password(request(redirecting), threading.Event(), pause=0)
    finally:
        server.shutdown()
        server.server_close()
    assert len(script.seen) == 3  # every attempt went to the password route itself
    assert recorder.seen == []


@pytest.mark.safeguard("reshard-77")
def test_proxy_variables_are_never_honoured(password_server, recorder, monkeypatch):
    """HTTP(S)_PROXY in the runner's environment must not route the pull (and its secret)."""
    url, script = password_server
    script.responses = [(200, json.dumps({"password": SECRET}).encode())]
    for name in ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY"):
        monkeypatch.setenv(name, recorder.url)
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    assert pull_password(request(url), threading.Event()) == SECRET
    assert len(script.seen) == 1
    assert recorder.seen == []
