"""A standalone operator process for the two-process tests (not a test module).

    python tests/trino/operator_child.py <config.json>

The JSON holds the Trino settings of the test world (registry text and the fields of
``TrinoSettings`` the operator reads) and the Gateway double's URL and token. The process runs the
real ``Operator`` tick in a loop -- its own ``trino`` lease, owner identity and authority -- and
prints one JSON line per tick: ``{"leader", "pools", "terms": {pool_id: epoch}}``. Plain HTTP to
the Gateway double is allowed here only (the product requires https).
"""

from __future__ import annotations

import json
import os
import sys
import time

import django


def main(path: str) -> None:
    with open(path, encoding="utf-8") as handle:
        spec = json.load(handle)
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "duckgres_admin.settings")
    django.setup()

    from duckgres_admin.lib.gateway import GatewayClient
    from trino_pools import config
    from trino_pools.config import TrinoSettings
    from trino_pools.operator import Operator
    from trino_pools.registry import parse_registry

    fields = dict(spec["settings"])
    fields["cells"] = parse_registry(spec["registry"], "child registry")
    settings = TrinoSettings(**fields)
    config.install_for_tests(settings)
    token = spec["gateway_token"]
    op = Operator(gateway_factory=lambda s: GatewayClient(s.gateway_url, token, allow_http=True))
    interval = float(spec.get("interval", 0.3))
    while True:
        report = op.tick(settings)
        line = {
            "leader": report.leader,
            "pools": report.pools,
            "terms": {pool: term.auth.epoch for pool, term in op.terms.items()},
            "owner": op.lease.holder,
        }
        print(json.dumps(line), flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    main(sys.argv[1])
