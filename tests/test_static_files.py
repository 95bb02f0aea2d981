"""Static files as shipped: a real ``manage.py collectstatic`` into a temporary STATIC_ROOT, then
a REAL gunicorn started the way the image starts it (``-c python:duckgres_admin.gunicorn_conf``)
serves them through WhiteNoise: compressed, hashed, cached forever (the gunicorn helpers are
tests/fixtures/gunicorn.py).

Not pytest-django's ``live_server``: it serves static files by itself and so hid the 404s the
admin's CSS and JS answered under gunicorn.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.gunicorn import Gunicorn, run_gunicorn
from tests.fixtures.processes import ROOT, process_env
from tests.fixtures.settings_probe import settings_of


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
