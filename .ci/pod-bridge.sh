#!/usr/bin/env bash
# The pod network's bridge `cni0` with the node's address 10.244.0.1/24, created before the
# services start so that PostgreSQL and Redis can listen on it for the pods of the one-node
# cluster (.ci/kube-node.sh; the CNI bridge plugin adopts the existing bridge). Idempotent.
# Only this machine's own pods (network namespaces made by the CNI plugin) are on this bridge.
set -euo pipefail
BRIDGE=${POD_BRIDGE:-cni0}
ADDR=${POD_BRIDGE_ADDR:-10.244.0.1/24}
ip link show "$BRIDGE" >/dev/null 2>&1 || ip link add "$BRIDGE" type bridge
ip -4 addr show dev "$BRIDGE" | grep -q "inet $ADDR " || ip addr add "$ADDR" dev "$BRIDGE"
ip link set "$BRIDGE" up
