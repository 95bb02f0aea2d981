"""The dependency locks (issue 26 item 7; docs/image.md "Reproducible builds"): every package the
image and the test environment install is pinned with the hashes of its files, the locks agree
with the requirements they are compiled from and with each other, and both installs check the
hashes."""

from __future__ import annotations

from pathlib import Path

from tests.fixtures.locks import PIN, pins

ROOT = Path(__file__).resolve().parents[1]


def _entries(path: Path) -> list[str]:
    """One string per requirement of a pip-compile output (continuation lines joined)."""
    text = path.read_text().replace("\\\n", " ")
    return [line for line in text.splitlines() if PIN.match(line)]


QUICKSTART_LOCK = "k8s/overlays/quickstart/image/requirements.lock"


def test_every_locked_package_carries_the_hashes_of_its_files() -> None:
    for lock in ("requirements.lock", "requirements-dev.lock", QUICKSTART_LOCK):
        entries = _entries(ROOT / lock)
        assert len(entries) > 20, lock
        unhashed = [e.split()[0] for e in entries if "--hash=sha256:" not in e]
        assert unhashed == [], f"{lock}: {unhashed}"


def test_the_locks_keep_every_direct_pin_and_agree_with_each_other() -> None:
    runtime, dev = pins(ROOT / "requirements.lock"), pins(ROOT / "requirements-dev.lock")
    for source, lock in (("requirements.txt", runtime), ("requirements-dev.txt", dev)):
        wanted = pins(ROOT / source)
        drift = {n: (v, lock.get(n)) for n, v in wanted.items() if lock.get(n) != v}
        assert drift == {}, f"{source} and its lock differ (run make lock): {drift}"
    assert runtime.keys() <= dev.keys()
    assert {n: (v, dev[n]) for n, v in runtime.items() if dev[n] != v} == {}


def test_the_quickstart_image_installs_its_lock_with_hash_checking() -> None:
    containerfile = (ROOT / "k8s/overlays/quickstart/image/Containerfile").read_text()
    assert "--require-hashes -r /tmp/requirements.lock" in containerfile
    assert "moto==" in (ROOT / QUICKSTART_LOCK).read_text()
    assert QUICKSTART_LOCK in (ROOT / "Makefile").read_text()  # `make lock` recompiles it


def test_both_installs_refuse_a_file_whose_hash_is_not_locked() -> None:
    containerfile = (ROOT / "Containerfile").read_text()
    assert "--require-hashes -r /tmp/requirements.lock" in containerfile
    assert "COPY requirements.txt" not in containerfile
    makefile = (ROOT / "Makefile").read_text()
    assert "--require-hashes -r requirements-dev.lock" in makefile
