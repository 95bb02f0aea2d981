"""A CycloneDX SBOM of the Debian packages installed in the image (`make release`).

Reads ``dpkg-query -W -f '${Package}\\t${Version}\\t${Architecture}\\t${db:Status-Abbrev}\\n'``
output (run inside the image) on stdin and writes the SBOM as JSON on stdout: one component per
installed package, with its purl (``pkg:deb/debian/<name>@<version>?arch=<arch>[&epoch=<n>]``).
Sorted, with no timestamp or serial number, so the same image gives the same bytes. Packages
that are not installed (``rc`` and the like) are left out.
"""

from __future__ import annotations

import json
import sys
from urllib.parse import quote


def components(lines: list[str]) -> list[dict[str, object]]:
    found: dict[tuple[str, str], dict[str, object]] = {}
    for line in lines:
        parts = line.rstrip("\n").split("\t")
        if len(parts) != 4 or not parts[3].startswith("ii"):
            continue
        name, version, arch, _ = parts
        epoch, _, plain = version.rpartition(":")  # the purl spec moves an epoch to a qualifier
        qualifiers = f"arch={quote(arch)}" + (f"&epoch={quote(epoch)}" if epoch else "")
        purl = f"pkg:deb/debian/{quote(name)}@{quote(plain)}?{qualifiers}"
        found[(name, arch)] = {
            "type": "library",
            "bom-ref": purl,
            "name": name,
            "version": version,
            "purl": purl,
        }
    return [found[k] for k in sorted(found)]


def main() -> None:
    bom = {
        "bomFormat": "CycloneDX",
        "specVersion": "1.5",
        "version": 1,
        "metadata": {
            "component": {
                "type": "container",
                "name": sys.argv[1] if len(sys.argv) > 1 else "image",
            }
        },
        "components": components(sys.stdin.readlines()),
    }
    json.dump(bom, sys.stdout, indent=2, sort_keys=True)
    sys.stdout.write("\n")


if __name__ == "__main__":
    main()
