"""The house limit on function length holds for the product, and the check bites."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location(
    "check_function_length", ROOT / "scripts" / "check_function_length.py"
)
assert _spec
assert _spec.loader
checker = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(checker)


def _function(lines: int) -> str:
    body = "".join(f"    x{i} = {i}\n" for i in range(lines - 2))
    return f"def f():\n{body}    return 0\n"


def test_a_function_over_the_limit_is_reported(tmp_path: Path) -> None:
    (tmp_path / "ok.py").write_text(_function(checker.LIMIT))
    (tmp_path / "long.py").write_text(_function(checker.LIMIT + 1))
    (tmp_path / "migrations").mkdir()
    (tmp_path / "migrations" / "0001_x.py").write_text(_function(checker.LIMIT + 50))
    found = checker.too_long([tmp_path])
    assert found == [f"{tmp_path / 'long.py'}:1 f ({checker.LIMIT + 1} lines)"]
    assert checker.main([str(tmp_path)]) == 1


def test_no_product_function_is_over_the_limit() -> None:
    assert checker.too_long([ROOT / p for p in checker.PRODUCT]) == []
