#!/usr/bin/env bash
# Starts every service the test suite and the demo need; idempotent and safe when they already run.
#
#   PostgreSQL 15 `main`      127.0.0.1:5432  config store; trust on loopback; TLS (self-signed)
#   PostgreSQL 15 `ci_source` 127.0.0.1:5433  metadata store "source"; TLS
#   PostgreSQL 15 `ci_target` 127.0.0.1:5434  metadata store "target"; TLS
#       on 5433/5434: user postgres trusted on 127.0.0.1 (test setup only), every other user
#       needs its password (scram-sha-256), and a role `provisioner` LOGIN CREATEDB CREATEROLE
#       whose password is $DUCKGRES_TEST_PROVISIONER_PASSWORD (default below; tests/testenv.py
#       uses the same default).
#   Redis                     127.0.0.1:6379
#   Ceph RGW (S3)             http://127.0.0.1:7480, keys testing/testing (.ci/rgw.sh)
#   etcd + kube-apiserver     https://127.0.0.1:16443, bearer token `ci-token` (.ci/kube-apiserver.sh)
#   one-node cluster          https://10.244.0.1:26443, pods on bridge cni0 (.ci/kube-node.sh)
#
# Env: CI_STATE_DIR (default /var/tmp/duckgres-ci), CI=true (missing Ceph packages are installed
# and a missing kube-apiserver binary is built, instead of skipping them), DUCKGRES_SKIP_RGW=1 /
# DUCKGRES_SKIP_KUBE=1 / DUCKGRES_SKIP_NODE=1 (do not start that service at all).
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
HERE=$(cd "$(dirname "$0")" && pwd)
STATE=${CI_STATE_DIR:-/var/tmp/duckgres-ci}
PROVISIONER_PASSWORD=${DUCKGRES_TEST_PROVISIONER_PASSWORD:-ci-provisioner-password-4f1e2d3c}
mkdir -p "$STATE"
log() { printf 'services: %s\n' "$*"; }

# --- packages ---------------------------------------------------------------------------------
need=()
compgen -G '/usr/lib/postgresql/*/bin/postgres' >/dev/null || need+=(postgresql)
command -v psql >/dev/null || need+=(postgresql-client)
command -v redis-server >/dev/null || need+=(redis-server)
command -v openssl >/dev/null || need+=(openssl)
command -v curl >/dev/null || need+=(curl)
if [ ${#need[@]} -gt 0 ]; then
  log "installing ${need[*]} (apt)"
  apt-get update -q >/dev/null
  # --no-install-recommends: without it redis-server drags a systemd/udev upgrade (infra.md §1).
  apt-get install -y -q --no-install-recommends "${need[@]}" >"$STATE/apt.log"
fi
PGV=$(ls /usr/lib/postgresql | sort -n | tail -1)

# --- the pod bridge ---------------------------------------------------------------------------
# 10.244.0.1 on bridge cni0: the address the one-node cluster's pods use for the host services
# below (.ci/kube-node.sh). PostgreSQL and Redis listen on it as well as on loopback.
POD_NODE_IP=10.244.0.1
if ! "$HERE/pod-bridge.sh"; then
  log "could not create the pod bridge cni0: services listen on loopback only"
fi

# --- PostgreSQL -------------------------------------------------------------------------------
exists() { pg_lsclusters -h | awk -v v="$PGV" -v n="$1" '$1==v && $2==n {f=1} END {exit !f}'; }
start_cluster() {  # name port
  if ! pg_isready -q -h 127.0.0.1 -p "$2"; then
    setsid pg_ctlcluster --skip-systemctl-redirect "$PGV" "$1" start </dev/null
    for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p "$2" && break; sleep 0.2; done
  fi
}
# psql as the superuser through the local socket (peer/trust there on every Debian cluster).
su_psql() {  # port, psql args...
  local port=$1; shift
  (cd / && runuser -u postgres -- psql -X -q -p "$port" -v ON_ERROR_STOP=1 "$@")
}
write_hba() {  # name, content: rewrite pg_hba.conf only when it differs; reload then
  local f=/etc/postgresql/$PGV/$1/pg_hba.conf
  if ! printf '%s\n' "$2" | cmp -s - "$f"; then
    printf '%s\n' "$2" >"$f"
    chown postgres:postgres "$f"
    su_psql "$3" -Atc 'select pg_reload_conf()' >/dev/null
    log "pg_hba.conf of $1 updated"
  fi
}
ensure_tls() {  # name port: self-signed certificate in the data directory, ssl=on
  local dir
  dir=$(su_psql "$2" -Atc 'show data_directory')
  if [ ! -s "$dir/server.crt" ] || [ ! -s "$dir/server.key" ]; then
    openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -subj /CN=localhost \
      -keyout "$dir/server.key" -out "$dir/server.crt" 2>/dev/null
    chown postgres:postgres "$dir/server.key" "$dir/server.crt"
    chmod 0600 "$dir/server.key"
  fi
  # Debian's own `main` cluster names the snakeoil certificate, absent on our machines: point
  # every cluster at the certificate above (a failed certificate load on reload leaves TLS off
  # while `show ssl` says on; on restart the server refuses to start).
  local f
  for f in ssl_cert_file:server.crt ssl_key_file:server.key; do
    if [ "$(su_psql "$2" -Atc "select coalesce(sourcefile, '') like '%postgresql.auto.conf' and setting = '${f#*:}' from pg_settings where name = '${f%%:*}'")" != t ]; then
      su_psql "$2" -c "ALTER SYSTEM SET ${f%%:*} = '${f#*:}'" -c 'SELECT pg_reload_conf()' >/dev/null
    fi
  done
  if [ "$(su_psql "$2" -Atc 'show ssl')" != on ]; then
    su_psql "$2" -c 'ALTER SYSTEM SET ssl = on' -c 'SELECT pg_reload_conf()' >/dev/null
    for _ in $(seq 25); do [ "$(su_psql "$2" -Atc 'show ssl')" = on ] && break; sleep 0.2; done
    [ "$(su_psql "$2" -Atc 'show ssl')" = on ] || { log "ssl did not turn on for $1"; exit 1; }
    log "TLS enabled on $1 ($2)"
  fi
}

HBA_MAIN='# Managed by .ci/services.sh: the config store of tests and the demo (trust on loopback
# only); pods of the one-node cluster (10.244.0.0/24) must present a password.
local all all trust
host  all all 127.0.0.1/32 trust
host  all all ::1/128 trust
host  all all 10.244.0.0/24 scram-sha-256'
HBA_STORE='# Managed by .ci/services.sh: a test metadata store. Only the superuser is trusted (test
# setup); every other login (provisioner, tenant roles) must present its password.
local all all trust
host  all postgres 127.0.0.1/32 trust
host  all all 127.0.0.1/32 scram-sha-256
host  all all ::1/128 scram-sha-256
host  all all 10.244.0.0/24 scram-sha-256'

ensure_listen() {  # name port: loopback and the pod bridge (restart only when it changes)
  local want="localhost,$POD_NODE_IP"
  if [ "$(su_psql "$2" -Atc 'show listen_addresses')" != "$want" ]; then
    su_psql "$2" -c "ALTER SYSTEM SET listen_addresses = '$want'" >/dev/null
    setsid pg_ctlcluster --skip-systemctl-redirect "$PGV" "$1" restart </dev/null
    for _ in $(seq 50); do pg_isready -q -h 127.0.0.1 -p "$2" && break; sleep 0.2; done
    log "$1 listens on $want"
  fi
}
ensure_cluster() {  # name port hba
  if ! exists "$1"; then
    pg_createcluster "$PGV" "$1" -p "$2" -- --auth=trust >/dev/null
    log "created cluster $PGV/$1 on port $2"
  fi
  start_cluster "$1" "$2"
  write_hba "$1" "$3" "$2"
  ensure_tls "$1" "$2"
  ensure_listen "$1" "$2"
}

ensure_cluster main 5432 "$HBA_MAIN"
su_psql 5432 -Atc "select 1 from pg_roles where rolname='root'" | grep -q 1 \
  || su_psql 5432 -c 'CREATE ROLE root SUPERUSER LOGIN'
for db in test root; do
  su_psql 5432 -Atc "select 1 from pg_database where datname='$db'" | grep -q 1 \
    || su_psql 5432 -c "CREATE DATABASE $db"
done

for spec in ci_source:5433 ci_target:5434; do
  name=${spec%%:*}; port=${spec##*:}
  ensure_cluster "$name" "$port" "$HBA_STORE"
  # The privileged login the product uses on cnpg stores (spec reshard §2.2). The password
  # travels in the environment and is quoted by psql (:'pw'): never in argv, never printed.
  DUCKGRES_CI_PW="$PROVISIONER_PASSWORD" su_psql "$port" <<'SQL'
\getenv pw DUCKGRES_CI_PW
SELECT format('CREATE ROLE provisioner LOGIN CREATEDB CREATEROLE PASSWORD %L', :'pw')
  WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = 'provisioner') \gexec
SELECT format('ALTER ROLE provisioner LOGIN CREATEDB CREATEROLE PASSWORD %L', :'pw') \gexec
SQL
done
# The restore tests' scratch store (the "target" cluster) lets the provisioner bound a scratch
# role's temporary files, as docs/backup.md asks of a production scratch store; the "source"
# cluster stays without the grant, as a store where it was not given.
su_psql 5434 -qc "GRANT SET ON PARAMETER temp_file_limit TO provisioner"
# Both clusters let the provisioner lower deadlock_timeout for its own sessions, as
# docs/copy.md asks of a production store: an autovacuum then yields to the write fence within
# 50 ms instead of 1 s. The PostgreSQL 12 and 18 servers of the tests stay without it.
for port in 5433 5434; do
  su_psql "$port" -qc "GRANT SET ON PARAMETER deadlock_timeout TO provisioner"
done

# One test CA signs every cluster's server certificate (SAN 127.0.0.1, ::1, localhost),
# so verify-full works against the test stores (.ci/test-ca.sh; tests/testenv.py trusts it).
"$HERE/test-ca.sh"

# --- Redis ------------------------------------------------------------------------------------
# "-" makes the pod-bridge address optional (Redis 7): loopback always, 10.244.0.1 when it exists.
if ! redis-cli -h 127.0.0.1 -p 6379 ping >/dev/null 2>&1; then
  # No password and not loopback-only: protected mode would refuse the pods; only this machine's
  # own pods are on the bridge.
  setsid redis-server --daemonize yes --bind 127.0.0.1 "-$POD_NODE_IP" --protected-mode no \
    --port 6379 --save "" --appendonly no \
    --dir "$STATE" --logfile "$STATE/redis.log" --pidfile "$STATE/redis.pid"
  for _ in $(seq 50); do redis-cli -h 127.0.0.1 ping >/dev/null 2>&1 && break; sleep 0.1; done
  log "redis started on 6379"
fi
if [ "$(redis-cli -h "$POD_NODE_IP" -p 6379 ping 2>/dev/null)" != PONG ] \
  && ip -4 addr show cni0 2>/dev/null | grep -q "$POD_NODE_IP"; then
  redis-cli -h 127.0.0.1 -p 6379 CONFIG SET bind "127.0.0.1 -$POD_NODE_IP" >/dev/null
  redis-cli -h 127.0.0.1 -p 6379 CONFIG SET protected-mode no >/dev/null
  log "redis listens on $POD_NODE_IP too"
fi

# --- S3: Ceph RGW ----------------------------------------------------------------------------
if [ "${DUCKGRES_SKIP_RGW:-}" = 1 ]; then
  log "Ceph RGW not started (DUCKGRES_SKIP_RGW=1)"
else
  "$HERE/rgw.sh" start
fi

# --- Kubernetes API ---------------------------------------------------------------------------
if [ "${DUCKGRES_SKIP_KUBE:-}" = 1 ]; then
  log "kube-apiserver not started (DUCKGRES_SKIP_KUBE=1)"
else
  "$HERE/kube-apiserver.sh" start
fi

# --- the one-node cluster (real pods) --------------------------------------------------------
if [ "${DUCKGRES_SKIP_NODE:-}" = 1 ]; then
  log "one-node cluster not started (DUCKGRES_SKIP_NODE=1)"
elif [ "${CI:-}" = true ] || [ -x "${KAPI_CACHE_DIR:-/var/cache/duckgres-ci/kube}/kubelet" ]; then
  "$HERE/kube-node.sh" start
else
  log "SKIPPED: the one-node cluster needs the Kubernetes build (.ci/build-kube-apiserver.sh," \
    "≈13 min once); the pods suite skips (fails under CI)"
fi
log "ready: postgres 5432/5433/5434 (TLS), redis 6379"
