"""Secret references (spec reshard §2.1): ``k8s:<namespace>/<secret>#<key>`` or ``env:<VAR>``.

Only references are ever persisted. Resolution errors name the reference and the cause,
never a value. A value that parses as a JSON object is refused: secrets hold raw passwords.

A reference is a capability: whoever may store one can have the control plane read the secret
behind it and present it to a server. Two rules bound it:

- **Never the control plane's own secrets** (:func:`denied_reason`), in every process, whatever
  any setting says: the variables the control plane itself is configured with (the Django key,
  the config-store DSN, the three shared secrets, the broker URL, the AWS and Kubernetes
  credentials), every ``*_FILE`` form, and the Secrets ``duckgres-admin`` and
  ``duckgres-admin-trino`` in any namespace. :func:`resolve` refuses them.
- **Only inside an allowlist per purpose** (:func:`check_allowed`): ``provisioner`` (a metadata
  store's ``provisioner_password_ref``) and ``tenant`` (a binding's or a reshard target's
  password reference), configured by ``DUCKGRES_SECRET_REF_ALLOW_PROVISIONER`` and
  ``DUCKGRES_SECRET_REF_ALLOW_TENANT`` (entries parsed by :func:`parse_allowlist`; unset means
  nothing is allowed). The API enforces it wherever a reference is written or about to be
  resolved on a caller's behalf; runners do not (they only resolve references the API vetted).
- **Runner pods never call the Kubernetes API** (``MOUNTED_MODE_VAR``): their ``k8s:``
  references arrive as ``secretKeyRef`` variables the pod launcher mounted, so a runner's
  identity needs no RBAC at all and a compromised runner can read no other Secret.
- **Only to the endpoints it is bound to** (:func:`check_endpoint`; safeguard reshard-124):
  ``DUCKGRES_SECRET_REF_ENDPOINTS`` binds references (allowlist-entry forms) to the
  ``host:port`` patterns of the servers their secret may be presented to (entries parsed by
  :func:`parse_endpoint_bindings`). :func:`resolve` remembers, for the life of the process,
  which references produced each value (an HMAC of the value under a per-process random key,
  never the value); the connection seams (``lib.pgadmin.connect``, the ``pg_dump``/``pg_restore``
  conninfo) call :func:`check_endpoint` with the password and the endpoint before any packet
  is sent, and a value that came from references none of which is bound to that endpoint is
  refused. Unset (no entry): nothing is bound — the behaviour before the setting existed,
  warned at startup; set: a reference no entry names may be sent nowhere.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Literal

from django.conf import settings

from duckgres_admin.lib import endpoints

_NS = r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?"
_K8S_RE = re.compile(
    rf"^k8s:(?P<ns>{_NS})/"
    r"(?P<name>[a-z0-9]([-a-z0-9.]{0,251}[a-z0-9])?)#(?P<key>[-._a-zA-Z0-9]{1,253})$"
)
_ENV_RE = re.compile(r"^env:(?P<var>[A-Za-z_][A-Za-z0-9_]*)$")

Purpose = Literal["provisioner", "tenant"]
ALLOW_SETTINGS: dict[str, str] = {
    "provisioner": "DUCKGRES_SECRET_REF_ALLOW_PROVISIONER",
    "tenant": "DUCKGRES_SECRET_REF_ALLOW_TENANT",
}

# The control plane's own configuration: never resolvable through a reference.
DENIED_VARIABLES = frozenset(
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
        "DUCKGRES_BROKER_URL",
        "DUCKGRES_KUBE_TOKEN",
        "DUCKGRES_WEBHOOK_SECRET",
        "DUCKGRES_WEBHOOK_URL",
        "AWS_ACCESS_KEY_ID",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
    }
)
DENIED_SECRET_NAMES = frozenset({"duckgres-admin", "duckgres-admin-trino"})
# Each runner's own config-store login (reshard.launchers.podspec.login_secret_name): never a
# reference, or a runner could have another operation's login mounted.
DENIED_SECRET_NAME_RE = re.compile(r"^duckgres-reshard-op-[0-9]+-login$")

# Runner pods have no Kubernetes API access: the pod launcher mounts each Secret key their
# operation references as a `secretKeyRef` variable (`mounted_variable`) and sets this flag, and
# `resolve` then reads `k8s:` references from those variables only.
MOUNTED_MODE_VAR = "DUCKGRES_SECRET_REFS_MOUNTED"
MOUNTED_PREFIX = "DUCKGRES_REF_"


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


def _denied_variable(variable: str) -> bool:
    return variable in DENIED_VARIABLES or variable.endswith("_FILE")


def denied_reason(parsed: SecretRef) -> str | None:
    """Why ``parsed`` names one of the control plane's own secrets (None: it does not)."""
    if parsed.scheme == "env" and _denied_variable(parsed.variable):
        return (
            f"secret {parsed} names the control plane's own configuration ({parsed.variable}), "
            "which is never readable through a reference; store the password in a variable "
            "or Secret of its own"
        )
    if parsed.scheme == "k8s" and (
        parsed.name in DENIED_SECRET_NAMES or DENIED_SECRET_NAME_RE.match(parsed.name)
    ):
        return (
            f"secret {parsed} is the control plane's own Secret {parsed.name}, which is never "
            "readable through a reference; store the password in a Secret of its own"
        )
    return None


# --- allowlists -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AllowEntry:
    """One allowlist entry: ``k8s:[<namespace>/]<name>`` / ``k8s:[<namespace>/]<prefix>*`` or
    ``env:<NAME>`` / ``env:<PREFIX>*`` (no namespace: the control plane's own)."""

    scheme: str
    namespace: str  # k8s only
    name: str  # the secret name / variable, or the prefix when ``prefix``
    prefix: bool

    def matches(self, ref: SecretRef) -> bool:
        if ref.scheme != self.scheme:
            return False
        if self.scheme == "k8s":
            if ref.namespace != self.namespace:
                return False
            subject = ref.name
        else:
            subject = ref.variable
        return subject.startswith(self.name) if self.prefix else subject == self.name

    def __str__(self) -> str:
        star = "*" if self.prefix else ""
        if self.scheme == "k8s":
            return f"k8s:{self.namespace}/{self.name}{star}"
        return f"env:{self.name}{star}"


# Set by the pod launcher in runner and sandbox pods: the control plane's namespace, which is
# not theirs (docs/kubernetes.md "The runner namespace").
CONTROL_NAMESPACE_VAR = "DUCKGRES_CONTROL_PLANE_NAMESPACE"
_ALLOW_K8S_RE = re.compile(rf"^k8s:(?:(?P<ns>{_NS})/)?(?P<name>[a-z0-9.-]*)(?P<star>\*?)$")


def _k8s_entry(variable: str, item: str, m: re.Match[str]) -> AllowEntry | str:
    """An entry without ``<namespace>/`` names the control plane's own namespace (the pod's
    ``POD_NAMESPACE``; in a runner pod, which lives in the runner namespace, the
    ``CONTROL_NAMESPACE_VAR`` its launcher sets), so a shipped ConfigMap never spells a
    namespace that a kustomize overlay may change; outside a pod such an entry is an error."""
    namespace = m["ns"]
    if namespace is None:
        namespace = os.environ.get(CONTROL_NAMESPACE_VAR) or os.environ.get("POD_NAMESPACE", "")
        if not namespace:
            return (
                f"{variable}: {item!r} names no namespace, and this process has no POD_NAMESPACE "
                "to stand for it"
            )
    entry = AllowEntry("k8s", namespace, m["name"], bool(m["star"]))
    if not entry.prefix and not entry.name:
        return f"{variable}: {item!r} names no secret"
    return entry


_ALLOW_ENV_RE = re.compile(r"^env:(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?P<star>\*?)$")


def parse_allowlist(variable: str, raw: str) -> tuple[tuple[AllowEntry, ...], list[str]]:
    """Parse a comma-separated allowlist; returns the entries and one error per bad entry.

    Strict: an empty item, anything but the four entry forms, a ``*`` anywhere but at the end,
    an ``env:*`` with no prefix (every variable of the API process) and an entry that can
    only name a denied secret are errors. ``k8s:<ns>/*`` (a whole namespace) is allowed."""
    entries: list[AllowEntry] = []
    errors: list[str] = []
    if not raw.strip():
        return (), errors
    for item in (part.strip() for part in raw.split(",")):
        if not item:
            errors.append(f"{variable}: an entry is empty (remove the extra comma)")
            continue
        forms = (
            "write k8s:<namespace>/<secret>, k8s:<namespace>/<prefix>*, env:<VARIABLE> or "
            "env:<PREFIX>*, comma-separated"
        )
        if m := _ALLOW_K8S_RE.match(item):
            parsed = _k8s_entry(variable, item, m)
            if isinstance(parsed, str):
                errors.append(f"{parsed}; {forms}")
                continue
            entry = parsed
            if not entry.prefix and entry.name in DENIED_SECRET_NAMES:
                errors.append(
                    f"{variable}: {item!r} is the control plane's own Secret, which is never "
                    "allowed; remove the entry"
                )
                continue
        elif m := _ALLOW_ENV_RE.match(item):
            entry = AllowEntry("env", "", m["name"], bool(m["star"]))
            if not entry.prefix and _denied_variable(entry.name):
                errors.append(
                    f"{variable}: {item!r} is the control plane's own configuration, which is "
                    "never allowed; remove the entry"
                )
                continue
        elif item == "env:*":
            errors.append(
                f"{variable}: 'env:*' would allow every variable of the API process; list the "
                "variables (env:<NAME>) or a prefix of their own (env:<PREFIX>*)"
            )
            continue
        else:
            errors.append(f"{variable}: {item!r} is not an allowlist entry; {forms}")
            continue
        entries.append(entry)
    return tuple(entries), errors


def allowlist(purpose: Purpose) -> tuple[AllowEntry, ...]:
    value = getattr(settings, ALLOW_SETTINGS[purpose], ())
    return tuple(value)


def check_allowed(ref: str, purpose: Purpose, *, launcher: str | None = None) -> SecretRef:
    """Parse ``ref`` and require it to be inside the ``purpose`` allowlist and not one of the
    control plane's own secrets; :class:`SecretRefError` names the reference and the fix."""
    parsed = parse(ref, launcher=launcher)
    denied = denied_reason(parsed)
    if denied:
        raise SecretRefError(denied)
    entries = allowlist(purpose)
    if not any(entry.matches(parsed) for entry in entries):
        variable = ALLOW_SETTINGS[purpose]
        example = (
            f"k8s:{parsed.namespace}/<prefix>*"
            if parsed.scheme == "k8s"
            else f"env:{parsed.variable}"
        )
        configured = ", ".join(str(e) for e in entries) or "nothing"
        raise SecretRefError(
            f"{parsed} is not allowed for {purpose} passwords: {variable} allows {configured}; "
            f"use a reference inside it, or have an operator add an entry such as {example}"
        )
    return parsed


# --- endpoint bindings ------------------------------------------------------------------------

ENDPOINTS_SETTING = "DUCKGRES_SECRET_REF_ENDPOINTS"


@dataclass(frozen=True)
class EndpointBinding:
    """``<reference entry>=<host:port>[,<host:port>…]``: where the secrets the entry names may
    be sent."""

    ref: AllowEntry
    endpoints: tuple[endpoints.EndpointPattern, ...]

    def __str__(self) -> str:
        return f"{self.ref}={','.join(str(e) for e in self.endpoints)}"


def _parse_ref_entry(variable: str, text: str) -> AllowEntry | str:
    if m := _ALLOW_K8S_RE.match(text):
        return _k8s_entry(variable, text, m)
    if m := _ALLOW_ENV_RE.match(text):
        return AllowEntry("env", "", m["name"], bool(m["star"]))
    if text == "env:*":
        return (
            f"{variable}: 'env:*' would bind every variable; name the variable (env:<NAME>) or "
            "a prefix of its own (env:<PREFIX>*)"
        )
    return (
        f"{variable}: {text!r} is not a reference entry; write k8s:<namespace>/<secret>, "
        "k8s:<namespace>/<prefix>*, env:<VARIABLE> or env:<PREFIX>*"
    )


def parse_endpoint_bindings(variable: str, raw: str) -> tuple[
    tuple[EndpointBinding, ...], list[str]
]:  # fmt: skip
    """``;``-separated ``<reference entry>=<endpoint>[,<endpoint>…]`` items (reference entries
    as in the allowlists, endpoints as in ``lib.endpoints``); strict, one error per bad item."""
    bindings: list[EndpointBinding] = []
    errors: list[str] = []
    if not raw.strip():
        return (), errors
    for item in (part.strip() for part in raw.split(";")):
        if not item:
            errors.append(f"{variable}: an entry is empty (remove the extra ';')")
            continue
        ref_text, sep, endpoint_text = item.partition("=")
        if not sep or not endpoint_text.strip():
            errors.append(
                f"{variable}: {item!r} binds no endpoint; write <reference>=<host>:<port>"
                "[,<host>:<port>…], entries separated by ';'"
            )
            continue
        ref = _parse_ref_entry(variable, ref_text.strip())
        if isinstance(ref, str):
            errors.append(ref)
            continue
        patterns, problems = endpoints.parse_patterns(f"{variable}: {ref}", endpoint_text)
        errors.extend(problems)
        if patterns and not problems:
            bindings.append(EndpointBinding(ref, patterns))
    return tuple(bindings), errors


def endpoint_bindings() -> tuple[EndpointBinding, ...]:
    return tuple(getattr(settings, ENDPOINTS_SETTING, ()))


def endpoint_refusal(ref: SecretRef, host: str, port: int) -> str | None:
    """Why the secret behind ``ref`` may not be sent to ``host:port`` (None: it may)."""
    bindings = endpoint_bindings()
    if not bindings:
        return None
    named = [b for b in bindings if b.ref.matches(ref)]
    if any(p.matches(host, port) for b in named for p in b.endpoints):
        return None
    where = endpoints.hostport(host, port)
    bound = ", ".join(str(p) for b in named for p in b.endpoints)
    return (
        f"secret {ref} may not be sent to {where}: {ENDPOINTS_SETTING} binds it to "
        f"{bound or 'no endpoint (no entry names it)'}; use the password of that server, or "
        f"have an operator add {where} to the reference's entry"
    )


_ORIGIN_KEY = os.urandom(32)
_ORIGINS_MAX = 4096
_origins: OrderedDict[bytes, tuple[SecretRef, ...]] = OrderedDict()
_origins_lock = threading.Lock()


def _digest(value: str) -> bytes:
    return hmac.new(_ORIGIN_KEY, value.encode("utf-8", "surrogatepass"), hashlib.sha256).digest()


def _remember(value: str, parsed: SecretRef) -> None:
    key = _digest(value)
    with _origins_lock:
        known = _origins.pop(key, ())
        _origins[key] = known if parsed in known else (*known, parsed)
        while len(_origins) > _ORIGINS_MAX:
            _origins.popitem(last=False)


def origins(value: str) -> tuple[SecretRef, ...]:
    """The references that resolved to ``value`` in this process (most recent last)."""
    with _origins_lock:
        return _origins.get(_digest(value), ())


def check_endpoint(value: str | None, host: str, port: int) -> None:
    """Refuse (:class:`SecretRefError`) sending ``value`` to ``host:port`` when it came from
    references and none of them is bound there. A value no reference produced in this process
    (a password the caller supplied itself) is not a reference's to bind."""
    if not value:
        return
    refs = origins(value)
    if not refs or not endpoint_bindings():
        return
    refusals = [endpoint_refusal(ref, host, port) for ref in refs]
    if all(refusals):
        raise SecretRefError(str(refusals[-1]))


# --- resolution -------------------------------------------------------------------------------


def resolve(ref: str, *, launcher: str | None = None) -> str:
    """The raw secret value behind ``ref``; errors name the reference and cause only.

    The control plane's own secrets are refused here, in every process."""
    parsed = parse(ref, launcher=launcher)
    denied = denied_reason(parsed)
    if denied:
        raise SecretRefError(denied)
    if parsed.scheme == "env":
        value = os.environ.get(parsed.variable)
        if value is None:
            raise SecretRefError(f"secret {parsed}: variable {parsed.variable} is not set")
    elif os.environ.get(MOUNTED_MODE_VAR) == "1":
        mounted = os.environ.get(mounted_variable(parsed))
        if mounted is None:
            raise SecretRefError(
                f"secret {parsed} is not mounted into this runner pod (or the Secret or its key "
                "did not exist when it was launched): a runner reads only the Secrets its "
                "launcher handed over, which are those in the control plane's own namespace; "
                "keep the Secret there"
            )
        value = mounted
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
    _remember(value, parsed)
    return value


def mounted_variable(parsed: SecretRef) -> str:
    """The environment variable a runner pod receives ``parsed``'s value in (a ``secretKeyRef``
    the pod launcher adds; the name is a digest, so it says nothing about the Secret)."""
    digest = hashlib.sha256(str(parsed).encode()).hexdigest()[:20].upper()
    return f"{MOUNTED_PREFIX}{digest}"


def env_variable(ref: str) -> str | None:
    """The variable an ``env:`` reference names (the local launcher passes it through); never
    one of the control plane's own (those are not resolvable)."""
    m = _ENV_RE.match(ref or "")
    if not m or _denied_variable(m["var"]):
        return None
    return str(m["var"])
