#!/usr/bin/env bash
# Operator surfaces in CI (issue 6): headless Chromium for the admin browser tests, the OpenAPI
# schema without warnings, and the schemathesis run against the live API.
#
#   .ci/surfaces.sh                 install Chromium if missing, spectacular --fail-on-warn,
#                                   then the schemathesis contract run (tests/api_contract)
#   .ci/surfaces.sh --install-only  only make sure Debian's chromium + chromium-driver exist
#                                   (the browser tests use /usr/bin/chromium through pip
#                                   playwright; `playwright install` is never used)
#
# The contract run first makes sure of the .venv and the services (`make install services`, both
# idempotent). The same contract test is also part of `make test`; a CI that runs the suite
# anyway can call --install-only before `make test` instead.
set -euo pipefail
cd "$(dirname "$0")/.."
export DEBIAN_FRONTEND=noninteractive
PY=.venv/bin/python
log() { printf 'surfaces: %s\n' "$*"; }

if [ ! -x /usr/bin/chromium ] || [ ! -x /usr/bin/chromedriver ]; then
  log "installing Debian chromium + chromium-driver"
  apt-get update -q >/dev/null
  apt-get install -y -q --no-install-recommends chromium chromium-driver >/dev/null
fi
log "chromium: $(/usr/bin/chromium --version 2>/dev/null | head -1)"
[ "${1:-}" = "--install-only" ] && exit 0

make -s install services
log "OpenAPI schema: manage.py spectacular --fail-on-warn"
mkdir -p test-artifacts
$PY scripts/with_test_env.py manage.py spectacular --fail-on-warn --file test-artifacts/openapi.yaml

log "schemathesis against the live API (tests/api_contract)"
$PY -m pytest -q -p no:cacheprovider tests/api_contract
