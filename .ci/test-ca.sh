#!/usr/bin/env bash
# Issues the server certificates of the test PostgreSQL clusters from one local test CA, so that
# clients can verify them (sslmode=verify-full, DUCKGRES_STORE_SSLROOTCERT). Idempotent: a
# cluster whose certificate already chains to the CA and names 127.0.0.1 is left alone.
#
#   CA          $STATE/ca/ca.crt (0644, what clients trust) and $STATE/ca/ca.key (0600)
#   clusters    main 5432, ci_source 5433, ci_target 5434: server.crt/server.key in each data
#               directory, CN=localhost, SAN DNS:localhost, IP:127.0.0.1, IP:::1; reloaded
#
# ca.crt is (re)written only after every cluster serves a certificate issued by the CA, so its
# presence means "verify-full against 127.0.0.1 works": tests/testenv.py points
# DUCKGRES_STORE_SSLROOTCERT at it when it exists. Call it from .ci/services.sh after the
# clusters are up with TLS (ensure_tls). Needs root (data directories, runuser) and openssl.
#
# Env: CI_STATE_DIR (default /var/tmp/duckgres-ci).
set -euo pipefail
STATE=${CI_STATE_DIR:-/var/tmp/duckgres-ci}
CA_DIR=$STATE/ca
log() { printf 'test-ca: %s\n' "$*"; }
su_psql() {  # port, psql args...
  local port=$1; shift
  (cd / && runuser -u postgres -- psql -X -q -p "$port" -v ON_ERROR_STOP=1 "$@")
}

mkdir -p "$CA_DIR"
chmod 0755 "$CA_DIR"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# --- the CA ------------------------------------------------------------------------------------
if [ ! -s "$CA_DIR/ca.key" ] || [ ! -s "$CA_DIR/ca.pem" ]; then
  openssl req -x509 -newkey rsa:2048 -nodes -days 3650 -sha256 \
    -subj "/CN=duckgres test CA" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    -keyout "$work/ca.key" -out "$work/ca.pem" 2>/dev/null
  install -m 0600 "$work/ca.key" "$CA_DIR/ca.key"
  install -m 0644 "$work/ca.pem" "$CA_DIR/ca.pem"
  rm -f "$CA_DIR/ca.crt"  # the published copy follows only once the clusters use the new CA
  log "created the test CA in $CA_DIR"
fi

cat >"$work/server.ext" <<'EXT'
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature, keyEncipherment
extendedKeyUsage = serverAuth
subjectAltName = DNS:localhost, IP:127.0.0.1, IP:::1
EXT

issued_by_ca() {  # certificate file: chains to the CA and names 127.0.0.1
  openssl verify -CAfile "$CA_DIR/ca.pem" "$1" >/dev/null 2>&1 \
    && openssl x509 -in "$1" -noout -ext subjectAltName 2>/dev/null | grep -q 'IP Address:127.0.0.1'
}

# --- the clusters ------------------------------------------------------------------------------
for spec in main:5432 ci_source:5433 ci_target:5434; do
  name=${spec%%:*}; port=${spec##*:}
  if ! pg_isready -q -h 127.0.0.1 -p "$port"; then
    log "cluster $name ($port) is not running; skipped"
    continue
  fi
  dir=$(su_psql "$port" -Atc 'show data_directory')
  if [ -s "$dir/server.crt" ] && issued_by_ca "$dir/server.crt"; then
    continue
  fi
  openssl req -new -newkey rsa:2048 -nodes -subj /CN=localhost \
    -keyout "$work/$name.key" -out "$work/$name.csr" 2>/dev/null
  openssl x509 -req -in "$work/$name.csr" -CA "$CA_DIR/ca.pem" -CAkey "$CA_DIR/ca.key" \
    -CAcreateserial -CAserial "$work/ca.srl" -days 3650 -sha256 -extfile "$work/server.ext" \
    -out "$work/$name.crt" 2>/dev/null
  install -o postgres -g postgres -m 0600 "$work/$name.key" "$dir/server.key"
  install -o postgres -g postgres -m 0644 "$work/$name.crt" "$dir/server.crt"
  su_psql "$port" -Atc 'select pg_reload_conf()' >/dev/null
  log "issued the server certificate of $name ($port) from the test CA"
done

# --- publish -------------------------------------------------------------------------------------
# Only when every running cluster serves a CA-issued certificate (a reload is asynchronous:
# check what the server actually presents).
for port in 5432 5433 5434; do
  pg_isready -q -h 127.0.0.1 -p "$port" || continue
  ok=""
  for _ in $(seq 25); do
    if PGSSLMODE=verify-full PGSSLROOTCERT="$CA_DIR/ca.pem" PGCONNECT_TIMEOUT=5 \
        psql -X -q -h 127.0.0.1 -p "$port" -U postgres -d postgres -Atc 'select 1' \
        >/dev/null 2>&1; then
      ok=1; break
    fi
    sleep 0.2
  done
  [ -n "$ok" ] || { log "port $port does not present a CA-issued certificate"; exit 1; }
done
if ! cmp -s "$CA_DIR/ca.pem" "$CA_DIR/ca.crt" 2>/dev/null; then
  install -m 0644 "$CA_DIR/ca.pem" "$CA_DIR/ca.crt"
  log "published $CA_DIR/ca.crt"
fi
