"""Profiles: named targets in a config file, so an operator of several fleets types
``duckgres --profile staging reshard list`` instead of exporting four variables (docs/cli.md).

The file is TOML: ``$DUCKGRES_CONFIG``, else ``$XDG_CONFIG_HOME/duckgres/config.toml``, else
``~/.config/duckgres/config.toml``::

    default_profile = "prod"

    [profiles.prod]
    api_url = "https://admin.example.com"
    ca_file = "~/.config/duckgres/prod-ca.pem"
    token_file = "~/.config/duckgres/prod.token"
    timeout = 30

Rules:

- the profile is ``--profile``, else ``DUCKGRES_PROFILE``, else the file's ``default_profile``,
  else none; a named profile that the file does not hold is a usage error listing those it does;
- a command-line option wins over its environment variable, which wins over the profile;
- the file never holds a credential: a key such as ``token`` or ``secret`` is refused with the
  fix (a ``token_file``, or the environment), so a config file copied between machines or
  committed by mistake carries no secret;
- unknown keys and wrong types are usage errors naming the file, the profile and the key;
- no file and no profile asked for is not an error (the environment alone still works).
"""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from duckgres_cli.errors import EXIT_USAGE, CliError

PROFILE_VAR = "DUCKGRES_PROFILE"
CONFIG_VAR = "DUCKGRES_CONFIG"
_CREDENTIAL_KEYS = ("token", "api_token", "secret", "internal_secret", "password")
_TYPES: dict[str, tuple[type, ...]] = {
    "api_url": (str,),
    "ca_file": (str,),
    "token_file": (str,),
    "timeout": (int, float),
    "insecure_http": (bool,),
}


@dataclass(frozen=True)
class Profile:
    name: str
    api_url: str | None = None
    ca_file: str | None = None
    token_file: str | None = None
    timeout: float | None = None
    insecure_http: bool = False


def config_path(environ: Mapping[str, str]) -> Path:
    if environ.get(CONFIG_VAR):
        return Path(environ[CONFIG_VAR]).expanduser()
    base = environ.get("XDG_CONFIG_HOME") or str(Path(environ.get("HOME", "~")) / ".config")
    return Path(base).expanduser() / "duckgres" / "config.toml"


def _read(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as exc:
        raise CliError(f"config file {path}: not valid TOML: {exc}", EXIT_USAGE) from None
    except OSError as exc:
        raise CliError(f"config file {path}: cannot read it: {exc.strerror}", EXIT_USAGE) from None


def _profile(path: Path, name: str, table: Any) -> Profile:
    where = f"config file {path}, profile {name!r}"
    if not isinstance(table, dict):
        raise CliError(f"{where}: must be a table ([profiles.{name}])", EXIT_USAGE)
    values: dict[str, Any] = {}
    for key, value in table.items():
        if key in _CREDENTIAL_KEYS:
            raise CliError(
                f"{where}: {key!r} is a credential, which the config file never holds: put the "
                "token in a file readable only by you and name it with token_file, or set "
                "DUCKGRES_API_TOKEN (or DUCKGRES_INTERNAL_SECRET for automation)",
                EXIT_USAGE,
            )
        if key not in _TYPES:
            known = ", ".join(sorted(_TYPES))
            raise CliError(f"{where}: unknown key {key!r} (known: {known})", EXIT_USAGE)
        if not isinstance(value, _TYPES[key]) or (key == "timeout" and isinstance(value, bool)):
            kind = "a number" if key == "timeout" else _TYPES[key][0].__name__
            raise CliError(f"{where}: {key} must be {kind}", EXIT_USAGE)
        values[key] = value
    for key in ("ca_file", "token_file"):
        if key in values:
            values[key] = str(Path(values[key]).expanduser())
    if "timeout" in values:
        values["timeout"] = float(values["timeout"])
        if not 1 <= values["timeout"] <= 600:
            raise CliError(f"{where}: timeout must be between 1 and 600 seconds", EXIT_USAGE)
    return Profile(name=name, **values)


def load_profile(requested: str | None, environ: Mapping[str, str]) -> Profile | None:
    """The profile this invocation uses (module rules), or ``None``."""
    name = requested or environ.get(PROFILE_VAR) or None
    path = config_path(environ)
    if not path.exists():
        if name:
            raise CliError(
                f"profile {name!r} asked for, but there is no config file at {path} "
                f"(create it, or set {CONFIG_VAR} to its path)",
                EXIT_USAGE,
            )
        return None
    document = _read(path)
    unknown = set(document) - {"default_profile", "profiles"}
    if unknown:
        raise CliError(
            f"config file {path}: unknown top-level key(s) {', '.join(sorted(unknown))} "
            "(known: default_profile, [profiles.<name>])",
            EXIT_USAGE,
        )
    profiles = document.get("profiles", {})
    if not isinstance(profiles, dict):
        raise CliError(f"config file {path}: profiles must be tables", EXIT_USAGE)
    default = document.get("default_profile")
    if default is not None and not isinstance(default, str):
        raise CliError(f"config file {path}: default_profile must be a string", EXIT_USAGE)
    name = name or default
    if not name:
        return None
    if name not in profiles:
        held = ", ".join(sorted(profiles)) or "none"
        raise CliError(f"config file {path}: no profile {name!r} (profiles: {held})", EXIT_USAGE)
    return _profile(path, name, profiles[name])


def environ_identity(environ: Mapping[str, str]) -> bool:
    """Whether the environment names an identity (which then wins over a profile's
    ``token_file``)."""
    names = ("DUCKGRES_API_TOKEN", "DUCKGRES_INTERNAL_SECRET")
    return any(environ.get(n) or environ.get(f"{n}_FILE") for n in names)
