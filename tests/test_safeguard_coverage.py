"""Every numbered safeguard of a spec's section 8 is proven by a tagged test (design §4).

Both specs are complete: each number of their section 8 must carry at least one
``@pytest.mark.safeguard("reshard-N")`` / ``("trino-N")`` test, and every tag must name a real
safeguard.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SPEC_DIR = ROOT.parent / "shared" / "spec"
TAG = re.compile(r"""safeguard\(\s*["'](reshard|trino)-(\d+)["']\s*\)""")


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


def test_every_trino_safeguard_has_a_test(tags):
    numbers = spec_numbers("trino-pools.md")
    assert len(numbers) >= 45
    assert sorted(numbers - tags["trino"]) == []
