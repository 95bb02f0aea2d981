"""Every numbered safeguard of a spec's section 8 is proven by a tagged test (design §4).

The reshard spec is complete: each of its numbers must carry at least one
``@pytest.mark.safeguard("reshard-N")`` test. The Trino pool operator (trino-pools spec §3,
§4.3-4.13) is the next piece of work; the numbers that belong to it are listed in
``TRINO_OPERATOR_PENDING``. That list may only shrink: a number that gains a test must leave it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT.parent / "shared" / "spec"
TAG = re.compile(r"""safeguard\(\s*["'](reshard|trino)-(\d+)["']\s*\)""")

TRINO_OPERATOR_PENDING = frozenset(
    {9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28, 29, 30, 31}
    | {32, 34, 35, 36, 37, 39, 40, 43, 44, 45}
)


def spec_numbers(name: str) -> set[int]:
    path = SPEC_DIR / name
    assert path.exists(), f"{path} is missing: the specs live in ../shared beside the checkout"
    text = path.read_text(encoding="utf-8")
    section = text.split("\n## 8.", 1)[1].split("\n## 9.", 1)[0]
    return {int(m) for m in re.findall(r"^(\d+)\. ", section, flags=re.MULTILINE)}


def tagged() -> dict[str, set[int]]:
    found: dict[str, set[int]] = {"reshard": set(), "trino": set()}
    for path in (ROOT / "tests").rglob("*.py"):
        for spec, number in TAG.findall(path.read_text(encoding="utf-8")):
            found[spec].add(int(number))
    return found


@pytest.fixture(scope="module")
def tags() -> dict[str, set[int]]:
    return tagged()


def test_every_reshard_safeguard_has_a_test(tags):
    numbers = spec_numbers("reshard.md")
    assert len(numbers) >= 59
    assert sorted(numbers - tags["reshard"]) == []


def test_tags_name_real_safeguards(tags):
    assert sorted(tags["reshard"] - spec_numbers("reshard.md")) == []
    assert sorted(tags["trino"] - spec_numbers("trino-pools.md")) == []


def test_every_trino_safeguard_is_tested_or_pending_for_the_operator(tags):
    numbers = spec_numbers("trino-pools.md")
    assert sorted(numbers - tags["trino"] - TRINO_OPERATOR_PENDING) == []
    assert sorted(TRINO_OPERATOR_PENDING & tags["trino"]) == [], "tested: remove from pending"
