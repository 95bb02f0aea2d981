#!/usr/bin/env python3
"""Fail when a product function is longer than the house limit (``make lint``).

A function counts from its ``def`` line to its last line, docstring and comments included.
Over the limit, a function hides several concepts: split it into named helpers instead of
raising the limit. Migrations are generated and exempt; tests are not product code.

    .venv/bin/python scripts/check_function_length.py [--limit 100] [PATH ...]
"""

from __future__ import annotations

import argparse
import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PRODUCT = ("duckgres_admin", "reshard", "trino_pools", "cli/duckgres_cli")
LIMIT = 100


def _sources(paths: list[Path]) -> Iterator[Path]:
    for path in paths:
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        yield from (f for f in files if "migrations" not in f.parts)


def too_long(paths: list[Path], limit: int = LIMIT) -> list[str]:
    """One ``path:line name (N lines)`` entry per function over ``limit`` lines."""
    found = []
    for source in _sources(paths):
        tree = ast.parse(source.read_text(), filename=str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > limit:
                    found.append(f"{source}:{node.lineno} {node.name} ({length} lines)")
    return found


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=LIMIT)
    parser.add_argument("paths", nargs="*", type=Path)
    args = parser.parse_args(argv)
    found = too_long(args.paths or [ROOT / p for p in PRODUCT], args.limit)
    for entry in found:
        print(f"{entry}: over {args.limit} lines; split it into named helpers", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
