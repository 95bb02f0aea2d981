"""Static files as shipped: a real ``manage.py collectstatic`` into a temporary STATIC_ROOT, then
a REAL gunicorn started the way the image starts it (``-c python:duckgres_admin.gunicorn_conf``)
serves them through WhiteNoise: compressed, hashed, cached forever.

Not pytest-django's ``live_server``: it serves static files by itself and so hid the 404s the
admin's CSS and JS answered under gunicorn. The gunicorn helpers here are also used by
tests/test_proxy_settings.py.
"""

from __future__ import annotations

import contextlib
import gzip
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from email.message import Message
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.processes import ROOT, process_env
from tests.testenv import TEST_ENV

GUNICORN = Path(sys.executable).parent / "gunicorn"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Response:
    status: int
    headers: Message
    body: bytes

    def header(self, name: str) -> str:
        return str(self.headers.get(name, ""))

    def set_cookies(self) -> list[str]:
        return [str(v) for v in self.headers.get_all("Set-Cookie", [])]

    @property
    def text(self) -> str:
        return self.body.decode("utf-8", errors="replace")


@dataclass
class Gunicorn:
    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path

    def request(
        self,
        method: str,
        path: str,
        *,
        headers: Mapping[str, str] | None = None,
        body: bytes | None = None,
    ) -> Response:
        """One request on a fresh connection; no redirect is followed, no cookie is kept."""
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            conn.request(method, path, body=body, headers=dict(headers or {}))
            resp = conn.getresponse()
            return Response(resp.status, resp.msg, resp.read())
        finally:
            conn.close()

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def run_gunicorn(
    env: Mapping[str, str], log_path: Path, *, probe_host: str = "127.0.0.1"
) -> Iterator[Gunicorn]:
    """``gunicorn -c python:duckgres_admin.gunicorn_conf duckgres_admin.wsgi:application`` on a
    free loopback port; yields once ``/livez`` answers 200 (asked with ``Host: probe_host``).
    Stopped with SIGTERM (its own session; SIGKILL to that session only if it hangs)."""
    port = free_port()
    cmd = [
        str(GUNICORN), "-c", "python:duckgres_admin.gunicorn_conf",
        "duckgres_admin.wsgi:application",
    ]  # fmt: skip
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env={**env, "DUCKGRES_HTTP_BIND": f"127.0.0.1:{port}"},
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    server = Gunicorn(proc, port, log_path)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"gunicorn exited with {proc.returncode}:\n{server.log_text()}")
            with contextlib.suppress(OSError):
                if server.request("GET", "/livez", headers={"Host": probe_host}).status == 200:
                    break
            if time.monotonic() > deadline:
                raise RuntimeError(f"gunicorn did not answer /livez:\n{server.log_text()}")
            time.sleep(0.2)
        yield server
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=40)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                proc.wait(timeout=10)


def collectstatic(static_root: Path, *, storage: str = "manifest") -> None:
    """``manage.py collectstatic --noinput`` as the image build runs it: no secret, no config
    store, no broker in the environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUCKGRES_", "DJANGO_"))}
    env.update(
        DJANGO_SETTINGS_MODULE="duckgres_admin.settings",
        DUCKGRES_STATIC_ROOT=str(static_root),
        DUCKGRES_STATIC_STORAGE=storage,
    )
    result = subprocess.run(
        [sys.executable, "manage.py", "collectstatic", "--noinput"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.fixture(scope="module")
def static_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("static") / "collected"
    collectstatic(root)
    return root


@pytest.fixture(scope="module")
def manifest(static_root: Path) -> dict[str, str]:
    paths: dict[str, str] = json.loads((static_root / "staticfiles.json").read_text())["paths"]
    return paths


@pytest.fixture(scope="module")
def server(
    static_root: Path, tmp_path_factory: pytest.TempPathFactory, django_db_setup: None
) -> Iterator[Gunicorn]:
    env = process_env(
        DUCKGRES_STATIC_ROOT=str(static_root),
        DUCKGRES_STATIC_STORAGE="manifest",
        DUCKGRES_DEBUG="false",
    )
    log = tmp_path_factory.mktemp("gunicorn") / "gunicorn.log"
    with run_gunicorn(env, log) as running:
        yield running


def test_collectstatic_writes_hashed_and_compressed_files(static_root, manifest):
    hashed = manifest["admin/css/base.css"]
    assert re.fullmatch(r"admin/css/base\.[0-9a-f]{12}\.css", hashed)
    assert (static_root / hashed).is_file()
    assert (static_root / f"{hashed}.gz").is_file()


def test_the_admin_css_answers_200_as_text_css(server):
    resp = server.request("GET", "/static/admin/css/base.css")
    assert resp.status == 200, server.log_text()
    assert resp.header("Content-Type").startswith("text/css")
    assert b"body" in resp.body
    # An unhashed name may change with the next image: cached briefly, never "immutable".
    assert resp.header("Cache-Control") == "max-age=60, public"


def test_the_hashed_name_is_cached_forever(server, manifest):
    resp = server.request("GET", f"/static/{manifest['admin/css/base.css']}")
    assert resp.status == 200
    assert resp.header("Content-Type").startswith("text/css")
    cache_control = resp.header("Cache-Control")
    assert cache_control == "max-age=315360000, public, immutable"


def test_gzip_is_served_to_a_client_that_accepts_it(server, manifest):
    path = f"/static/{manifest['admin/css/base.css']}"
    plain = server.request("GET", path)
    packed = server.request("GET", path, headers={"Accept-Encoding": "gzip"})
    assert packed.status == 200
    assert packed.header("Content-Encoding") == "gzip"
    assert "Accept-Encoding" in packed.header("Vary")
    assert len(packed.body) < len(plain.body)
    assert gzip.decompress(packed.body) == plain.body
    assert plain.header("Content-Encoding") == ""


def test_the_admin_pages_link_the_hashed_files_and_those_are_served(server, manifest):
    page = server.request("GET", "/admin/login/")
    assert page.status == 200, server.log_text()
    hashed = f"/static/{manifest['admin/css/base.css']}"
    assert hashed in page.text
    linked = re.findall(r'(?:href|src)="(/static/[^"]+)"', page.text)
    assert linked
    for url in linked:
        assert server.request("GET", url).status == 200, url


def test_an_unknown_static_file_is_404(server):
    assert server.request("GET", "/static/admin/css/nope.css").status == 404


# --- storage selection (settings only, no server) ---------------------------------------------


def settings_of(
    overrides: Mapping[str, str | None], *names: str, argv: tuple[str, ...] = ()
) -> dict[str, Any]:
    """The values of ``names`` in settings imported by a fresh interpreter with the test
    environment plus ``overrides`` (None removes a variable); raises with stderr on failure."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUCKGRES_", "DJANGO_"))}
    env.update(TEST_ENV)
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    code = (
        f"import sys, json; sys.argv = ['manage.py', *{list(argv)!r}]; "
        "import django; django.setup(); from django.conf import settings; "
        f"print(json.dumps({{n: getattr(settings, n) for n in {list(names)!r}}}, default=str))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    if result.returncode != 0:
        raise RuntimeError(result.stderr)
    values: dict[str, Any] = json.loads(result.stdout.strip().splitlines()[-1])
    return values


PLAIN = "django.contrib.staticfiles.storage.StaticFilesStorage"
MANIFEST = "whitenoise.storage.CompressedManifestStaticFilesStorage"


def test_without_collectstatic_auto_uses_plain_storage_served_from_the_apps(tmp_path):
    values = settings_of(
        {"DUCKGRES_STATIC_ROOT": str(tmp_path / "empty")},
        "STORAGES",
        "STATIC_ROOT",
        "WHITENOISE_USE_FINDERS",
    )
    assert values["STORAGES"]["staticfiles"]["BACKEND"] == PLAIN
    assert values["STATIC_ROOT"] == str(tmp_path / "empty")
    assert values["WHITENOISE_USE_FINDERS"] is True


def test_once_collectstatic_ran_auto_uses_the_manifest(static_root):
    values = settings_of({"DUCKGRES_STATIC_ROOT": str(static_root)}, "STORAGES")
    assert values["STORAGES"]["staticfiles"]["BACKEND"] == MANIFEST


def test_collectstatic_itself_uses_the_manifest_storage_in_auto(tmp_path):
    values = settings_of(
        {"DUCKGRES_STATIC_ROOT": str(tmp_path / "new")}, "STORAGES", argv=("collectstatic",)
    )
    assert values["STORAGES"]["staticfiles"]["BACKEND"] == MANIFEST


def test_manifest_and_plain_are_forced_whatever_is_on_disk(tmp_path, static_root):
    forced = settings_of(
        {"DUCKGRES_STATIC_ROOT": str(tmp_path), "DUCKGRES_STATIC_STORAGE": "manifest"},
        "STORAGES",
        "WHITENOISE_USE_FINDERS",
    )
    assert forced["STORAGES"]["staticfiles"]["BACKEND"] == MANIFEST
    assert forced["WHITENOISE_USE_FINDERS"] is False
    plain = settings_of(
        {"DUCKGRES_STATIC_ROOT": str(static_root), "DUCKGRES_STATIC_STORAGE": "plain"}, "STORAGES"
    )
    assert plain["STORAGES"]["staticfiles"]["BACKEND"] == PLAIN


def test_whitenoise_comes_right_after_the_security_middleware():
    """Only the request-metrics middleware comes before them: it times everything after it."""
    middleware = settings_of({}, "MIDDLEWARE")["MIDDLEWARE"]
    assert isinstance(middleware, list)
    assert middleware[:3] == [
        "django_prometheus.middleware.PrometheusBeforeMiddleware",
        "django.middleware.security.SecurityMiddleware",
        "whitenoise.middleware.WhiteNoiseMiddleware",
    ]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"DUCKGRES_STATIC_ROOT": "var/static"}, "DUCKGRES_STATIC_ROOT='var/static' must be an"),
        ({"DUCKGRES_STATIC_STORAGE": "hashed"}, "DUCKGRES_STATIC_STORAGE='hashed' is not one of"),
    ],
)
def test_bad_static_settings_refuse_to_start(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        settings_of(overrides, "STATIC_ROOT")


def test_collectstatic_without_secrets_still_refuses_a_bad_value(tmp_path):
    with pytest.raises(RuntimeError, match="DUCKGRES_DEBUG='ture' is not a boolean"):
        settings_of(
            {
                "DJANGO_SECRET_KEY": None,
                "DUCKGRES_CONFIG_STORE": None,
                "DUCKGRES_BROKER_URL": None,
                "DUCKGRES_INTERNAL_SECRET": None,
                "DUCKGRES_DEBUG": "ture",
                "DUCKGRES_STATIC_ROOT": str(tmp_path),
            },
            "STATIC_ROOT",
            argv=("collectstatic",),
        )
