"""The import contracts of `pyproject.toml` hold, and they bite (docs/architecture.md "Layers,
enforced", "`reshard/` by role").

Both domains and ``duckgres_admin`` are layered with every top-level module listed
(``exhaustive = true``): a module that no layer names fails ``lint-imports``, and so does an
import that runs back up a layer.
Each probe runs the real ``lint-imports`` on a copy of the product's packages, changed in one
place, so the checked-in tree is never touched.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("duckgres_admin", "reshard", "trino_pools", "cli/duckgres_cli")
LINT = Path(sys.executable).with_name("lint-imports")


def _contracts() -> list[dict[str, Any]]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    contracts: list[dict[str, Any]] = config["tool"]["importlinter"]["contracts"]
    return contracts


def _copy(tmp_path: Path) -> Path:
    for package in PACKAGES:
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def _lint(root: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), str(root / "cli")])}
    return subprocess.run(
        [str(LINT), "--no-cache", "--no-logo"],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


@pytest.mark.parametrize("domain", ["reshard", "trino_pools", "duckgres_admin"])
def test_each_domain_has_an_exhaustive_layers_contract(domain: str) -> None:
    exhaustive = [
        c
        for c in _contracts()
        if c.get("type") == "layers" and c.get("containers") == [domain] and c.get("exhaustive")
    ]
    assert len(exhaustive) == 1, f"{domain}: one exhaustive layers contract"


def test_the_contracts_hold_on_a_copy_of_the_tree(tmp_path: Path) -> None:
    result = _lint(_copy(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Contracts: {len(_contracts())} kept, 0 broken." in result.stdout


@pytest.mark.parametrize("domain", ["reshard", "trino_pools", "duckgres_admin"])
def test_a_module_no_layer_lists_fails_the_lint(tmp_path: Path, domain: str) -> None:
    root = _copy(tmp_path)
    (root / domain / "stray.py").write_text('"""A module no layer names."""\n')
    result = _lint(root)
    assert result.returncode != 0
    assert "not listed as layers" in result.stdout
    assert f"- {domain}.stray" in result.stdout


@pytest.mark.parametrize(
    ("module", "upward"),
    [
        ("reshard/engines/verify.py", "reshard.control.janitor"),  # an engine importing control
        ("reshard/runner/waits.py", "reshard.start.operations"),  # the runner importing the start
        ("reshard/engines/copy/base.py", "reshard.engines.copy.catalog"),  # inside the copy
        ("trino_pools/config.py", "trino_pools.operator.tick"),  # configuration importing the tick
    ],
)
def test_an_import_back_up_a_layer_fails_the_lint(tmp_path: Path, module: str, upward: str) -> None:
    root = _copy(tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\nimport {upward}  # noqa: E402,F401\n")
    result = _lint(root)
    assert result.returncode != 0
    assert "BROKEN" in result.stdout
    assert upward in result.stdout
