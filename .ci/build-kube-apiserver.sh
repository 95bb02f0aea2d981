#!/usr/bin/env bash
# Builds the Kubernetes 1.20.2 control plane and node binaries (kube-apiserver, kube-proxy,
# kube-controller-manager, kube-scheduler, kubelet) from Debian's `kubernetes` source package, once
# per machine, in one `make` (the four share most packages: ≈10-13 min on 2 cores). The binaries are
# cached outside the repository (KAPI_CACHE_DIR); later runs exit at once when all four exist.
set -euo pipefail
OUT=${KAPI_CACHE_DIR:-/var/cache/duckgres-ci/kube}
WORK=${KAPI_BUILD_DIR:-/var/tmp/duckgres-kapi-build}
BINS=(kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy)
export DEBIAN_FRONTEND=noninteractive
have_all() { for b in "${BINS[@]}"; do [ -x "$OUT/$b" ] || return 1; done; }
need=()
command -v etcd >/dev/null || need+=(etcd-server)
have_all || need+=(golang-go rsync golang-github-modern-go-reflect2-dev)
if [ ${#need[@]} -gt 0 ]; then
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends "${need[@]}" >/dev/null
fi
have_all && exit 0
echo "build-kube: building ${BINS[*]} 1.20.2 from Debian's source package (once per machine)"
if [ -z "$(apt-cache showsrc kubernetes 2>/dev/null)" ]; then
  awk 'BEGIN{RS="";ORS="\n\n"} /Types: deb/ && /Suites: bookworm/ {print; exit}' /etc/apt/sources.list.d/debian.sources \
    | sed 's/^Types: deb$/Types: deb-src/; s/^Suites: .*/Suites: bookworm/' > /etc/apt/sources.list.d/zz-deb-src.sources
  apt-get update -q >/dev/null
fi
rm -rf "$WORK"; mkdir -p "$WORK"; cd "$WORK"
apt-get source --download-only kubernetes >/dev/null && tar xzf kubernetes_*.orig.tar.gz && cd kubernetes-1.20.2
# The vendored reflect2 does not build with bookworm's Go 1.19; Debian's packaged one does.
V=vendor/github.com/modern-go/reflect2; rm -f $V/*.go $V/*.s
cp /usr/share/gocode/src/github.com/modern-go/reflect2/*.{go,s} $V/
what=$(printf 'cmd/%s ' "${BINS[@]}")
env HOME="$WORK/home" make WHAT="$what" >"$WORK/build.log" 2>&1 || { tail -30 "$WORK/build.log"; exit 1; }
mkdir -p "$OUT"
for b in "${BINS[@]}"; do cp "_output/bin/$b" "$OUT/"; done
cd / && rm -rf "$WORK"
