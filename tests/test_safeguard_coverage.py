"""Every safeguard of the catalogue ``docs/safeguards.md`` is proven by a tagged test.

The catalogue has two sections, ``## Reshard`` and ``## Trino pools``; each entry is a list item
``N. **Title.** text`` at column 0 whose last sub-item ``- Tests:`` names the test files carrying
its tag (the format is described at the top of the catalogue). Each number must carry at least
one ``@pytest.mark.safeguard`` test tagged ``reshard-N`` / ``trino-N``, every tag must name a real
entry, and every entry must list existing test files that carry its tag. Only files inside the
repository are read.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CATALOGUE = ROOT / "docs" / "safeguards.md"
TESTS = ROOT / "tests"
SECTIONS = {"## Reshard": "reshard", "## Trino pools": "trino"}
MINIMUM = {"reshard": 59, "trino": 45}
TAG = re.compile(r"""safeguard\(\s*["'](reshard|trino)-(\d+)["']\s*\)""")
ENTRY = re.compile(r"^(\d+)\. \*\*([^*]+)\*\* \S")
FIELD = re.compile(r"^ +- ([A-Za-z ]+):")
BACKTICKED = re.compile(r"`([^`]+)`")


@dataclass(frozen=True)
class Entry:
    family: str
    number: int
    title: str
    tests: tuple[str, ...]

    @property
    def id(self) -> str:
        return f"{self.family}-{self.number}"


def parse_entry(family: str, lines: list[str]) -> Entry:
    match = ENTRY.match(lines[0])
    assert match, f"docs/safeguards.md: not an entry line: {lines[0]!r}"
    fields = [(i, found.group(1)) for i, line in enumerate(lines) if (found := FIELD.match(line))]
    names = [name for _, name in fields]
    where = f"docs/safeguards.md: {family}-{match.group(1)}"
    assert names.count("Tests") == 1, f"{where} needs exactly one '- Tests:' sub-item"
    assert names[-1] == "Tests", f"{where}: '- Tests:' must be the last sub-item"
    start = fields[-1][0]
    tests = tuple(path for line in lines[start:] for path in BACKTICKED.findall(line))
    return Entry(family, int(match.group(1)), match.group(2).strip(), tests)


def parse_catalogue(text: str) -> dict[str, list[Entry]]:
    """Entries per family, in file order. Lines outside the two sections are ignored."""
    blocks: dict[str, list[list[str]]] = {}
    family: str | None = None
    current: list[str] | None = None
    for line in text.splitlines():
        if line.startswith("#"):
            family = SECTIONS.get(line.strip())
            assert family is None or family not in blocks, f"section {line!r} appears twice"
            if family is not None:
                blocks[family] = []
            current = None
        elif family is None:
            continue
        elif line[:1].isdigit():
            current = [line]
            blocks[family].append(current)
        elif line.startswith(" ") and current is not None:
            current.append(line)
        elif line.strip():
            current = None  # a paragraph between entries ends the previous entry
    assert sorted(blocks) == sorted(SECTIONS.values()), f"sections found: {sorted(blocks)}"
    return {fam: [parse_entry(fam, lines) for lines in found] for fam, found in blocks.items()}


def tags_in(path: Path) -> set[tuple[str, int]]:
    return {(fam, int(number)) for fam, number in TAG.findall(path.read_text(encoding="utf-8"))}


@pytest.fixture(scope="module")
def catalogue() -> dict[str, list[Entry]]:
    assert CATALOGUE.is_file(), f"{CATALOGUE} is missing"
    return parse_catalogue(CATALOGUE.read_text(encoding="utf-8"))


@pytest.fixture(scope="module")
def tags() -> dict[str, set[int]]:
    found: dict[str, set[int]] = {family: set() for family in SECTIONS.values()}
    for path in TESTS.rglob("*.py"):
        for family, number in tags_in(path):
            found[family].add(number)
    return found


def numbers(catalogue: dict[str, list[Entry]], family: str) -> set[int]:
    return {entry.number for entry in catalogue[family]}


@pytest.mark.parametrize("family", sorted(SECTIONS.values()))
def test_numbering_is_contiguous(catalogue, family):
    listed = [entry.number for entry in catalogue[family]]
    assert listed == list(range(1, len(listed) + 1)), "numbers run 1, 2, 3 … with no gap or repeat"


def test_every_reshard_safeguard_has_a_test(catalogue, tags):
    assert len(numbers(catalogue, "reshard")) >= MINIMUM["reshard"]
    assert sorted(numbers(catalogue, "reshard") - tags["reshard"]) == []


def test_tags_name_real_safeguards(catalogue, tags):
    assert sorted(tags["reshard"] - numbers(catalogue, "reshard")) == []
    assert sorted(tags["trino"] - numbers(catalogue, "trino")) == []


def test_every_trino_safeguard_has_a_test(catalogue, tags):
    assert len(numbers(catalogue, "trino")) >= MINIMUM["trino"]
    assert sorted(numbers(catalogue, "trino") - tags["trino"]) == []


def test_every_entry_lists_test_files_that_carry_its_tag(catalogue):
    problems = []
    for entry in (e for entries in catalogue.values() for e in entries):
        if not entry.tests:
            problems.append(f"{entry.id}: no test file listed")
        for listed in entry.tests:
            path = (ROOT / listed).resolve()
            if not path.is_relative_to(TESTS) or path.suffix != ".py":
                problems.append(f"{entry.id}: {listed} is not a test file under tests/")
            elif not path.is_file():
                problems.append(f"{entry.id}: {listed} does not exist")
            elif (entry.family, entry.number) not in tags_in(path):
                problems.append(f"{entry.id}: {listed} has no test tagged {entry.id}")
    assert problems == []
