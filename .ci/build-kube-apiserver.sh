#!/usr/bin/env bash
# Builds a real kube-apiserver 1.20.2 from Debian's `kubernetes` source package, once per machine.
# The binary is cached outside the repository (KAPI_CACHE_DIR); later runs exit at once.
set -euo pipefail
OUT=${KAPI_CACHE_DIR:-/var/cache/duckgres-ci/kube}
WORK=${KAPI_BUILD_DIR:-/var/tmp/duckgres-kapi-build}
export DEBIAN_FRONTEND=noninteractive
need=()
command -v etcd >/dev/null || need+=(etcd-server)
[ -x "$OUT/kube-apiserver" ] || need+=(golang-go rsync golang-github-modern-go-reflect2-dev)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
[ -x "$OUT/kube-apiserver" ] && exit 0
if [ -z "$(apt-cache showsrc kubernetes 2>/dev/null)" ]; then
  awk 'BEGIN{RS="";ORS="\n\n"} /Types: deb/ && /Suites: bookworm/ {print; exit}' /etc/apt/sources.list.d/debian.sources \
    | sed 's/^Types: deb$/Types: deb-src/; s/^Suites: .*/Suites: bookworm/' > /etc/apt/sources.list.d/zz-deb-src.sources
  apt-get update -q >/dev/null
fi
rm -rf "$WORK"; mkdir -p "$WORK"; cd "$WORK"
apt-get source --download-only kubernetes >/dev/null && tar xzf kubernetes_*.orig.tar.gz && cd kubernetes-1.20.2
V=vendor/github.com/modern-go/reflect2; rm -f $V/*.go $V/*.s
cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.{go,s} $V/
env HOME="$WORK/home" make WHAT=cmd/kube-apiserver >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
mkdir -p "$OUT" && cp _output/bin/kube-apiserver "$OUT/" && cd / && rm -rf "$WORK"
