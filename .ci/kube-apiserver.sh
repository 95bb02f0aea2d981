#!/usr/bin/env bash
# A real kube-apiserver 1.20.2 (built once per machine by .ci/build-kube-apiserver.sh) with etcd,
# on loopback only (recipe: infra.md §3).
#
#   .ci/kube-apiserver.sh start    # idempotent: checks the ports first; waits for /readyz
#   .ci/kube-apiserver.sh stop     # stops what `start` started (pids in the state dir)
#   .ci/kube-apiserver.sh status   # exit 0 when /readyz answers
#
# Endpoint: https://127.0.0.1:16443, bearer token `ci-token` (self-signed serving certificate).
# etcd: http://127.0.0.1:22379. State: $KAPI_DIR (default /var/tmp/duckgres-ci/kube).
# Without the cached binary: with CI=true it is built (≈8 min, once per machine); otherwise the
# start is skipped with a message and the `kube` test suite skips (fails under CI).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
D=${KAPI_DIR:-/var/tmp/duckgres-ci/kube}
BIN=${KAPI_CACHE_DIR:-/var/cache/duckgres-ci/kube}/kube-apiserver
URL=https://127.0.0.1:16443
TOKEN=ci-token
log() { printf 'kube-apiserver: %s\n' "$*"; }
ready() { curl -skf -m 2 -H "Authorization: Bearer $TOKEN" "$URL/readyz" >/dev/null 2>&1; }
etcd_up() { curl -sf -m 2 http://127.0.0.1:22379/health >/dev/null 2>&1; }
# shellcheck source=.ci/pids.sh
. "$HERE/pids.sh"
pid_alive() { pid_ours "$1"; }

start() {
  if ready; then log "already running at $URL"; return 0; fi
  if [ ! -x "$BIN" ] || ! command -v etcd >/dev/null; then
    if [ "${CI:-}" = true ]; then
      log "binary or etcd missing: building (once per machine, several minutes)"
      "$HERE/build-kube-apiserver.sh"
    else
      log "SKIPPED: $BIN or etcd is missing; run .ci/build-kube-apiserver.sh (≈8 min, once)" \
        "to enable the kube test suite"
      return 0
    fi
  fi
  mkdir -p "$D/etcd" "$D/certs"
  if ! etcd_up; then
    setsid etcd --name ci --data-dir "$D/etcd" \
      --listen-client-urls http://127.0.0.1:22379 --advertise-client-urls http://127.0.0.1:22379 \
      --listen-peer-urls http://127.0.0.1:22380 --initial-advertise-peer-urls http://127.0.0.1:22380 \
      --initial-cluster ci=http://127.0.0.1:22380 --unsafe-no-fsync=true \
      >"$D/etcd.log" 2>&1 </dev/null &
    pid_write "$D/etcd.pid" $! etcd
    for _ in $(seq 100); do etcd_up && break; sleep 0.1; done
    etcd_up || { log "etcd did not start; see $D/etcd.log"; tail -20 "$D/etcd.log"; exit 1; }
  fi
  echo "$TOKEN,admin,admin,system:masters" >"$D/tokens.csv"
  if [ ! -s "$D/certs/sa.key" ]; then
    openssl genrsa -out "$D/certs/sa.key" 2048 2>/dev/null
    openssl rsa -in "$D/certs/sa.key" -pubout -out "$D/certs/sa.pub" 2>/dev/null
  fi
  if ! pid_alive "$D/apiserver.pid"; then
    setsid "$BIN" --etcd-servers=http://127.0.0.1:22379 --bind-address=127.0.0.1 \
      --secure-port=16443 --cert-dir="$D/certs" --advertise-address=127.0.0.1 \
      --endpoint-reconciler-type=none --authorization-mode=AlwaysAllow \
      --token-auth-file="$D/tokens.csv" \
      --service-account-issuer=https://kubernetes.default.svc \
      --service-account-key-file="$D/certs/sa.pub" \
      --service-account-signing-key-file="$D/certs/sa.key" \
      --service-cluster-ip-range=10.96.0.0/16 --disable-admission-plugins=ServiceAccount \
      --enable-priority-and-fairness=false >"$D/apiserver.log" 2>&1 </dev/null &
    pid_write "$D/apiserver.pid" $! "$BIN"
  fi
  for _ in $(seq 300); do ready && break; sleep 0.2; done
  ready || { log "not ready after 60 s; see $D/apiserver.log"; tail -20 "$D/apiserver.log"; exit 1; }
  log "ready at $URL (token $TOKEN)"
}

stop() {
  for name in apiserver etcd; do
    if pid_alive "$D/$name.pid"; then
      kill "$(head -n 1 "$D/$name.pid")" && log "stopped $name"
    fi
    rm -f "$D/$name.pid"
  done
}

case ${1:-start} in
  start) start ;;
  stop) stop ;;
  status) if ready; then log "ready at $URL"; else log "not running"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
