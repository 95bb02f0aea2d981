#!/usr/bin/env bash
# `make demo`: a reshard through the real API, Celery workers and a runner process on this machine.
#
# 1. a fresh demo config store (database duckgres_demo on 5432), migrated;
# 2. a tenant catalog demo_org (role, database, ducklake_* tables) on the source store (5433);
# 3. starts an S3 endpoint (moto server) for the pre-flip catalog backup, the Celery default
#    worker, the control worker (janitor), beat (DatabaseScheduler) and the API (gunicorn,
#    1 process with threads: the password stash is in-process);
# 4. registers the stores demo-source (5433) and demo-target (5434) and the warehouse demo-org
#    through the API, starts a reshard demo-source -> demo-target with the internal secret and
#    follows the op log until the op is terminal; prints the outcome and the report;
# 5. stops every process it started (also on Ctrl-C or error).
# Exit 0 only when the op reached a terminal state AND the warehouse is back to `ready`. Until
# Requires the services (`make services`); logs in var/demo/logs/. Env: DEMO_PORT (8080),
# DEMO_S3_PORT (9010).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
cd "$ROOT"
PY=${PY:-$ROOT/.venv/bin/python}
PORT=${DEMO_PORT:-8080}
S3_PORT=${DEMO_S3_PORT:-9010}
VAR=$ROOT/var/demo
LOGS=$VAR/logs
rm -rf "$VAR"; mkdir -p "$LOGS" "$VAR/runners"
say() { printf 'demo: %s\n' "$*"; }

# --- environment shared by every process (secrets are generated per run, never printed) ----------
rand() { openssl rand -hex 24; }
export DJANGO_SETTINGS_MODULE=duckgres_admin.settings
export DJANGO_SECRET_KEY="demo-$(rand)"
export DUCKGRES_CONFIG_STORE="postgresql://postgres@127.0.0.1:5432/duckgres_demo?sslmode=require"
export DUCKGRES_BROKER_URL=redis://127.0.0.1:6379/3
# The stores' certificates come from the services' CA (.ci/test-ca.sh): the product verifies
# them (verify-full), as in production; without it the demo opts its stores in explicitly.
DEMO_CA=${CI_STATE_DIR:-/var/tmp/duckgres-ci}/ca/ca.crt
if [ -f "$DEMO_CA" ]; then export DUCKGRES_STORE_SSLROOTCERT=$DEMO_CA; fi
export DUCKGRES_INTERNAL_SECRET; DUCKGRES_INTERNAL_SECRET=$(rand)
export DUCKGRES_RUNNER_SECRET; DUCKGRES_RUNNER_SECRET=$(rand)
export DUCKGRES_DATAPLANE_SECRET; DUCKGRES_DATAPLANE_SECRET=$(rand)
export DUCKGRES_RESHARD_LAUNCHER=local
export DUCKGRES_RESHARD_LOCAL_STATE_DIR=$VAR/runners
export DUCKGRES_ADVERTISE_ADDRESS=127.0.0.1
export DUCKGRES_ADVERTISE_PORT=$PORT
export DUCKGRES_CONFIG_POLL_INTERVAL=${DUCKGRES_CONFIG_POLL_INTERVAL:-2}  # block wait = 2 x this
export DUCKGRES_RESHARD_POLL_SECONDS=${DUCKGRES_RESHARD_POLL_SECONDS:-1}
export DUCKGRES_CONTROL_METRICS_PORT=${DUCKGRES_CONTROL_METRICS_PORT:-0}
# The provisioner login of the store clusters (.ci/services.sh); stores reference it as env:.
export DUCKGRES_TEST_PROVISIONER_PASSWORD=${DUCKGRES_TEST_PROVISIONER_PASSWORD:-ci-provisioner-password-4f1e2d3c}
export DEMO_PROVISIONER_PASSWORD_VAR=DUCKGRES_TEST_PROVISIONER_PASSWORD
export DEMO_TENANT_PASSWORD; DEMO_TENANT_PASSWORD=$(openssl rand -hex 16)
# Which secret references the stores and the warehouse may name (docs/configuration.md).
export DUCKGRES_SECRET_REF_ALLOW_PROVISIONER=env:DUCKGRES_TEST_PROVISIONER_PASSWORD
export DUCKGRES_SECRET_REF_ALLOW_TENANT=env:DEMO_TENANT_PASSWORD
export DUCKGRES_API_METRICS_PORT=${DUCKGRES_API_METRICS_PORT:-0}
export DEMO_API_URL=http://127.0.0.1:$PORT
# The backup's S3 endpoint: moto server with its fixed test keys (not secrets).
export DUCKGRES_S3_ENDPOINT_URL=http://127.0.0.1:$S3_PORT
export DUCKGRES_AWS_REGION=us-east-1 DUCKGRES_S3_ADDRESSING_STYLE=path
export AWS_ACCESS_KEY_ID=testing AWS_SECRET_ACCESS_KEY=testing
export PYTHONUNBUFFERED=1

# --- process management --------------------------------------------------------------------------
PIDS=()
start() {  # name, command...: in its own session, output to var/demo/logs/<name>.log
  local name=$1; shift
  setsid "$@" >"$LOGS/$name.log" 2>&1 </dev/null &
  PIDS+=("$!")
  say "started $name (pid $!, log var/demo/logs/$name.log)"
}
stop_all() {
  local rc=$?
  trap - EXIT INT TERM
  if [ ${#PIDS[@]} -gt 0 ]; then
    for pid in "${PIDS[@]}"; do kill -TERM -- "-$pid" 2>/dev/null || true; done
    for _ in $(seq 100); do
      alive=0; for pid in "${PIDS[@]}"; do kill -0 "$pid" 2>/dev/null && alive=1; done
      [ $alive = 0 ] && break; sleep 0.1
    done
    for pid in "${PIDS[@]}"; do kill -KILL -- "-$pid" 2>/dev/null || true; done
    say "stopped the processes it started"
  fi
  if [ $rc -ne 0 ]; then
    say "exit $rc; last lines of each log:"
    for f in "$LOGS"/*.log; do echo "--- $f"; tail -15 "$f"; done
  fi
  exit $rc
}
trap stop_all EXIT
trap 'exit 130' INT TERM
wait_for() {  # description, seconds, command...
  local what=$1 secs=$2; shift 2
  for _ in $(seq $((secs * 5))); do "$@" >/dev/null 2>&1 && return 0; sleep 0.2; done
  say "$what not ready within ${secs} s"; return 1
}

# --- 1. config store -----------------------------------------------------------------------------
for p in "$PORT" "$S3_PORT"; do
  if (exec 3<>/dev/tcp/127.0.0.1/"$p") 2>/dev/null; then
    say "port $p is in use; set DEMO_PORT / DEMO_S3_PORT to free ports"; exit 1
  fi
done
PGOPTIONS='-c client_min_messages=warning' psql -h 127.0.0.1 -U postgres -d postgres -qAtc \
  'DROP DATABASE IF EXISTS duckgres_demo WITH (FORCE)'
psql -h 127.0.0.1 -U postgres -d postgres -qAtc 'CREATE DATABASE duckgres_demo'
"$PY" manage.py migrate --no-input -v 0
say "config store duckgres_demo migrated"
redis-cli -h 127.0.0.1 -n 3 flushdb >/dev/null

# --- 2. tenant catalog ---------------------------------------------------------------------------
"$PY" scripts/demo.py prepare

# --- 3. processes --------------------------------------------------------------------------------
start s3 "$ROOT/.venv/bin/moto_server" -H 127.0.0.1 -p "$S3_PORT"
CELERY=("$PY" -m celery -A duckgres_admin)
start worker "${CELERY[@]}" worker -Q duckgres.default -P solo -n demo-default@%h \
  --without-gossip --without-mingle -l INFO
start control "${CELERY[@]}" worker -Q duckgres.control -P solo -n demo-control@%h \
  --without-gossip --without-mingle -l INFO
start beat "${CELERY[@]}" beat -S django_celery_beat.schedulers:DatabaseScheduler \
  --pidfile= -l INFO
start api "$ROOT/.venv/bin/gunicorn" duckgres_admin.wsgi:application -w 1 --threads 8 \
  -b "127.0.0.1:$PORT" --access-logfile - --graceful-timeout 5
wait_for "celery default worker" 60 grep -q ' ready\.' "$LOGS/worker.log"
wait_for "celery control worker" 60 grep -q ' ready\.' "$LOGS/control.log"
wait_for "S3 endpoint (moto)" 30 curl -s -o /dev/null "$DUCKGRES_S3_ENDPOINT_URL"

# --- 4. the reshard ------------------------------------------------------------------------------
"$PY" scripts/demo.py run
