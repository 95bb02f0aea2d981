"""Strict parsing of the process environment (spec reshard §6).

Every variable is read once, at settings import. A value that does not parse refuses to start
the process with a message naming the variable and the value -- except for secret-bearing
variables, whose messages name only the variable. Secret-bearing variables may be supplied as
``<NAME>_FILE`` (the file's content, one trailing newline stripped); supplying both is an error.

Problems are collected and reported together, so an operator fixes a deployment in one pass.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from django.core.exceptions import ImproperlyConfigured

SECRET_VARIABLES = frozenset(
    {
        "DJANGO_SECRET_KEY",
        "DJANGO_SECRET_KEY_PREVIOUS",
        "DUCKGRES_CONFIG_STORE",
        "DUCKGRES_INTERNAL_SECRET",
        "DUCKGRES_RUNNER_SECRET",
        "DUCKGRES_DATAPLANE_SECRET",
        "DUCKGRES_INTERNAL_SECRET_PREVIOUS",
        "DUCKGRES_RUNNER_SECRET_PREVIOUS",
        "DUCKGRES_DATAPLANE_SECRET_PREVIOUS",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    }
)

_TRUE = {"true", "1"}
_FALSE = {"false", "0"}
_DURATION_RE = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")
# A DNS name (optionally a leading "*." wildcard label, as Django's CSRF_TRUSTED_ORIGINS allows)
# or an IPv4 address; IPv6 literals are bracketed in an origin and checked separately.
_ORIGIN_HOST_RE = re.compile(
    r"^(?:\*\.)?(?:[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*$"
)
_HEADER_NAME_RE = re.compile(r"^[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*$")


def parse_duration_seconds(raw: str) -> int | None:
    """Parse ``90s``, ``15m``, ``1h30m`` or a plain integer of seconds; None when invalid."""
    text = raw.strip()
    if not text:
        return None
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    match = _DURATION_RE.fullmatch(text)
    if not match or not any(match.groups()):
        return None
    hours, minutes, seconds = (int(g) if g else 0 for g in match.groups())
    return hours * 3600 + minutes * 60 + seconds


def parse_https_origin(raw: str) -> str | None:
    """Normalise ``https://host[:port]`` (lower-case, ``:443`` dropped); None when it is not
    exactly an https origin (a path -- even a trailing ``/`` --, a query, user info, another
    scheme or a bad port never match the ``Origin`` header a browser sends)."""
    text = raw.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:
        return None
    if parts.scheme.lower() != "https" or parts.path or parts.query or parts.fragment:
        return None
    if "?" in text or "#" in text or parts.username is not None or parts.password is not None:
        return None
    host = (parts.hostname or "").lower()
    if not host:
        return None
    if ":" in host:  # an IPv6 literal: urlsplit accepted the brackets
        host = f"[{host}]"
    elif not _ORIGIN_HOST_RE.fullmatch(host):
        return None
    if parts.netloc.endswith(":") or port == 0:
        return None
    return f"https://{host}" if port in (None, 443) else f"https://{host}:{port}"


@dataclass
class EnvReader:
    """Reads typed values from an environment mapping, collecting every problem it finds."""

    environ: Mapping[str, str]
    errors: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    from_file: set[str] = field(default_factory=set)

    def _describe(self, name: str, value: str) -> str:
        return name if name in SECRET_VARIABLES else f"{name}={value!r}"

    def raw(self, name: str) -> str | None:
        """The variable's value, or the content of ``<NAME>_FILE`` for secret-bearing names."""
        direct = self.environ.get(name)
        file_path = self.environ.get(f"{name}_FILE") if name in SECRET_VARIABLES else None
        if direct is not None and file_path:
            self.errors.append(f"{name} and {name}_FILE are both set: supply exactly one")
            return None
        if file_path:
            try:
                with open(file_path, encoding="utf-8") as handle:
                    content = handle.read()
            except OSError as exc:
                self.errors.append(f"{name}_FILE: cannot read {file_path!r}: {exc.strerror}")
                return None
            self.from_file.add(name)
            return content[:-1] if content.endswith("\n") else content
        return direct

    def string(self, name: str, default: str = "", *, required: bool = False) -> str:
        value = self.raw(name)
        if value is None or value == "":
            if required:
                self.errors.append(f"{name} is required but not set")
            return default
        return value

    def boolean(self, name: str, default: bool) -> bool:
        value = self.raw(name)
        if value is None or value.strip() == "":
            return default
        lowered = value.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        self.errors.append(
            f"{self._describe(name, value)} is not a boolean: use true/false (or 1/0)"
        )
        return default

    def integer(
        self,
        name: str,
        default: int,
        *,
        minimum: int | None = None,
        maximum: int | None = None,
    ) -> int:
        value = self.raw(name)
        if value is None or value.strip() == "":
            return default
        try:
            number = int(value.strip())
        except ValueError:
            self.errors.append(f"{self._describe(name, value)} is not an integer")
            return default
        if minimum is not None and number < minimum:
            self.errors.append(f"{self._describe(name, value)} must be >= {minimum}")
            return default
        if maximum is not None and number > maximum:
            self.errors.append(f"{self._describe(name, value)} must be <= {maximum}")
            return default
        return number

    def choice(self, name: str, default: str, choices: tuple[str, ...]) -> str:
        value = self.raw(name)
        if value is None or value.strip() == "":
            return default
        if value not in choices:
            self.errors.append(f"{self._describe(name, value)} is not one of: {', '.join(choices)}")
            return default
        return value

    def csv(self, name: str, default: str = "") -> list[str]:
        """A comma-separated list; items stripped, empty items dropped."""
        return [item.strip() for item in self.string(name, default).split(",") if item.strip()]

    def https_origins(self, name: str) -> list[str]:
        """A comma-separated list of ``https://host[:port]`` origins, each normalised."""
        origins: list[str] = []
        for item in self.csv(name):
            origin = parse_https_origin(item)
            if origin is None:
                self.errors.append(
                    f"{name}: {item!r} is not an https origin: write https://host or "
                    "https://host:port (scheme, host and optional port; no path, not even a "
                    "trailing /), comma-separated"
                )
            else:
                origins.append(origin)
        return origins

    def header_name(self, name: str) -> str:
        """An HTTP request header name (``X-Forwarded-Proto``); empty when unset."""
        value = self.string(name).strip()
        if value and not _HEADER_NAME_RE.fullmatch(value):
            self.errors.append(
                f"{self._describe(name, value)} is not an HTTP header name: write it as the "
                "proxy sends it, e.g. X-Forwarded-Proto (letters, digits and single hyphens; "
                "no underscores, no value)"
            )
            return ""
        return value

    def absolute_path(self, name: str, default: str) -> str:
        value = self.string(name, default)
        if not os.path.isabs(value):
            self.errors.append(f"{self._describe(name, value)} must be an absolute path")
            return default
        return value

    def lenient_duration(self, name: str, default: int) -> int:
        """Durations the spec says are ignored with a warning when invalid (never fatal)."""
        value = self.raw(name)
        if value is None or value.strip() == "":
            return default
        seconds = parse_duration_seconds(value)
        if seconds is None:
            self.warnings.append(
                f"{name}={value!r} is not a duration (90s, 15m, 1h30m or seconds); using {default}s"
            )
            return default
        return seconds

    def raise_if_errors(self) -> None:
        if self.errors:
            listing = "\n  - ".join(self.errors)
            raise ImproperlyConfigured(f"invalid configuration:\n  - {listing}")


def environ() -> Mapping[str, str]:
    return os.environ
