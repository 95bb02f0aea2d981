"""Behind a TLS-terminating proxy: strict env-driven settings, ``check --deploy`` clean with the
production values docs/configuration.md documents, and an admin login through a REAL gunicorn
with the headers the proxy sends (trusted origin: 302 and a Secure session cookie; untrusted
origin: 403).
"""

from __future__ import annotations

import html
import os
import re
import subprocess
import sys
from collections.abc import Iterator, Mapping
from http.cookies import SimpleCookie
from urllib.parse import urlencode

import pytest

from duckgres_admin.platform.config import parse_https_origin
from tests.fixtures.gunicorn import Gunicorn, Response, run_gunicorn
from tests.fixtures.processes import ROOT, process_env
from tests.fixtures.settings_probe import settings_of
from tests.testenv import TEST_ENV

DOCS = ROOT / "docs" / "configuration.md"
# check --deploy wants >= 50 characters (security.W009); the test key is shorter on purpose.
DEPLOY_SECRET_KEY = "deploy-check-secret-key-0123456789abcdefghijklmnopqrstuvwxyz-ABCDEFGH"


def documented_production_env() -> dict[str, str]:
    """The ```env block of the "Behind a proxy / TLS" section of docs/configuration.md."""
    text = DOCS.read_text()
    section = text.split("## Behind a proxy / TLS", 1)[1]
    block = re.search(r"```env\n(.*?)```", section, re.DOTALL)
    assert block, "docs/configuration.md: no ```env block under 'Behind a proxy / TLS'"
    values: dict[str, str] = {}
    for line in block[1].splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            values[name.strip()] = value.strip()
    return values


def manage(env: Mapping[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "manage.py", *argv],
        cwd=ROOT,
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def clean_env(**overrides: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("DUCKGRES_", "DJANGO_"))}
    env.update(TEST_ENV)
    env.update(overrides)
    return env


# --- manage.py check --deploy ------------------------------------------------------------------


def test_the_documented_production_env_passes_check_deploy():
    production = documented_production_env()
    assert {
        "DUCKGRES_ALLOWED_HOSTS",
        "DUCKGRES_CSRF_TRUSTED_ORIGINS",
        "DUCKGRES_SECURE_PROXY_SSL_HEADER",
    } <= set(production)
    env = clean_env(**production, DJANGO_SECRET_KEY=DEPLOY_SECRET_KEY)
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "no issues" in result.stdout


def test_check_deploy_is_not_clean_in_debug():
    env = clean_env(
        **documented_production_env(), DJANGO_SECRET_KEY=DEPLOY_SECRET_KEY, DUCKGRES_DEBUG="true"
    )
    result = manage(env, "check", "--deploy", "--fail-level", "WARNING")
    assert result.returncode != 0
    for check in ("security.W018", "security.W012", "security.W016", "security.W004"):
        assert check in result.stderr


# --- what the variables become -----------------------------------------------------------------


def test_production_defaults_without_any_new_variable():
    values = settings_of(
        {},
        "SESSION_COOKIE_SECURE",
        "CSRF_COOKIE_SECURE",
        "SECURE_HSTS_SECONDS",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS",
        "SECURE_PROXY_SSL_HEADER",
        "SECURE_SSL_REDIRECT",
        "SECURE_CONTENT_TYPE_NOSNIFF",
        "X_FRAME_OPTIONS",
        "SECURE_REFERRER_POLICY",
        "CSRF_TRUSTED_ORIGINS",
        "ALLOWED_HOSTS",
    )
    assert values == {
        "SESSION_COOKIE_SECURE": True,
        "CSRF_COOKIE_SECURE": True,
        "SECURE_HSTS_SECONDS": 31536000,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": False,
        "SECURE_PROXY_SSL_HEADER": None,
        "SECURE_SSL_REDIRECT": False,
        "SECURE_CONTENT_TYPE_NOSNIFF": True,
        "X_FRAME_OPTIONS": "DENY",
        "SECURE_REFERRER_POLICY": "same-origin",
        "CSRF_TRUSTED_ORIGINS": [],
        "ALLOWED_HOSTS": ["*"],
    }


def test_debug_turns_secure_cookies_and_hsts_off_unless_set():
    keys = ("SESSION_COOKIE_SECURE", "CSRF_COOKIE_SECURE", "SECURE_HSTS_SECONDS")
    assert settings_of({"DUCKGRES_DEBUG": "true"}, *keys) == dict.fromkeys(keys, 0)
    explicit = settings_of(
        {
            "DUCKGRES_DEBUG": "true",
            "DUCKGRES_SECURE_COOKIES": "true",
            "DUCKGRES_HSTS_SECONDS": "60",
        },
        *keys,
    )
    assert explicit == {"SESSION_COOKIE_SECURE": True, "CSRF_COOKIE_SECURE": True, **{keys[2]: 60}}


def test_the_proxy_variables_become_django_settings():
    values = settings_of(
        {
            "DUCKGRES_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto",
            "DUCKGRES_CSRF_TRUSTED_ORIGINS": " https://Admin.Example.com:443, https://*.ops.test:8443,",
            "DUCKGRES_SECURE_COOKIES": "false",
            "DUCKGRES_HSTS_SECONDS": "0",
            "DUCKGRES_HSTS_INCLUDE_SUBDOMAINS": "true",
        },
        "SECURE_PROXY_SSL_HEADER",
        "CSRF_TRUSTED_ORIGINS",
        "SESSION_COOKIE_SECURE",
        "CSRF_COOKIE_SECURE",
        "SECURE_HSTS_SECONDS",
        "SECURE_HSTS_INCLUDE_SUBDOMAINS",
    )
    assert values == {
        "SECURE_PROXY_SSL_HEADER": ["HTTP_X_FORWARDED_PROTO", "https"],
        "CSRF_TRUSTED_ORIGINS": ["https://admin.example.com", "https://*.ops.test:8443"],
        "SESSION_COOKIE_SECURE": False,
        "CSRF_COOKIE_SECURE": False,
        "SECURE_HSTS_SECONDS": 0,
        "SECURE_HSTS_INCLUDE_SUBDOMAINS": True,
    }


def test_the_pods_own_addresses_join_an_explicit_host_list():
    values = settings_of(
        {
            "DUCKGRES_ALLOWED_HOSTS": "admin.example.com, duckgres-admin-api",
            "POD_IP": "10.1.2.3",
            "DUCKGRES_ADVERTISE_ADDRESS": "fd00::7",
        },
        "ALLOWED_HOSTS",
    )
    assert values["ALLOWED_HOSTS"] == [
        "admin.example.com",
        "duckgres-admin-api",
        "localhost",
        "127.0.0.1",
        "[::1]",
        "10.1.2.3",
        "[fd00::7]",
    ]
    assert settings_of({"POD_IP": "10.1.2.3"}, "ALLOWED_HOSTS")["ALLOWED_HOSTS"] == ["*"]


def test_a_bare_service_name_is_allowed_in_the_pods_own_namespace():
    """The shipped ConfigMap names the Service only: the namespace a kustomize overlay chooses
    reaches the host list through the downward API, never through a ConfigMap value."""
    values = settings_of(
        {"DUCKGRES_ALLOWED_HOSTS": "duckgres-admin-api,admin.example.com", "POD_NAMESPACE": "ops"},
        "ALLOWED_HOSTS",
    )
    assert values["ALLOWED_HOSTS"][:4] == [
        "duckgres-admin-api",
        "admin.example.com",
        "duckgres-admin-api.ops.svc",
        "duckgres-admin-api.ops.svc.cluster.local",
    ]
    assert not any("admin.example.com." in host for host in values["ALLOWED_HOSTS"])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            {"DUCKGRES_CSRF_TRUSTED_ORIGINS": "https://ok.example.com,admin.example.com"},
            "DUCKGRES_CSRF_TRUSTED_ORIGINS: 'admin.example.com' is not an https origin: write "
            "https://host or https://host:port",
        ),
        (
            {"DUCKGRES_CSRF_TRUSTED_ORIGINS": "https://admin.example.com/"},
            "'https://admin.example.com/' is not an https origin",
        ),
        (
            {"DUCKGRES_CSRF_TRUSTED_ORIGINS": "http://admin.example.com"},
            "'http://admin.example.com' is not an https origin",
        ),
        (
            {"DUCKGRES_SECURE_PROXY_SSL_HEADER": "HTTP_X_FORWARDED_PROTO"},
            "DUCKGRES_SECURE_PROXY_SSL_HEADER='HTTP_X_FORWARDED_PROTO' is not an HTTP header "
            "name: write it as the proxy sends it, e.g. X-Forwarded-Proto",
        ),
        (
            {"DUCKGRES_SECURE_PROXY_SSL_HEADER": "X-Forwarded-Proto: https"},
            "is not an HTTP header name",
        ),
        ({"DUCKGRES_ALLOWED_HOSTS": " , "}, "DUCKGRES_ALLOWED_HOSTS names no host"),
        ({"DUCKGRES_SECURE_COOKIES": "yes"}, "DUCKGRES_SECURE_COOKIES='yes' is not a boolean"),
        ({"DUCKGRES_HSTS_SECONDS": "-1"}, "DUCKGRES_HSTS_SECONDS='-1' must be >= 0"),
        ({"DUCKGRES_HSTS_SECONDS": "1y"}, "DUCKGRES_HSTS_SECONDS='1y' is not an integer"),
        (
            {"DUCKGRES_HSTS_INCLUDE_SUBDOMAINS": "on"},
            "DUCKGRES_HSTS_INCLUDE_SUBDOMAINS='on' is not a boolean",
        ),
    ],
)
def test_a_bad_proxy_value_refuses_to_start_naming_the_variable(overrides, message):
    with pytest.raises(RuntimeError, match=re.escape(message)):
        settings_of(overrides, "ALLOWED_HOSTS")


@pytest.mark.parametrize(
    ("raw", "origin"),
    [
        ("https://admin.example.com", "https://admin.example.com"),
        ("HTTPS://Admin.Example.COM", "https://admin.example.com"),
        ("https://admin.example.com:443", "https://admin.example.com"),
        ("https://admin.example.com:8443", "https://admin.example.com:8443"),
        ("https://*.example.com", "https://*.example.com"),
        ("https://10.0.0.1:8443", "https://10.0.0.1:8443"),
        ("https://[fd00::1]:8443", "https://[fd00::1]:8443"),
    ],
)
def test_https_origins_parse(raw, origin):
    assert parse_https_origin(raw) == origin


@pytest.mark.parametrize(
    "raw",
    [
        "",
        "admin.example.com",
        "http://admin.example.com",
        "https://",
        "https://admin.example.com/",
        "https://admin.example.com/admin",
        "https://admin.example.com?x=1",
        "https://admin.example.com#top",
        "https://user@admin.example.com",
        "https://admin.example.com:",
        "https://admin.example.com:0",
        "https://admin.example.com:70000",
        "https://admin_example.com",
        "https://a.*.example.com",
        "*",
    ],
)
def test_non_origins_are_refused(raw):
    assert parse_https_origin(raw) is None


# --- an admin login through a real gunicorn behind the "proxy" ---------------------------------

PUBLIC_HOST = "admin.example.test"
INTERNAL_HOST = "duckgres-admin-api"
TRUSTED_ORIGIN = f"https://{PUBLIC_HOST}"
PASSWORD = "proxy-login-password-0123456789"


@pytest.fixture(scope="module")
def proxied_api(
    tmp_path_factory: pytest.TempPathFactory, django_db_setup: None
) -> Iterator[Gunicorn]:
    env = process_env(
        DUCKGRES_DEBUG="false",
        DUCKGRES_ALLOWED_HOSTS=f"{PUBLIC_HOST},{INTERNAL_HOST}",
        DUCKGRES_CSRF_TRUSTED_ORIGINS=TRUSTED_ORIGIN,
        DUCKGRES_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto",
        # The kubelet's probes address the pod by IP; run_gunicorn probes Host: 127.0.0.1.
        POD_IP="127.0.0.1",
        # gunicorn itself trusts X-Forwarded-Proto from 127.0.0.1 by default; a real proxy is not
        # on the pod's loopback, so neither is this one: the Django setting must do the work.
        FORWARDED_ALLOW_IPS="192.0.2.1",
    )
    env.pop("DUCKGRES_SECURE_COOKIES", None)
    env.pop("DUCKGRES_HSTS_SECONDS", None)
    log = tmp_path_factory.mktemp("gunicorn-proxy") / "gunicorn.log"
    with run_gunicorn(env, log) as server:
        yield server


@pytest.fixture
def superuser(transactional_db: None) -> str:
    from django.contrib.auth import get_user_model

    name = "proxy-admin"
    get_user_model().objects.create_superuser(name, f"{name}@example.test", PASSWORD)
    return name


def cookies_of(resp: Response) -> SimpleCookie:
    jar: SimpleCookie = SimpleCookie()
    for header in resp.set_cookies():
        jar.load(header)
    return jar


def login(
    server: Gunicorn, username: str, *, origin: str, host: str = PUBLIC_HOST
) -> tuple[Response, Response]:
    """GET the login form, POST it back with its CSRF cookie and token, as a browser behind the
    proxy would (``X-Forwarded-Proto: https``). Returns (form page, login answer)."""
    proxy = {"Host": host, "X-Forwarded-Proto": "https"}
    form = server.request("GET", "/admin/login/?next=/admin/", headers=proxy)
    assert form.status == 200, server.log_text()
    csrf_cookie = cookies_of(form)["csrftoken"].value
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', form.text)
    assert token
    body = urlencode(
        {
            "csrfmiddlewaretoken": html.unescape(token[1]),
            "username": username,
            "password": PASSWORD,
            "next": "/admin/",
        }
    ).encode()
    answer = server.request(
        "POST",
        "/admin/login/?next=/admin/",
        headers={
            **proxy,
            "Origin": origin,
            "Cookie": f"csrftoken={csrf_cookie}",
            "Content-Type": "application/x-www-form-urlencoded",
        },
        body=body,
    )
    return form, answer


def test_login_from_the_trusted_origin_through_the_proxy(proxied_api, superuser):
    form, answer = login(proxied_api, superuser, origin=TRUSTED_ORIGIN)
    assert form.header("Strict-Transport-Security") == "max-age=31536000"  # seen as HTTPS
    assert cookies_of(form)["csrftoken"]["secure"] is True
    assert answer.status == 302, answer.text[:2000]
    assert answer.header("Location") == "/admin/"
    session = cookies_of(answer)["sessionid"]
    assert session["secure"] is True
    assert session["httponly"] is True
    index = proxied_api.request(
        "GET",
        "/admin/",
        headers={
            "Host": PUBLIC_HOST,
            "X-Forwarded-Proto": "https",
            "Cookie": f"sessionid={session.value}",
        },
    )
    assert index.status == 200
    assert "Site administration" in index.text
    assert index.header("X-Frame-Options") == "DENY"
    assert index.header("X-Content-Type-Options") == "nosniff"
    assert index.header("Referrer-Policy") == "same-origin"


def test_login_from_an_untrusted_origin_is_403(proxied_api, superuser):
    _, answer = login(proxied_api, superuser, origin="https://evil.example.test")
    assert answer.status == 403
    assert "CSRF verification failed" in answer.text
    assert "sessionid" not in cookies_of(answer)


def test_the_trusted_origin_is_what_admits_a_host_rewritten_by_the_proxy(proxied_api, superuser):
    _, trusted = login(proxied_api, superuser, origin=TRUSTED_ORIGIN, host=INTERNAL_HOST)
    assert trusted.status == 302
    _, other = login(
        proxied_api, superuser, origin="https://other.example.test", host=INTERNAL_HOST
    )
    assert other.status == 403


def test_a_host_not_allowed_is_refused_but_the_pod_ip_is_allowed(proxied_api):
    assert proxied_api.request("GET", "/livez", headers={"Host": "evil.example.test"}).status == 400
    assert proxied_api.request("GET", "/livez", headers={"Host": "127.0.0.1:8080"}).status == 200


def test_plain_http_probes_are_not_redirected_and_get_no_hsts(proxied_api):
    resp = proxied_api.request("GET", "/livez", headers={"Host": "127.0.0.1:8080"})
    assert resp.status == 200
    assert resp.header("Strict-Transport-Security") == ""
    assert resp.header("Location") == ""
