#!/usr/bin/env bash
# promtool for the monitoring tests (tests/monitoring, k8s/monitoring): installs Debian's
# `prometheus` package (which ships /usr/bin/promtool) with --no-install-recommends, only when
# promtool is missing. Idempotent: returns at once when /usr/bin/promtool exists.
#
# The package's daemon is never started: when the machine has no /usr/sbin/policy-rc.d, a
# temporary one (exit 101 = "do not start services") is installed for the duration of the
# apt-get run and removed afterwards. Run as root (Debian 12), like .ci/services.sh.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
PROMTOOL=/usr/bin/promtool
log() { printf 'promtool: %s\n' "$*"; }

if [ -x "$PROMTOOL" ]; then
  log "$("$PROMTOOL" --version 2>&1 | head -1)"
  exit 0
fi

policy=/usr/sbin/policy-rc.d
temporary_policy=
if [ ! -e "$policy" ]; then
  printf '#!/bin/sh\nexit 101\n' >"$policy"
  chmod 0755 "$policy"
  temporary_policy=$policy
fi
cleanup() { if [ -n "$temporary_policy" ]; then rm -f "$temporary_policy"; fi; }
trap cleanup EXIT

log "installing Debian prometheus (for promtool)"
# Wait for a concurrent apt/dpkg run (another installer script) instead of failing.
apt-get -o DPkg::Lock::Timeout=600 update -q >/dev/null
apt-get -o DPkg::Lock::Timeout=600 install -y -q --no-install-recommends prometheus >/dev/null
if [ ! -x "$PROMTOOL" ]; then
  log "the prometheus package did not install $PROMTOOL" >&2
  exit 1
fi
log "$("$PROMTOOL" --version 2>&1 | head -1)"
