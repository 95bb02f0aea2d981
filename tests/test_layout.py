"""The test layout (docs/testing.md "Where a helper lives"): no test module, helper or benchmark
imports from a test module or a ``conftest.py``; what two places share lives in
``tests/fixtures/``."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
_PRIVATE = re.compile(r"^tests(\.\w+)*\.(conftest|test_\w+)$")


def _imports_of_tests(path: Path) -> list[str]:
    """``file:line module`` for each import of a test module or a conftest in ``path``."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        modules: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        else:
            continue
        found += [f"{path.name}:{node.lineno} {m}" for m in modules if _PRIVATE.match(m)]
    return found


def test_no_module_imports_a_test_module_or_a_conftest() -> None:
    files = [*ROOT.joinpath("tests").rglob("*.py"), *ROOT.joinpath("bench").rglob("*.py")]
    assert len(files) > 250, len(files)
    found = [hit for path in sorted(files) for hit in _imports_of_tests(path)]
    assert found == [], f"move what is shared to tests/fixtures/: {found}"


def test_the_scan_sees_such_an_import(tmp_path: Path) -> None:
    probe = tmp_path / "probe.py"
    probe.write_text(
        "from tests.backup.conftest import x\nimport tests.test_settings\n"
        "from tests.fixtures.hooks import RecordingHooks\n"
    )
    assert _imports_of_tests(probe) == [
        "probe.py:1 tests.backup.conftest",
        "probe.py:2 tests.test_settings",
    ]
