"""The webhook's configuration, parsed strictly at settings import (docs/notifications.md).

``DUCKGRES_WEBHOOK_URL`` and ``DUCKGRES_WEBHOOK_SECRET`` are secret-bearing (a Slack incoming
webhook URL carries its credential in the path): each may be given as ``<NAME>_FILE``, and no
message ever shows their value. Unset ``DUCKGRES_WEBHOOK_URL`` turns notifications off.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from duckgres_admin.platform.config import EnvReader

FORMATS = ("json", "slack")
SECRET_MIN_LENGTH = 32


@dataclass(frozen=True)
class WebhookConfig:
    url: str = field(default="", repr=False)
    secret: str = field(default="", repr=False)
    format: str = "json"
    timeout_seconds: int = 10
    max_attempts: int = 8
    backoff_seconds: int = 10
    lookback_seconds: int = 86400

    @property
    def enabled(self) -> bool:
        return bool(self.url)

    @property
    def destination(self) -> str:
        """``scheme://host[:port]``: what logs and messages may show of the URL."""
        parts = urlsplit(self.url)
        host = parts.hostname or ""
        if ":" in host:
            host = f"[{host}]"
        return f"{parts.scheme}://{host}" + (f":{parts.port}" if parts.port else "")


def _secret(env: EnvReader, name: str) -> str:
    """``name`` or the content of ``<name>_FILE`` (one trailing newline stripped)."""
    direct = env.environ.get(name)
    path = env.environ.get(f"{name}_FILE")
    if direct is not None and path:
        env.errors.append(f"{name} and {name}_FILE are both set: supply exactly one")
        return ""
    if path:
        try:
            with open(path, encoding="utf-8") as handle:
                content = handle.read()
        except OSError as exc:
            env.errors.append(f"{name}_FILE: cannot read {path!r}: {exc.strerror}")
            return ""
        env.from_file.add(name)
        return content[:-1] if content.endswith("\n") else content
    return direct or ""


def _is_loopback(host: str) -> bool:
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the webhook URL (never echoing it), or None."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a bad port
    except ValueError:
        return "DUCKGRES_WEBHOOK_URL is not a valid URL (https://host[:port]/path)"
    if parts.scheme not in ("https", "http") or not parts.hostname:
        return "DUCKGRES_WEBHOOK_URL must be an absolute https:// URL"
    if parts.scheme == "http" and not _is_loopback(parts.hostname):
        return (
            "DUCKGRES_WEBHOOK_URL must use https:// (http:// is accepted only for a loopback "
            "receiver: localhost, 127.0.0.0/8, ::1)"
        )
    if parts.username is not None or parts.password is not None:
        return "DUCKGRES_WEBHOOK_URL must not carry credentials (user:password@)"
    if parts.fragment or "#" in url:
        return "DUCKGRES_WEBHOOK_URL must not have a #fragment"
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        return "DUCKGRES_WEBHOOK_URL must not contain whitespace or control characters"
    return None


def from_env(env: EnvReader, *, shared_secrets: tuple[str, ...] = ()) -> WebhookConfig:
    """Parse the ``DUCKGRES_WEBHOOK_*`` variables, appending every problem to ``env.errors``."""
    url = _secret(env, "DUCKGRES_WEBHOOK_URL").strip()
    problems_before = len(env.errors)
    secret = _secret(env, "DUCKGRES_WEBHOOK_SECRET")
    secret_unreadable = len(env.errors) > problems_before
    fmt = env.choice("DUCKGRES_WEBHOOK_FORMAT", "json", FORMATS)
    timeout = env.integer("DUCKGRES_WEBHOOK_TIMEOUT_SECONDS", 10, minimum=1, maximum=60)
    attempts = env.integer("DUCKGRES_WEBHOOK_MAX_ATTEMPTS", 8, minimum=1, maximum=20)
    backoff = env.integer("DUCKGRES_WEBHOOK_BACKOFF_SECONDS", 10, minimum=1, maximum=3600)
    lookback = env.integer("DUCKGRES_WEBHOOK_LOOKBACK_SECONDS", 86400, minimum=60)
    if url:
        problem = url_problem(url)
        if problem:
            env.errors.append(problem)
            url = ""
        if secret_unreadable:
            pass
        elif not secret:
            env.errors.append(
                "DUCKGRES_WEBHOOK_SECRET is required when DUCKGRES_WEBHOOK_URL is set "
                "(every delivery is signed)"
            )
        elif len(secret) < SECRET_MIN_LENGTH:
            env.errors.append(
                f"DUCKGRES_WEBHOOK_SECRET must be at least {SECRET_MIN_LENGTH} characters"
            )
        elif secret in shared_secrets:
            env.errors.append(
                "DUCKGRES_WEBHOOK_SECRET equals one of the shared secrets: it must be its own "
                "value (the receiver holds it)"
            )
    elif secret:
        env.warnings.append(
            "DUCKGRES_WEBHOOK_SECRET is set but DUCKGRES_WEBHOOK_URL is not: notifications are off"
        )
    return WebhookConfig(
        url=url,
        secret=secret,
        format=fmt,
        timeout_seconds=timeout,
        max_attempts=attempts,
        backoff_seconds=backoff,
        lookback_seconds=lookback,
    )
