#!/usr/bin/env bash
# The local base image for `make image`: Debian 12 (bookworm) minbase + python3 + venv, made with
# debootstrap from Debian's packages, because no image registry is reachable from our machines.
# Built once per machine and cached: the rootfs tarball in $IMAGE_CACHE_DIR and the image in
# buildah's storage as $BASE_IMAGE. Later runs return at once.
#
#   .ci/base-image.sh          # make sure localhost/duckgres-base:bookworm exists (≈2 min once)
#
# Env: IMAGE_CACHE_DIR (default /var/cache/duckgres-ci/image), BASE_IMAGE.
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
if buildah inspect --type image "$BASE_IMAGE" >/dev/null 2>&1; then
  log "$BASE_IMAGE present"; exit 0
fi
mkdir -p "$CACHE"
TAR=$CACHE/bookworm-minbase-python3.tar
if [ ! -s "$TAR" ]; then
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
ctr=$(buildah from scratch)
buildah add "$ctr" "$TAR" / >/dev/null
buildah config --cmd /bin/bash --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
  --label org.opencontainers.image.description="Debian bookworm minbase + python3 (debootstrap)" "$ctr"
buildah commit -q --rm "$ctr" "$BASE_IMAGE" >/dev/null
log "$BASE_IMAGE built ($(du -h "$TAR" | cut -f1) rootfs)"
