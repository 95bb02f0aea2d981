#!/usr/bin/env bash
# The local base image for `make image`: Debian 12 (bookworm) minbase + python3 + venv, made with
# debootstrap from Debian's packages, because no image registry is reachable from our machines.
# Built once per machine and cached: the rootfs tarball in $IMAGE_CACHE_DIR and the image in
# buildah's storage as $BASE_IMAGE. Later runs return at once.
#
# Pinned by version: every package of the rootfs must have exactly the version
# .ci/base-packages.lock lists, else the build fails naming the differences (debootstrap cannot
# ask for versions, and snapshot.debian.org is not reachable from our machines, so a point release
# of bookworm shows up here, not silently in the image). The image carries the lock's hash as the
# label duckgres.base-lock; a changed lock rebuilds it.
#
#   .ci/base-image.sh                           # make sure the base exists (≈2 min once)
#   DUCKGRES_BASE_RELOCK=1 .ci/base-image.sh    # after a point release: rebuild, rewrite the lock
#
# Env: IMAGE_CACHE_DIR (default /var/cache/duckgres-ci/image), BASE_IMAGE, DUCKGRES_BASE_RELOCK.
set -euo pipefail
CACHE=${IMAGE_CACHE_DIR:-/var/cache/duckgres-ci/image}
BASE_IMAGE=${BASE_IMAGE:-localhost/duckgres-base:bookworm}
log() { printf 'base-image: %s\n' "$*"; }
export DEBIAN_FRONTEND=noninteractive

need=()
command -v buildah >/dev/null || need+=(buildah)
command -v debootstrap >/dev/null || need+=(debootstrap)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]} (apt)"
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
LOCK=$(cd "$(dirname "$0")" && pwd)/base-packages.lock
lock_hash=$(sha256sum "$LOCK" | cut -c1-16)
RELOCK=${DUCKGRES_BASE_RELOCK:-0}
if [ "$RELOCK" != 1 ] && buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  have=$(buildah inspect --type image --format '{{index .Docker.Config.Labels "duckgres.base-lock"}}' "$BASE_IMAGE" 2>/dev/null || true)
  if [ "$have" = "$lock_hash" ]; then log "$BASE_IMAGE present (lock $lock_hash)"; exit 0; fi
  log "$BASE_IMAGE was built for another lock (${have:-none}, now $lock_hash): rebuilding"
fi
mkdir -p "$CACHE"
TAR=$CACHE/bookworm-minbase-python3.tar

# "<package> <version>" of every package a rootfs tarball holds, sorted.
packages_of() { tar -xOf "$1" ./var/lib/dpkg/status | awk '/^Package:/{p=$2} /^Version:/{print p" "$2}' | sort; }
# The rootfs matches the lock (0), or the differences are printed (1).
matches_lock() {
  diff <(grep -v '^#' "$LOCK" | sort) <(packages_of "$1") \
    | sed -n 's/^< /  locked: /p; s/^> /  mirror: /p'
  [ "${PIPESTATUS[0]}" = 0 ]
}
if [ -s "$TAR" ] && [ "$RELOCK" != 1 ] && ! matches_lock "$TAR" >/dev/null; then
  log "the cached rootfs is not the locked one: debootstrapping again"; rm -f "$TAR"
fi
if [ ! -s "$TAR" ] || [ "$RELOCK" = 1 ]; then
  # The mirror this machine's apt already uses (never a hard-coded host).
  mirror=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/* 2>/dev/null \
    | sed -n -E 's#^(URIs:|deb)[[:space:]]+(\[[^]]*\][[:space:]]+)?(https?://[^ ]+/debian)/?([[:space:]].*)?$#\3#p' \
    | head -1 || true)
  [ -n "$mirror" ] || { log "no Debian mirror in /etc/apt/sources*"; exit 1; }
  root=$(mktemp -d /var/tmp/duckgres-rootfs.XXXXXX)
  trap 'rm -rf "$root"' EXIT
  log "debootstrap bookworm minbase from $mirror (≈2 min, once per machine)"
  debootstrap --variant=minbase --include=python3,python3-venv,ca-certificates \
    bookworm "$root" "$mirror" >"$CACHE/debootstrap.log" 2>&1 \
    || { tail -20 "$CACHE/debootstrap.log"; exit 1; }
  rm -rf "$root"/var/cache/apt/archives/*.deb "$root"/var/lib/apt/lists/* "$root"/tmp/* \
    "$root"/usr/share/doc/* "$root"/usr/share/man/* "$root"/usr/share/locale/*
  tar -C "$root" --numeric-owner -cf "$TAR.tmp" . && mv "$TAR.tmp" "$TAR"
fi
if [ "$RELOCK" = 1 ]; then
  { grep '^#' "$LOCK"; packages_of "$TAR"; } > "$LOCK.tmp" && mv "$LOCK.tmp" "$LOCK"
  lock_hash=$(sha256sum "$LOCK" | cut -c1-16)
  log "relocked $(grep -vc '^#' "$LOCK") packages into $LOCK: review the diff and commit it"
elif ! differences=$(matches_lock "$TAR"); then
  log "the mirror's bookworm no longer yields the locked base packages:"
  printf '%s\n' "$differences" >&2
  log "fix: DUCKGRES_BASE_RELOCK=1 .ci/base-image.sh, review and commit .ci/base-packages.lock"
  log "(docs/image.md \"Pins\")"
  rm -f "$TAR"; exit 1
fi
ctr=$(buildah from scratch)
buildah add "$ctr" "$TAR" / >/dev/null
buildah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --label org.opencontainers.image.description="Debian bookworm minbase + python3 (debootstrap)" \
  --label duckgres.base-lock="$lock_hash" "$ctr"
buildah commit -q --rm "$ctr" "$BASE_IMAGE" >/dev/null
log "$BASE_IMAGE built ($(du -h "$TAR" | cut -f1) rootfs)"
