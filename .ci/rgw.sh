#!/usr/bin/env bash
# A real S3 endpoint: single-node Ceph (mon + in-memory OSD) with the RADOS Gateway, from
# Debian's ceph 16 packages, on loopback only (recipe and gotchas: infra.md §2).
#
#   .ci/rgw.sh start    # idempotent: if something already answers on the RGW port, done
#   .ci/rgw.sh stop     # stops what `start` started (pids in the state dir)
#   .ci/rgw.sh status   # exit 0 when the endpoint answers
#
# Endpoint http://127.0.0.1:$RGW_PORT (7480), access key / secret `testing` / `testing`,
# no auth inside the cluster, memstore (2 GiB, gone on stop). State: $RGW_DIR
# (default /var/tmp/duckgres-ci/rgw). Without the packages: with CI=true they are installed
# (`--no-install-recommends`, ~30 s); otherwise the start is skipped with a message and the
# `rgw` suite skips (fails under CI).
set -euo pipefail
D=${RGW_DIR:-/var/tmp/duckgres-ci/rgw}
RGW_PORT=${RGW_PORT:-7480}
MON_PORT=${CEPH_MON_PORT:-3300}
URL=http://127.0.0.1:$RGW_PORT
log() { printf 'rgw: %s\n' "$*"; }
# shellcheck source=.ci/pids.sh
. "$(cd "$(dirname "$0")" && pwd)/pids.sh"
up() { curl -s -m 2 -o /dev/null "$URL/"; }
C=(-c "$D/ceph.conf")

start() {
  if up; then log "already answering at $URL"; return 0; fi
  if ! command -v radosgw >/dev/null || ! command -v ceph-mon >/dev/null; then
    if [ "${CI:-}" = true ]; then
      log "installing ceph-mon ceph-osd radosgw ceph-common (apt)"
      export DEBIAN_FRONTEND=noninteractive
      apt-get update -q >/dev/null
      apt-get install -y -q --no-install-recommends ceph-mon ceph-osd radosgw ceph-common >/dev/null
    else
      log "SKIPPED: Ceph is not installed; apt-get install --no-install-recommends" \
        "ceph-mon ceph-osd radosgw ceph-common (or run with CI=true) to enable the rgw suite"
      return 0
    fi
  fi
  stop quiet
  rm -rf "$D"; mkdir -p "$D"/{mon,osd0,rgw,log,run}
  local fsid; fsid=$(cat /proc/sys/kernel/random/uuid)
  cat >"$D/ceph.conf" <<CONF
[global]
fsid = $fsid
mon host = v2:127.0.0.1:$MON_PORT
mon initial members = a
public network = 127.0.0.0/8
auth cluster required = none
auth service required = none
auth client required = none
auth supported = none
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd pool default pg autoscale mode = off
mon allow pool size one = true
mon warn on pool no redundancy = false
mon max pg per osd = 1000
osd crush chooseleaf type = 0
osd objectstore = memstore
memstore device bytes = 2147483648
run dir = $D/run
log file = $D/log/\$name.log
admin socket = $D/run/\$name.asok
pid file = $D/run/\$name.pid
keyring = /dev/null
ms bind ipv6 = false
ms mon client mode = crc secure
ms client mode = crc secure
ms cluster mode = crc secure
ms service mode = crc secure
[mon.a]
mon data = $D/mon
[osd.0]
osd data = $D/osd0
[client.rgw.a]
rgw data = $D/rgw
rgw dns name = localhost
# Deleted objects and aborted parts wait for the garbage collector (by default 2 h, run hourly):
# in a 2 GiB memstore a few hundred 6 MiB backups of a bench fill the OSD, and every write then
# blocks until the client's read timeout. Collect within seconds instead.
rgw gc obj min wait = 2
rgw gc processor period = 5
rgw gc processor max time = 5
# STS (AssumeRole with a session policy): the per-operation S3 credentials a launcher mints
# for a runner are tested against a server that enforces the policy (moto does not).
rgw s3 auth use sts = true
rgw sts key = duckgresstskey16
CONF
  monmaptool --create --clobber --fsid "$fsid" --addv a "[v2:127.0.0.1:$MON_PORT]" "$D/monmap" >/dev/null
  ceph-mon "${C[@]}" -i a --mkfs --monmap "$D/monmap"
  setsid ceph-mon "${C[@]}" -i a </dev/null >>"$D/log/start.log" 2>&1
  wait_for "ceph-mon" 30 ceph "${C[@]}" --connect-timeout 2 mon stat
  local osd; osd=$(ceph "${C[@]}" osd create)
  ceph-osd "${C[@]}" -i "$osd" --mkfs >/dev/null 2>&1
  ceph "${C[@]}" osd crush add-bucket node1 host >/dev/null 2>&1
  ceph "${C[@]}" osd crush move node1 root=default >/dev/null 2>&1
  ceph "${C[@]}" osd crush add "osd.$osd" 1.0 host=node1 >/dev/null 2>&1
  setsid ceph-osd "${C[@]}" -i "$osd" </dev/null >>"$D/log/start.log" 2>&1
  wait_for "ceph-osd" 60 bash -c "ceph ${C[*]} osd stat | grep -q '1 up'"
  # tcp_nodelay=1: without it Beast's answer waits on Nagle's algorithm and the client's
  # delayed ACK: every small call (GET, List, an empty PUT, CreateMultipartUpload, Complete)
  # took >= 43 ms on loopback, a HEAD 3 ms; with it, 2-9 ms. It cost a backup ~40 ms after
  # the dump's last byte (docs/performance.md). S3 itself answers without that stall.
  setsid radosgw "${C[@]}" -n client.rgw.a \
    --rgw-frontends="beast endpoint=127.0.0.1:$RGW_PORT tcp_nodelay=1" </dev/null >>"$D/log/start.log" 2>&1
  wait_for "radosgw" 60 up
  radosgw-admin "${C[@]}" user create --uid=testing --display-name=testing \
    --access-key=testing --secret-key=testing >/dev/null
  # The role a warehouse's data_role_arn names in the rgw suite (arn:aws:iam:::role/duckgres-data):
  # trusted by the `testing` user, all of S3; what a minted session may do is its session policy.
  radosgw-admin "${C[@]}" caps add --uid=testing --caps="roles=*" >/dev/null
  radosgw-admin "${C[@]}" role create --role-name=duckgres-data \
    --assume-role-policy-doc='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":["arn:aws:iam:::user/testing"]},"Action":["sts:AssumeRole"]}]}' >/dev/null
  radosgw-admin "${C[@]}" role-policy put --role-name=duckgres-data --policy-name=s3 \
    --policy-doc='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Action":["s3:*"],"Resource":["arn:aws:s3:::*"]}]}' >/dev/null
  log "ready at $URL (access key testing)"
}

wait_for() {  # what, seconds, command...
  local what=$1 secs=$2; shift 2
  for _ in $(seq $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  log "$what not ready within ${secs} s; logs in $D/log"; tail -20 "$D"/log/*.log 2>/dev/null || true
  exit 1
}

stop() {
  local quiet=${1:-}
  for f in "$D"/run/*.pid; do
    [ -s "$f" ] || continue
    # Ceph writes the pid alone; its daemons' programs are known: a reused pid is left alone.
    if pid_runs "$f" ceph-mon || pid_runs "$f" ceph-osd || pid_runs "$f" radosgw; then
      kill "$(head -n 1 "$f")" 2>/dev/null && [ -z "$quiet" ] && log "stopped $(basename "$f" .pid)"
    fi
    rm -f "$f"
  done
  return 0
}

case ${1:-start} in
  start) start ;;
  stop) stop ;;
  status) if up; then log "answering at $URL"; else log "not running"; exit 1; fi ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac
