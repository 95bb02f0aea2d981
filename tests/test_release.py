"""`make release` (docs/image.md "Reproducible builds"; issue 26 item 7): the image pushed with the
digest buildah wrote, manifests whose every container runs exactly that digest, SBOMs of the
locked Python packages and of the image's Debian packages, and checksums of it all. Runs the
real target (buildah, kubectl's kustomize, cyclonedx-py) into a temporary directory."""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tarfile
import zipfile
from pathlib import Path

import yaml

from tests.fixtures.locks import pins

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
    # Every object `kubectl apply -k k8s/` installs, the runner namespace's included.
    installed = subprocess.run(
        ["kubectl", "kustomize", str(ROOT / "k8s")], capture_output=True, text=True, check=True
    ).stdout
    ids = {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace"))
           for d in yaml.safe_load_all(installed) if d}  # fmt: skip
    assert {(d["kind"], d["metadata"]["name"], d["metadata"].get("namespace")) for d in docs} == ids
    sbom = json.loads((out / f"duckgres-admin-{VERSION}.sbom.cdx.json").read_text())
    assert sbom["bomFormat"] == "CycloneDX"
    listed = {c["name"].lower().replace("_", "-"): c["version"] for c in sbom["components"]}
    assert listed == pins(ROOT / "requirements.lock")
    # The Debian packages of the image, as dpkg inside it lists them.
    debian = json.loads((out / f"duckgres-admin-{VERSION}.debian.cdx.json").read_text())
    packages = {c["name"]: c for c in debian["components"]}
    for name in ("python3.11", "libssl3", "libc6", "ca-certificates"):
        assert packages[name]["version"], name
        assert packages[name]["purl"].startswith(f"pkg:deb/debian/{name}@"), packages[name]
    assert len(packages) > 50
    assert packages["zlib1g"]["purl"].endswith("&epoch=1")  # 1:1.2.13…: the epoch qualified
    # The command-line client's own wheel: click its only requirement, nothing of the server.
    (wheel,) = out.glob("duckgres_cli-*-py3-none-any.whl")
    with zipfile.ZipFile(wheel) as archive:
        names = archive.namelist()
        meta = next(n for n in names if n.endswith(".dist-info/METADATA"))
        requires = [
            line.split(":", 1)[1].strip()
            for line in archive.read(meta).decode().splitlines()
            if line.startswith("Requires-Dist:")
        ]
    assert requires == ["click>=8.1"]
    assert "duckgres_cli/app.py" in names
    assert not [n for n in names if n.startswith(("duckgres_admin/", "reshard/", "trino_pools/"))]
    sums = {}
    for line in (out / "SHA256SUMS").read_text().splitlines():
        expected, name = line.split("  ", 1)
        sums[name] = expected
    assert set(sums) == {p.name for p in out.iterdir()} - {"SHA256SUMS"}
    for name, expected in sums.items():
        assert hashlib.sha256((out / name).read_bytes()).hexdigest() == expected, name


def test_docker_and_buildah_copy_the_same_allowlist():
    """`docker build` reads .dockerignore, buildah .containerignore: one allowlist, so an image
    built either way holds the same files (the lock the Containerfile installs, the client
    package the control plane imports)."""
    containerignore = (ROOT / ".containerignore").read_text()
    assert (ROOT / ".dockerignore").read_text() == containerignore
    allowed = {line[1:] for line in containerignore.splitlines() if line.startswith("!")}
    assert {"requirements.lock", "cli/duckgres_cli"} <= allowed


def test_the_build_inputs_are_pinned():
    """docs/image.md "Pins": the PostgreSQL client sources by Debian version and upstream
    checksum, the local base by the version of each of its packages (a suite name or a tag
    would build whatever that day holds)."""
    text = (ROOT / "Containerfile").read_text()

    def arg(name: str) -> dict[str, str]:
        match = re.search(rf'^ARG {name}="([^"]*)"$', text, re.M)
        assert match, name
        return dict(spec.split("=", 1) for spec in match.group(1).split())

    clients, sums = arg("PG_CLIENTS"), arg("PG_ORIG_SHA256")
    assert set(clients) == set(sums)
    assert {"15", "18"} <= set(clients)
    for major, version in clients.items():
        assert re.fullmatch(rf"{major}\.\d+-[0-9A-Za-z.+~]+", version), (major, version)
        assert re.fullmatch(r"[0-9a-f]{64}", sums[major]), major
    lock = [
        line.split(" ")
        for line in (ROOT / ".ci" / "base-packages.lock").read_text().splitlines()
        if line and not line.startswith("#")
    ]
    assert all(len(entry) == 2 and entry[1] for entry in lock)
    packages = dict(lock)
    assert len(packages) == len(lock) > 100
    for name in ("python3.11", "python3.11-venv", "libc6", "ca-certificates", "libssl3"):
        assert packages[name], name
    assert "base-packages.lock" in (ROOT / ".ci" / "base-image.sh").read_text()
