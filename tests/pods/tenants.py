"""The pods suite's tenant: a catalog on the host's source store cluster and its warehouse,
registered through the deployed API (shared by tests/pods/test_reshard_pods.py and the upgrade
test)."""

from __future__ import annotations

import secrets
from typing import Any

from tests.fixtures.pods import BUCKET, NAMESPACE, TENANT_SECRET, Deployed
from tests.fixtures.stores import TenantCatalog, create_tenant_catalog, drop_tenant


class Tenant:
    """A tenant catalog on the source cluster and its warehouse, registered through the API."""

    def __init__(self, deployed: Deployed, rows: int = 5, tables: int = 0) -> None:
        self.deployed = deployed
        self.org = f"pods-{secrets.token_hex(4)}"
        self.catalog: TenantCatalog = create_tenant_catalog(
            deployed.clusters.source, rows=rows, with_tables=tables == 0
        )
        if tables:
            from psycopg import sql

            from reshard.engines.demo_catalog import build_demo_catalog

            with deployed.clusters.source.superuser_conn(self.catalog.database) as conn:
                conn.execute(sql.SQL("SET ROLE {}").format(sql.Identifier(self.catalog.role)))
                build_demo_catalog(conn, tables=tables)
        deployed.put_secret_key(TENANT_SECRET, self.org, self.catalog.password)
        body = {
            "org_id": self.org,
            "database_name": self.catalog.database,
            "state": "ready",
            "metadata_store_kind": "cnpg",
            "metadata_store_name": "pods-source",
            "metadata_store_database": self.catalog.database,
            "metadata_store_user": self.catalog.role,
            "metadata_store_password_ref": f"k8s:{NAMESPACE}/{TENANT_SECRET}#{self.org}",
            "compaction_enabled": False,
            "data_bucket": BUCKET,
            "data_region": "us-east-1",
        }
        resp = deployed.api.post("warehouses", body)
        assert resp.status == 201, (resp.status, resp.raw[:600])

    def start(self, target: dict[str, Any]) -> int:
        resp = self.deployed.api.start_reshard(self.org, {"target": target})
        assert resp.status == 202, (resp.status, resp.raw[:800])
        assert resp.body["launcher"] == "pod"
        return int(resp.body["id"])

    def to_cnpg_target(self) -> int:
        return self.start({"type": "cnpg", "cnpg_shard": "pods-target"})

    def cleanup(self) -> None:
        for cluster in (self.deployed.clusters.source, self.deployed.clusters.target):
            drop_tenant(cluster, self.catalog.role)


def messages(entries: list[dict[str, Any]]) -> str:
    return "\n".join(f"[{e['source']}/{e['level']}] {e['message']}" for e in entries)
