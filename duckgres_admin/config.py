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

from django.core.exceptions import ImproperlyConfigured

SECRET_VARIABLES = frozenset(
    {
        "DJANGO_SECRET_KEY",
        "DUCKGRES_CONFIG_STORE",
        "DUCKGRES_INTERNAL_SECRET",
        "DUCKGRES_RUNNER_SECRET",
        "DUCKGRES_DATAPLANE_SECRET",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
    }
)

_TRUE = {"true", "1"}
_FALSE = {"false", "0"}
_DURATION_RE = re.compile(r"^(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?$")


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
