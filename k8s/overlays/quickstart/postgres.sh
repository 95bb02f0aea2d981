#!/bin/sh
# One quickstart PostgreSQL server (the StatefulSet duckgres-quickstart-pg, docs/kubernetes.md
# "Quickstart"): ordinal 0 is the config store (role duckgres_admin, with the CREATEROLE that
# minting runner logins needs, and its database), ordinals 1
# and 2 are the metadata stores (role provisioner: LOGIN CREATEDB CREATEROLE). Data lives in the
# pod's emptyDir: a restarted pod starts empty. TLS with a self-signed certificate made here, so
# clients use sslmode=require (the stores are registered with tls_policy allow-weaker, saying so).
# Passwords come from the Secret duckgres-quickstart (env), never from an argument.
set -eu
data=/var/lib/duckgres-pg/data
ordinal=${POD_NAME##*-}
if [ ! -s "$data/PG_VERSION" ]; then
  umask 077
  printf '%s\n' "$POSTGRES_PASSWORD" > /tmp/pwfile
  initdb -D "$data" -U postgres --pwfile=/tmp/pwfile --auth-local=trust \
    --auth-host=scram-sha-256 --encoding=UTF8 --locale=C.UTF-8
  rm -f /tmp/pwfile
  openssl req -new -x509 -days 3650 -nodes -subj "/CN=$POD_NAME" \
    -keyout "$data/server.key" -out "$data/server.crt" 2>/dev/null
  cat >> "$data/postgresql.conf" <<CONF
listen_addresses = '*'
unix_socket_directories = '/tmp'
ssl = on
max_connections = 100
shared_buffers = 64MB
CONF
  cat > "$data/pg_hba.conf" <<HBA
local all all trust
hostssl all all 0.0.0.0/0 scram-sha-256
hostssl all all ::/0 scram-sha-256
HBA
  pg_ctl -D "$data" -o "-c listen_addresses=''" -w start >/dev/null
  if [ "$ordinal" = 0 ]; then
    psql -h /tmp -U postgres -v ON_ERROR_STOP=1 -q <<'SQL'
\getenv pw CONFIG_STORE_PASSWORD
CREATE ROLE duckgres_admin LOGIN CREATEROLE PASSWORD :'pw';
CREATE DATABASE duckgres_admin OWNER duckgres_admin;
SQL
  else
    psql -h /tmp -U postgres -v ON_ERROR_STOP=1 -q <<'SQL'
\getenv pw PROVISIONER_PASSWORD
CREATE ROLE provisioner LOGIN CREATEDB CREATEROLE PASSWORD :'pw';
SQL
  fi
  pg_ctl -D "$data" -m fast -w stop >/dev/null
fi
exec postgres -D "$data"
