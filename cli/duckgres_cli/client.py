"""The CLI's API client: JSON over the strict transport :mod:`duckgres_cli.http` (docs/cli.md).

Identity from the environment or a file, never from an argument's value (argv is visible to
every user of the machine): ``DUCKGRES_INTERNAL_SECRET`` (or ``DUCKGRES_INTERNAL_SECRET_FILE``)
as ``X-Duckgres-Internal-Secret`` (automation), or a personal token, ``DUCKGRES_API_TOKEN`` (or
``DUCKGRES_API_TOKEN_FILE``, or ``--token-file``) as ``Authorization: Token`` (a person, audited
by name). Both at once is a usage error: which one acts must never be a guess. Every message this
module builds is scrubbed of the identity in use by the project's one scrubber
(:mod:`duckgres_cli.scrub`: the value and its URL-encoded forms).

Transport: a credential never travels over plain ``http://`` to a host that is not loopback
(``localhost``, 127.0.0.0/8, ``::1``) unless the caller says so (``--insecure-http`` or
``DUCKGRES_INSECURE_HTTP=1``, e.g. for an in-cluster Service); the refusal happens before any
connection is opened.

Every failure is a :class:`CliError` carrying its exit code:

- 1 the API refused the request (a 4xx with its ``error``),
- 3 transport problems and 5xx answers,
- 5 the API does not offer the route (a 404 that is not the API's own JSON answer).
"""

from __future__ import annotations

import ipaddress
import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any
from urllib.parse import urlencode, urlsplit

from duckgres_cli import http
from duckgres_cli.config import Profile, environ_identity
from duckgres_cli.errors import (
    EXIT_NOT_OFFERED,
    EXIT_REFUSED,
    EXIT_TRANSPORT,
    EXIT_USAGE,
    CliError,
)
from duckgres_cli.scrub import Scrubber

MAX_ANSWER_BYTES = 16 * 1024 * 1024
DEFAULT_TIMEOUT = 30.0


def _from_env(environ: Mapping[str, str], name: str) -> str:
    direct = environ.get(name, "")
    path = environ.get(f"{name}_FILE", "")
    if direct and path:
        raise CliError(f"{name} and {name}_FILE are both set: supply exactly one", EXIT_USAGE)
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                content = handle.read()
        except OSError as exc:
            message = f"{name}_FILE: cannot read {path!r}: {exc.strerror}"
            raise CliError(message, EXIT_USAGE) from None
        return content[:-1] if content.endswith("\n") else content
    return direct


TOKEN_SCHEME = "Token"
INSECURE_HTTP_VAR = "DUCKGRES_INSECURE_HTTP"


def _token(environ: Mapping[str, str], token_file: str | None) -> str:
    """The personal token: ``--token-file`` or the environment (not both)."""
    if token_file is None:
        return _from_env(environ, "DUCKGRES_API_TOKEN")
    if environ.get("DUCKGRES_API_TOKEN") or environ.get("DUCKGRES_API_TOKEN_FILE"):
        raise CliError(
            "--token-file and DUCKGRES_API_TOKEN (or DUCKGRES_API_TOKEN_FILE) are both given: "
            "supply exactly one",
            EXIT_USAGE,
        )
    return _from_env({"DUCKGRES_API_TOKEN_FILE": token_file}, "DUCKGRES_API_TOKEN")


@dataclass(frozen=True)
class Credentials:
    header: str
    value: str = field(repr=False)

    @classmethod
    def from_environ(
        cls, environ: Mapping[str, str], *, token_file: str | None = None
    ) -> Credentials:
        secret = _from_env(environ, "DUCKGRES_INTERNAL_SECRET")
        token = _token(environ, token_file)
        if secret and token:
            raise CliError(
                "both the internal secret (DUCKGRES_INTERNAL_SECRET[_FILE]) and a personal "
                "token (DUCKGRES_API_TOKEN[_FILE] or --token-file) are given: supply exactly "
                "one (a person uses the token, automation the secret)",
                EXIT_USAGE,
            )
        if secret:
            return cls("X-Duckgres-Internal-Secret", secret)
        if token:
            if any(ch.isspace() for ch in token):
                raise CliError(
                    "the personal token contains whitespace: paste it exactly as "
                    "`manage.py create_api_token` or the admin printed it",
                    EXIT_USAGE,
                )
            return cls("Authorization", f"{TOKEN_SCHEME} {token}")
        raise CliError(
            "no identity: set DUCKGRES_API_TOKEN (or DUCKGRES_API_TOKEN_FILE, or pass "
            "--token-file, or name a token_file in your profile) for your personal token, or "
            "DUCKGRES_INTERNAL_SECRET (or DUCKGRES_INTERNAL_SECRET_FILE) for automation",
            EXIT_USAGE,
        )

    def secret(self) -> str:
        """The credential itself (without the ``Token`` scheme), for the scrubber."""
        return self.value.removeprefix(f"{TOKEN_SCHEME} ")


def is_loopback(host: str) -> bool:
    """``localhost`` or a loopback address (127.0.0.0/8, ``::1``)."""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def insecure_http_from(environ: Mapping[str, str]) -> bool:
    raw = environ.get(INSECURE_HTTP_VAR, "").strip().lower()
    if raw in ("", "0", "false", "no"):
        return False
    if raw in ("1", "true", "yes"):
        return True
    raise CliError(f"{INSECURE_HTTP_VAR} must be 1/true/yes or 0/false/no", EXIT_USAGE)


def check_transport(base_url: str, *, insecure_http: bool) -> None:
    """Refuse to send a credential over plain HTTP to a host that is not loopback, unless
    ``insecure_http`` (before any connection)."""
    parts = urlsplit(base_url)
    host = parts.hostname or ""
    if parts.scheme != "http" or is_loopback(host) or insecure_http:
        return
    raise CliError(
        f"refusing to send credentials over plain http:// to {host}, which is not a loopback "
        "host: use an https:// API URL, or pass --insecure-http (or set "
        f"{INSECURE_HTTP_VAR}=1) if the network to it is trusted (e.g. an in-cluster Service)",
        EXIT_USAGE,
    )


@dataclass(frozen=True)
class Answer:
    status: int
    body: Any


def api_url(value: str) -> str:
    parts = urlsplit(value)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise CliError(
            "the API URL (--api-url or DUCKGRES_API_URL) must be http(s)://host[:port]", EXIT_USAGE
        )
    if parts.username is not None or parts.password is not None:
        raise CliError("the API URL must not carry credentials", EXIT_USAGE)
    return value.rstrip("/")


@dataclass
class ApiClient:
    base_url: str
    credentials: Credentials = field(repr=False)
    timeout: float = 30.0
    ca_file: str | None = None

    @cached_property
    def _scrubber(self) -> Scrubber:
        return Scrubber(self.credentials.secret())

    def scrub(self, text: str) -> str:
        return self._scrubber.scrub(text)

    def call(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        query: Mapping[str, str | int] | None = None,
        what: str = "",
    ) -> Answer:
        """One request; returns 2xx answers and raises :class:`CliError` for anything else.

        ``what`` names the feature for the "this API does not offer …" message."""
        url = f"{self.base_url}/api/v1/{path}"
        if query:
            url += "?" + urlencode({k: v for k, v in query.items() if v not in ("", None)})
        headers = {"Accept": "application/json", self.credentials.header: self.credentials.value}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        context = http.tls_context(self.ca_file) if url.startswith("https:") else None
        try:
            response = http.request(
                method,
                url,
                headers=headers,
                body=data,
                timeout=self.timeout,
                max_bytes=MAX_ANSWER_BYTES,
                context=context,
            )
        except http.HttpTransportError as exc:
            raise CliError(
                self.scrub(f"cannot reach the API at {self.base_url}: {exc}"), EXIT_TRANSPORT
            ) from None
        parsed: Any = None
        try:
            parsed = json.loads(response.body) if response.body else None
        except ValueError:
            parsed = None
        status = response.status
        if 200 <= status < 300:
            return Answer(status, parsed)
        error = parsed.get("error") if isinstance(parsed, dict) else None
        if status == 404 and not isinstance(error, str):
            # Not the API's own JSON answer: no such route in this API build.
            raise CliError(
                f"this API does not offer {what or method + ' /api/v1/' + path} yet "
                f"({method} /api/v1/{path} answered 404)",
                EXIT_NOT_OFFERED,
                status=status,
            )
        if isinstance(error, str):
            code = parsed.get("code") if isinstance(parsed, dict) else None
            detail = f"{error} [{code}]" if isinstance(code, str) and code else error
        else:
            detail = response.body[:300].decode(errors="replace").strip() or "(no body)"
        if 300 <= status < 400:
            detail = "a redirect (never followed): check the API URL"
        message = self.scrub(f"{method} /api/v1/{path}: HTTP {status}: {detail}")
        if 400 <= status < 500:
            raise CliError(message, EXIT_REFUSED, status=status)
        raise CliError(message, EXIT_TRANSPORT, status=status)


def client_from_environ(
    *,
    api_url_value: str | None,
    timeout: float | None,
    ca_file: str | None,
    environ: Mapping[str, str],
    token_file: str | None = None,
    insecure_http: bool = False,
    profile: Profile | None = None,
) -> ApiClient:
    """The client of this invocation: each value from its option, else its environment
    variable, else the profile (``duckgres_cli.config``), else the built-in default. A
    profile's ``token_file`` counts only when the environment names no identity."""
    chosen = profile or Profile(name="")
    base = api_url_value or environ.get("DUCKGRES_API_URL", "") or chosen.api_url
    if not base:
        raise CliError(
            "no API URL: pass --api-url, set DUCKGRES_API_URL, or choose a profile with an "
            "api_url (--profile or DUCKGRES_PROFILE, docs/cli.md)",
            EXIT_USAGE,
        )
    base = api_url(base)
    insecure = insecure_http or insecure_http_from(environ) or chosen.insecure_http
    check_transport(base, insecure_http=insecure)
    if token_file is None and chosen.token_file and not environ_identity(environ):
        token_file = chosen.token_file
    return ApiClient(
        base,
        Credentials.from_environ(environ, token_file=token_file),
        timeout=timeout or chosen.timeout or DEFAULT_TIMEOUT,
        ca_file=ca_file or environ.get("DUCKGRES_API_CA_FILE") or chosen.ca_file or None,
    )


def default_environ() -> Mapping[str, str]:
    return os.environ
