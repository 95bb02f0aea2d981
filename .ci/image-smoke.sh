#!/usr/bin/env bash
# Smoke tests of the BUILT image (not of the Containerfile's text), run by .ci/run after
# `make image`. Each check runs a command inside the image with `buildah run` (chroot isolation,
# the host's network), as the image's own user:
#
#   1. the process user is uid/gid 10001, and /app is not writable by it
#   2. no compiler, no pip, no build cache in the image; the OCI labels are set
#   3. `manage.py check --deploy --fail-level WARNING` passes with production-like settings
#   4. every shipped pg_dump / pg_restore answers --version; the majors and versions are those
#      the Containerfile's PG_CLIENTS pins; each pg_dump speaks TLS to a real server
#   5. the runner entrypoint refuses a missing op id with its documented exit code (1)
#   6. gunicorn, started as the image starts it, serves /static/admin/css/base.css with 200
#   7. the `duckgres` command-line client answers --version with the client's version
#
#   .ci/image-smoke.sh [IMAGE]      # default localhost/duckgres-admin:<version>
set -euo pipefail
cd "$(dirname "$0")/.."
VERSION=$(sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE=${1:-localhost/duckgres-admin:$VERSION}
STORE_PORT=${SMOKE_STORE_PORT:-5433}  # a TLS PostgreSQL of .ci/services.sh (superuser trusted)
log() { printf 'image-smoke: %s\n' "$*"; }
fail() { printf 'image-smoke: FAIL: %s\n' "$*" >&2; exit 1; }

ctr=$(buildah from --pull=never -q "$IMAGE")
gunicorn_pid=
cleanup() {
  [ -z "$gunicorn_pid" ] || kill "$gunicorn_pid" 2>/dev/null || true
  buildah rm "$ctr" >/dev/null 2>&1 || true
}
trap cleanup EXIT

# Production-like settings: strict hosts and origins, proxy header, secure cookies, HSTS. The
# values are throwaway (this container never reaches a real config store or broker).
ENV_ARGS=(
  --env DJANGO_SECRET_KEY="smoke-$(head -c 64 /dev/urandom | base64 | tr -dc 'a-zA-Z0-9')-key"
  --env DUCKGRES_CONFIG_STORE="postgresql://smoke@127.0.0.1:9/smoke?sslmode=verify-full"
  --env DUCKGRES_BROKER_URL="redis://127.0.0.1:9/0"
  --env DUCKGRES_INTERNAL_SECRET="smoke-internal-$(head -c 24 /dev/urandom | base64 | tr -dc a-z0-9)x00000000000000000000"
  --env DUCKGRES_RUNNER_SECRET="smoke-runner-$(head -c 24 /dev/urandom | base64 | tr -dc a-z0-9)x0000000000000000000000"
  --env DUCKGRES_DATAPLANE_SECRET="smoke-dataplane-$(head -c 24 /dev/urandom | base64 | tr -dc a-z0-9)x0000000000000000000"
  --env DUCKGRES_ALLOWED_HOSTS="admin.example.test,127.0.0.1"
  --env DUCKGRES_CSRF_TRUSTED_ORIGINS="https://admin.example.test"
  --env DUCKGRES_SECURE_PROXY_SSL_HEADER="X-Forwarded-Proto"
  --env DUCKGRES_HSTS_INCLUDE_SUBDOMAINS=true
  --env DUCKGRES_CONTROL_METRICS_PORT=0
)
run() { buildah run --network=host "${ENV_ARGS[@]}" "$ctr" -- "$@"; }
# One field of the image's OCI config, as JSON (Labels, Env) or space-joined (Cmd).
config() {
  buildah inspect --type image "$IMAGE" | python3 -c '
import json, sys
value = json.load(sys.stdin)["OCIv1"]["config"].get(sys.argv[1])
print(" ".join(value) if sys.argv[1] == "Cmd" else json.dumps(value, separators=(",", ":")))' "$1"
}

# 1. user
[ "$(run id -u)" = 10001 ] || fail "the image does not run as uid 10001"
[ "$(run id -g)" = 10001 ] || fail "the image does not run as gid 10001"
run sh -c 'test ! -w /app && test ! -w /opt/venv' || fail "/app or /opt/venv is writable by the process user"
log "user 10001:10001, /app and /opt/venv read-only to it"

# 2. nothing of the build in the image
run sh -c 'for t in gcc cc make pip pip3; do command -v "$t" && exit 1; done; test ! -e /opt/venv/bin/pip; test ! -d /root/.cache; exit 0' \
  >/dev/null || fail "a compiler, pip or a build cache is in the image"
labels=$(config Labels)
for key in version revision source base.name base.digest; do
  grep -q "\"org.opencontainers.image.$key\"" <<<"$labels" || fail "OCI label $key is missing"
done
grep -q "\"org.opencontainers.image.version\":\"$VERSION\"" <<<"$labels" || fail "version label is not $VERSION"
grep -q "\"duckgres.base-lock\":\"$(sha256sum .ci/base-packages.lock | cut -c1-16)\"" <<<"$labels" \
  || fail "the base-lock label is not the hash of .ci/base-packages.lock (a base built from another lock)"
if config Env | grep -qiE 'SECRET|PASSWORD|PIP_CERT|CONFIG_STORE'; then
  fail "the image's environment names a secret-bearing variable"
fi
log "no compiler, pip or cache; labels $labels"

# 2b. what every process imports really is in the image (the broker transport included: the
#     dev venv can hide an undeclared dependency)
run python -c 'import duckgres_admin.celery, kombu.transport.redis, gunicorn.workers.gthread, whitenoise' \
  || fail "a module a process imports is missing from the image"
log "the Celery broker transport, gunicorn's worker and WhiteNoise import"

# 3. deploy checks
out=$(run python manage.py check --deploy --fail-level WARNING 2>&1) || { echo "$out"; fail "check --deploy"; }
log "manage.py check --deploy: $(tail -1 <<<"$out")"

# 7. the command-line client (its own distribution under cli/, docs/cli.md)
cli_version=$(sed -n 's/^__version__ = "\(.*\)"/\1/p' cli/duckgres_cli/version.py)
out=$(run duckgres --version 2>&1) || { echo "$out"; fail "duckgres --version"; }
[ "$out" = "duckgres $cli_version" ] || fail "duckgres --version said '$out', not 'duckgres $cli_version'"
log "command-line client: $out"

# 4. PostgreSQL clients
pins=$(sed -n 's/^ARG PG_CLIENTS="\(.*\)"/\1/p' Containerfile)
want=$(tr ' ' '\n' <<<"$pins" | cut -d= -f1 | sort -n | xargs)
have=()
for dir in $(run sh -c 'ls -d /usr/lib/postgresql/*/bin'); do
  dump=$(run "$dir/pg_dump" --version) || fail "$dir/pg_dump --version"
  restore=$(run "$dir/pg_restore" --version) || fail "$dir/pg_restore --version"
  major=$(sed -n 's/.*(PostgreSQL) \([0-9]*\).*/\1/p' <<<"$dump")
  [ "$(sed -n 's/.*(PostgreSQL) \([0-9]*\).*/\1/p' <<<"$restore")" = "$major" ] \
    || fail "$dir: pg_restore is not of major $major"
  if pg_isready -q -h 127.0.0.1 -p "$STORE_PORT"; then
    # TLS: the runner's stores default to sslmode=require; a client without TLS is useless.
    run env PGSSLMODE=require "$dir/pg_dump" -h 127.0.0.1 -p "$STORE_PORT" -U postgres \
      -d postgres --schema-only -f /dev/null || fail "$dir/pg_dump cannot dump over TLS"
  elif [ "${CI:-}" = true ]; then
    fail "no PostgreSQL on 127.0.0.1:$STORE_PORT for the TLS check (start .ci/services.sh)"
  fi
  # The pinned Debian source version, and its upstream release, are what was built.
  pin=$(tr ' ' '\n' <<<"$pins" | sed -n "s/^$major=//p")
  built=$(run cat "${dir%/bin}/DEBIAN_SOURCE_VERSION") || fail "${dir%/bin}: no DEBIAN_SOURCE_VERSION"
  [ "$built" = "$pin" ] || fail "pg client $major was built from $built, the Containerfile pins $pin"
  upstream=${pin%%-*}; upstream=${upstream#*:}
  grep -q "(PostgreSQL) $upstream\b" <<<"$dump" || fail "$dump is not the pinned $upstream"
  have+=("$major")
  log "$dump / $restore (Debian source $built)"
done
[ "$(printf '%s\n' "${have[@]}" | sort -n | xargs)" = "$want" ] \
  || fail "pg client majors are '${have[*]}', the Containerfile names '$want'"

# 5. runner exit code without an op id (docs/runner.md "Exit codes": 1)
set +e
buildah run --env DJANGO_SECRET_KEY=x --env DUCKGRES_CONFIG_STORE="postgresql://smoke@127.0.0.1:9/smoke" \
  "$ctr" -- python manage.py reshard_runner >/dev/null 2>&1
rc=$?
set -e
[ "$rc" = 1 ] || fail "reshard_runner without DUCKGRES_RESHARD_OP_ID exited $rc, documented 1"
log "reshard_runner without an op id exits 1"

# 6. gunicorn as shipped (the image's CMD) serves the admin's static files
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
cmd=$(config Cmd)
# shellcheck disable=SC2086
buildah run --network=host "${ENV_ARGS[@]}" --env DUCKGRES_HTTP_BIND="127.0.0.1:$port" "$ctr" -- $cmd \
  >var/image-smoke-gunicorn.log 2>&1 &
gunicorn_pid=$!
code=000
for _ in $(seq 100); do
  code=$(curl -s -o /dev/null -w '%{http_code}' -H 'Host: 127.0.0.1' \
    "http://127.0.0.1:$port/static/admin/css/base.css" || true)
  [ "$code" = 200 ] && break
  sleep 0.3
done
[ "$code" = 200 ] || { tail -20 var/image-smoke-gunicorn.log; fail "GET /static/admin/css/base.css answered $code"; }
type=$(curl -s -o /dev/null -w '%{content_type}' -H 'Host: 127.0.0.1' "http://127.0.0.1:$port/static/admin/css/base.css")
[[ "$type" == text/css* ]] || fail "base.css served as '$type'"
kill "$gunicorn_pid" 2>/dev/null || true
wait "$gunicorn_pid" 2>/dev/null || true
gunicorn_pid=
log "gunicorn ($cmd) serves /static/admin/css/base.css: 200 $type"
log "passed: $IMAGE"
