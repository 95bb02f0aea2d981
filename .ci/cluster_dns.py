#!/usr/bin/env python3
"""The one-node cluster's DNS (.ci/kube-node.sh; docs/testing.md "The one-node cluster").

There is no CoreDNS image on our machines (no registry), so the node runs this instead, on the
pods' bridge address, and the kubelet names it as the cluster DNS. Standard library only.

Answers, over UDP, the names a cluster's DNS gives pods (cluster domain ``cluster.local``):

- ``<service>.<namespace>.svc.cluster.local``: the Service's cluster IP; for a headless Service,
  the addresses of its ready endpoints;
- ``<hostname>.<subdomain>.<namespace>.svc.cluster.local``: the pod with that hostname and
  subdomain (a StatefulSet's pods behind their governing Service);
- any other name under ``cluster.local``: NXDOMAIN; a record type other than A for a cluster
  name: no answer (NODATA), so resolvers do not wait for an AAAA;
- every other query is relayed unchanged to the host's own resolver.

Cluster state comes from ``kubectl get … -o json`` with the admin kubeconfig, cached for two
seconds. Each query and its answer are logged (one line), so a test that fails on a name shows
what was asked.

    cluster_dns.py --listen 10.244.0.1 --kubeconfig $NODE_DIR/admin.kubeconfig
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import socket
import struct
import subprocess
import sys
import time
from typing import Any

DOMAIN = "cluster.local"
TTL = 5


class Cluster:
    def __init__(self, kubeconfig: str) -> None:
        self.kubeconfig = kubeconfig
        self.fetched = 0.0
        self.services: list[dict[str, Any]] = []
        self.endpoints: list[dict[str, Any]] = []
        self.pods: list[dict[str, Any]] = []

    def _get(self, kind: str) -> list[dict[str, Any]]:
        out = subprocess.run(
            ["kubectl", "--kubeconfig", self.kubeconfig, "get", kind, "-A", "-o", "json"],
            capture_output=True, text=True, timeout=10, check=True,
        ).stdout  # fmt: skip
        return list(json.loads(out)["items"])

    def refresh(self) -> None:
        if time.monotonic() - self.fetched < 2:
            return
        self.services = self._get("services")
        self.endpoints = self._get("endpoints")
        self.pods = self._get("pods")
        self.fetched = time.monotonic()

    def resolve(self, labels: list[str]) -> list[str] | None:
        """The addresses of a cluster name (labels before ``svc.cluster.local``), or None."""
        self.refresh()
        if len(labels) == 2:
            name, namespace = labels
            for svc in self.services:
                meta = svc["metadata"]
                if (meta["name"], meta["namespace"]) != (name, namespace):
                    continue
                ip = svc["spec"].get("clusterIP")
                if ip and ip != "None":
                    return [ip]
                return self._endpoint_ips(name, namespace)
        if len(labels) == 3:
            hostname, subdomain, namespace = labels
            for pod in self.pods:
                spec, status = pod["spec"], pod.get("status", {})
                if (
                    pod["metadata"]["namespace"] == namespace
                    and spec.get("hostname") == hostname
                    and spec.get("subdomain") == subdomain
                    and status.get("podIP")
                ):
                    return [status["podIP"]]
        return None

    def _endpoint_ips(self, name: str, namespace: str) -> list[str]:
        for ep in self.endpoints:
            meta = ep["metadata"]
            if (meta["name"], meta["namespace"]) == (name, namespace):
                return [a["ip"] for s in ep.get("subsets") or [] for a in s.get("addresses", [])]
        return []


def _question(packet: bytes) -> tuple[list[str], int, int]:
    """The first question's labels, type and the offset after it."""
    labels: list[str] = []
    offset = 12
    while packet[offset]:
        length = packet[offset]
        labels.append(packet[offset + 1 : offset + 1 + length].decode("ascii", "replace").lower())
        offset += 1 + length
    qtype = struct.unpack("!H", packet[offset + 1 : offset + 3])[0]
    return labels, qtype, offset + 5


def _reply(packet: bytes, end: int, rcode: int, addresses: list[str]) -> bytes:
    flags = 0x8180 | rcode  # response, recursion desired and available
    header = packet[:2] + struct.pack("!HHHHH", flags, 1, len(addresses), 0, 0)
    answers = b"".join(
        struct.pack("!HHHIH", 0xC00C, 1, 1, TTL, 4) + ipaddress.IPv4Address(a).packed
        for a in addresses
    )
    return header + packet[12:end] + answers


def _upstream() -> str:
    with open("/etc/resolv.conf") as handle:
        for line in handle:
            parts = line.split()
            if len(parts) >= 2 and parts[0] == "nameserver":
                return parts[1]
    return "127.0.0.53"


def serve(listen: str, cluster: Cluster) -> None:
    server = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    server.bind((listen, 53))
    upstream = _upstream()
    print(
        f"cluster-dns: serving {DOMAIN} on {listen}:53, relaying the rest to {upstream}", flush=True
    )
    while True:
        packet, client = server.recvfrom(4096)
        try:
            labels, qtype, end = _question(packet)
        except (IndexError, struct.error):
            continue
        name = ".".join(labels)
        if labels[-2:] != DOMAIN.split("."):
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as relay:
                relay.settimeout(3)
                try:
                    relay.sendto(packet, (upstream, 53))
                    server.sendto(relay.recvfrom(4096)[0], client)
                except OSError as exc:
                    print(f"cluster-dns: {name}: upstream {upstream}: {exc}", flush=True)
            continue
        found = None
        if labels[-3:-2] == ["svc"]:
            try:
                found = cluster.resolve(labels[:-3])
            except (subprocess.SubprocessError, ValueError, KeyError) as exc:
                print(f"cluster-dns: {name}: cannot read the cluster: {exc}", flush=True)
        if found is None:
            server.sendto(_reply(packet, end, 3, []), client)
            print(f"cluster-dns: {name} type {qtype}: NXDOMAIN", flush=True)
            continue
        addresses = found if qtype == 1 else []
        server.sendto(_reply(packet, end, 0, addresses), client)
        print(f"cluster-dns: {name} type {qtype}: {addresses or 'no data'}", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--listen", required=True)
    parser.add_argument("--kubeconfig", required=True)
    args = parser.parse_args()
    serve(args.listen, Cluster(args.kubeconfig))
    return 0


if __name__ == "__main__":
    sys.exit(main())
