"""Secret references (spec reshard §2.1): ``k8s:<namespace>/<secret>#<key>`` or ``env:<VAR>``.

Only references are ever persisted. Resolution errors name the reference and the cause,
never a value. A value that parses as a JSON object is refused: secrets hold raw passwords.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass

from django.conf import settings

_K8S_RE = re.compile(
    r"^k8s:(?P<ns>[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)/"
    r"(?P<name>[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)#(?P<key>[-._a-zA-Z0-9]{1,253})$"
)
_ENV_RE = re.compile(r"^env:(?P<var>[A-Za-z_][A-Za-z0-9_]*)$")


class SecretRefError(ValueError):
    """A reference that is malformed, not allowed here, or cannot be resolved."""


@dataclass(frozen=True)
class SecretRef:
    scheme: str  # "k8s" | "env"
    namespace: str = ""
    name: str = ""
    key: str = ""
    variable: str = ""

    def __str__(self) -> str:
        if self.scheme == "env":
            return f"env:{self.variable}"
        return f"k8s:{self.namespace}/{self.name}#{self.key}"


def parse(ref: str, *, launcher: str | None = None) -> SecretRef:
    """Parse a reference; ``env:`` is allowed only with the local launcher."""
    launcher = launcher or settings.DUCKGRES_RESHARD_LAUNCHER
    if m := _K8S_RE.match(ref):
        return SecretRef("k8s", namespace=m["ns"], name=m["name"], key=m["key"])
    if m := _ENV_RE.match(ref):
        if launcher != "local":
            raise SecretRefError(
                "env: secret references are allowed only with DUCKGRES_RESHARD_LAUNCHER=local; "
                "use k8s:<namespace>/<secret>#<key>"
            )
        return SecretRef("env", variable=m["var"])
    raise SecretRefError(
        "must be a secret reference k8s:<namespace>/<secret>#<key> or env:<VARIABLE>"
    )


def resolve(ref: str, *, launcher: str | None = None) -> str:
    """The raw secret value behind ``ref``; errors name the reference and cause only."""
    parsed = parse(ref, launcher=launcher)
    if parsed.scheme == "env":
        value = os.environ.get(parsed.variable)
        if value is None:
            raise SecretRefError(f"secret {parsed}: variable {parsed.variable} is not set")
    else:
        from duckgres_admin.lib import k8s

        value = k8s.read_secret_key(parsed.namespace, parsed.name, parsed.key)
    if value == "":
        raise SecretRefError(f"secret {parsed}: the value is empty")
    try:
        decoded = json.loads(value)
    except ValueError:
        decoded = None
    if isinstance(decoded, dict):
        raise SecretRefError(
            f"secret {parsed}: the secret value must be the raw password, not JSON"
        )
    return value


def env_variable(ref: str) -> str | None:
    """The variable an ``env:`` reference names (the local launcher passes it through)."""
    m = _ENV_RE.match(ref or "")
    return m["var"] if m else None
