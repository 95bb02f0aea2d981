"""`make release` (docs/image.md "Reproducible builds"; issue 26 item 7): the image pushed with the
digest buildah wrote, manifests whose every container runs exactly that digest, an SBOM of the
locked Python packages, and checksums of it all. Runs the real target (buildah, kubectl's
kustomize, cyclonedx-py) into a temporary directory."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tarfile
from pathlib import Path

import yaml

from tests.test_locks import pins

ROOT = Path(__file__).resolve().parents[1]
VERSION = re.search(r'^version = "(.*)"', (ROOT / "pyproject.toml").read_text(), re.M)[1]  # type: ignore[index]


def test_a_release_pins_every_container_to_the_pushed_digest(tmp_path: Path) -> None:
    out = tmp_path / "release"
    done = subprocess.run(
        ["make", "-s", "release", f"RELEASE_DIR={out}", "RELEASE_REPOSITORY=registry.example/dg"],
        cwd=ROOT, capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    digest = (out / "image.digest").read_text().strip()
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", digest)
    # The archive's manifest is the one the digest names.
    with tarfile.open(out / f"duckgres-admin-{VERSION}.oci.tar") as archive:
        index = json.load(archive.extractfile("index.json"))  # type: ignore[arg-type]
    assert [m["digest"] for m in index["manifests"]] == [digest]
    docs = [
        d for d in yaml.safe_load_all((out / f"duckgres-admin-{VERSION}.yaml").read_text()) if d
    ]
    images = set()
    for doc in docs:
        spec = doc.get("spec", {}).get("template", {}).get("spec", {})
        for container in [*spec.get("initContainers", []), *spec.get("containers", [])]:
            images.add(container["image"])
    assert images == {f"registry.example/dg@{digest}"}
    sbom = json.loads((out / f"duckgres-admin-{VERSION}.sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    listed = {c["name"].lower().replace("_", "-"): c["version"] for c in sbom["components"]}
    assert listed == pins(ROOT / "requirements.lock")
    sums = {}
    for line in (out / "SHA256SUMS").read_text().splitlines():
        expected, name = line.split("  ", 1)
        sums[name] = expected
    assert set(sums) == {p.name for p in out.iterdir()} - {"SHA256SUMS"}
    for name, expected in sums.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == expected, name
