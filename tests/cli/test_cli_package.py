"""The CLI as its own package (docs/cli.md "Install", "Profiles"): installed alone into a venv
that holds only click, it answers ``--version`` and drives the live API, so it needs neither
Django nor Celery; a profile of the config file supplies the target and the token file, the
environment and the options override it, and the file never holds a credential."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.cli import CHECKOUT, Cli, as_person, person_token

CLI_DIR = CHECKOUT / "cli"


def _version() -> str:
    text = (CLI_DIR / "duckgres_cli" / "version.py").read_text()
    match = re.search(r'^__version__ = "(.+)"$', text, re.M)
    assert match
    return match.group(1)


def _locked(name: str) -> str:
    """``name``'s pin and hashes from requirements.lock (the release's own lock)."""
    lines = (CHECKOUT / "requirements.lock").read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"{name}=="))
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith("    --hash"):
            break
        block.append(line)
    return "\n".join(block) + "\n"


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv holding click (hash-checked, from the lock) and ``pip install ./cli``: nothing
    of the control plane, no Django, no Celery."""
    root = tmp_path_factory.mktemp("cli-venv")
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q"]
    requirements = root / "click.txt"
    requirements.write_text(_locked("click"))
    subprocess.run([*pip, "--require-hashes", "-r", str(requirements)], check=True, timeout=300)
    build = root / "src"  # a copy, so the build leaves nothing in the checkout
    subprocess.run(["cp", "-r", str(CLI_DIR), str(build)], check=True)
    subprocess.run([*pip, "--no-deps", str(build)], check=True, timeout=300)
    return venv


def _run(venv: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(venv / "bin" / "duckgres"), *args], env=env, text=True, capture_output=True,
        timeout=120, cwd=venv,
    )  # fmt: skip


@pytest.mark.safeguard("reshard-140")
def test_the_cli_installs_alone_and_drives_the_api(standalone, cli):
    python = str(standalone / "bin" / "python")
    for module in ("django", "celery", "duckgres_admin"):
        probe = subprocess.run([python, "-c", f"import {module}"], capture_output=True, timeout=60)
        assert probe.returncode != 0, f"{module} is importable in the CLI's own venv"
    env = {"PATH": os.environ["PATH"], "HOME": str(standalone)}
    version = _run(standalone, "--version", env=env)
    assert (version.returncode, version.stdout.strip()) == (0, f"duckgres {_version()}")

    listed = _run(standalone, "reshard", "list", env={**cli.env(), **env, "PYTHONPATH": ""})
    assert listed.returncode == 0, listed.stderr
    failed = _run(
        standalone, "reshard", "show", "424242", env={**cli.env(), **env, "PYTHONPATH": ""}
    )
    assert failed.returncode == 1
    assert "HTTP 404" in failed.stderr


def _config(tmp_path: Path, text: str) -> dict[str, str]:
    path = tmp_path / "duckgres.toml"
    path.write_text(text)
    return {"DUCKGRES_CONFIG": str(path)}


def test_a_profile_supplies_the_target_and_the_token_file(cli, tmp_path):
    token = person_token("ops@example.com", "viewer")
    token_file = tmp_path / "prod.token"
    token_file.write_text(token + "\n")
    person = as_person(cli)
    config = _config(
        tmp_path,
        f"""default_profile = "prod"

[profiles.prod]
api_url = "{cli.url}"
token_file = "{token_file}"
timeout = 20

[profiles.elsewhere]
api_url = "http://127.0.0.1:9"
token_file = "{token_file}"
""",
    )
    # No DUCKGRES_API_URL, no identity variable: the default profile supplies both.
    listed = person("reshard", "list", DUCKGRES_API_URL="", **config)
    assert listed.returncode == 0, listed.stderr

    # --profile and DUCKGRES_PROFILE choose another one (which points nowhere).
    for chosen in (
        person("--profile", "elsewhere", "reshard", "list", DUCKGRES_API_URL="", **config),
        person("reshard", "list", DUCKGRES_API_URL="", DUCKGRES_PROFILE="elsewhere", **config),
    ):
        assert chosen.returncode == 3, chosen.stderr
        assert "cannot reach the API at http://127.0.0.1:9" in chosen.stderr

    # The environment wins over the profile: the URL, and an identity over its token_file.
    over = person(
        "--profile", "elsewhere", "reshard", "list", DUCKGRES_API_URL=cli.url,
        DUCKGRES_API_TOKEN="not-a-valid-token-0123", **config,
    )  # fmt: skip
    assert over.returncode == 1, over.stderr
    assert "HTTP 401: invalid credentials" in over.stderr
    for text in person.outputs:
        assert token not in text


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (
            '[profiles.prod]\napi_url = "https://a.example"\ntoken = "s3cr3t-value-123"\n',
            "'token' is a credential, which the config file never holds: put the token in a "
            "file readable only by you and name it with token_file",
        ),
        ('[profiles.prod]\napi_urll = "https://a.example"\n', "unknown key 'api_urll'"),
        ('[profiles.prod]\ntimeout = "fast"\n', "timeout must be a number"),
        ("[profiles.prod\n", "not valid TOML"),
    ],
)
def test_a_bad_config_file_is_a_usage_error_naming_the_fix(cli, tmp_path, text, message):
    config = _config(tmp_path, text)
    result = cli("--profile", "prod", "reshard", "list", **config)
    assert result.returncode == 2
    assert message in result.stderr
    assert str(tmp_path / "duckgres.toml") in result.stderr
    assert "s3cr3t-value-123" not in result.stderr + result.stdout


def test_a_profile_that_is_not_there_lists_those_that_are(cli, tmp_path):
    config = _config(tmp_path, "[profiles.prod]\n[profiles.staging]\n")
    missing = cli("--profile", "qa", "reshard", "list", **config)
    assert missing.returncode == 2
    assert "no profile 'qa' (profiles: prod, staging)" in missing.stderr
    nofile = cli("--profile", "qa", "reshard", "list", DUCKGRES_CONFIG=str(tmp_path / "none"))
    assert nofile.returncode == 2
    assert "there is no config file at" in nofile.stderr
    # No file and no profile asked for: the environment alone works as before.
    plain = cli("reshard", "list", DUCKGRES_CONFIG=str(tmp_path / "none"))
    assert plain.returncode == 0, plain.stderr


def test_version_needs_no_api():
    result = Cli("", "")("--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"duckgres {_version()}")
