"""End to end through the real trino worker (spec trino-pools §4.1 step 7, §4.3, §4.4, §4.10).

A real Celery worker consuming only ``duckgres.trino`` (solo), configured purely by environment
variables as in production: the Gateway double over HTTPS (its CA trusted through
``SSL_CERT_FILE``, the server name pinned), the real catalog store (bootstrapped by the worker at
start), the real kube-apiserver holding the pool's ConfigMap. The test process is the API:

1. ``trino.pool_tick`` runs in the worker: the pool row is seeded, the authority taken (epoch 1),
   the catalog writer claimed and the Gateway pool configured at that epoch.
2. ``POST /api/v1/warehouses/<org>/trino`` enables Trino; after commit the API queues
   ``trino.reconcile_org(<org>)`` (org id only), the worker publishes the org's catalog with the
   writer it holds and the Trino row becomes ``ready`` (the pool has no tenant admission).
"""

from __future__ import annotations

import json
import ssl
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from django.contrib.auth import get_user_model
from rest_framework.test import APIClient

from duckgres_admin.models import Operator
from duckgres_admin.models.trino import TrinoPool, WarehouseTrino
from tests.fixtures.processes import start_celery_worker, stop_celery_worker
from tests.fixtures.trino import CatalogStore, bound_warehouse
from tests.trino import blueprints, helpers
from tests.trino.gateway_double import GatewayDouble
from trino_pools import config
from trino_pools.tasks import pool_tick_task

pytestmark = [pytest.mark.kube, pytest.mark.e2e, pytest.mark.django_db(transaction=True)]

SERVER_NAME = "gateway.test"
PREFIX = "duckgres-trino-pool"


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def tls_pair(tmp: Path) -> tuple[Path, ssl.SSLContext]:
    ca_key, ca = tmp / "ca.key", tmp / "ca.pem"
    key, csr, cert, ext = tmp / "srv.key", tmp / "srv.csr", tmp / "srv.pem", tmp / "ext.cnf"
    ext.write_text(f"subjectAltName=DNS:{SERVER_NAME}\n")
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(ca_key),
             "-out", str(ca), "-days", "1", "-subj", "/CN=e2e-test-ca")  # fmt: skip
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(csr),
             "-subj", f"/CN={SERVER_NAME}")  # fmt: skip
    _openssl("x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key),
             "-CAcreateserial", "-out", str(cert), "-days", "1", "-extfile", str(ext))  # fmt: skip
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(str(cert), str(key))
    return ca, ctx


def wait_for(predicate: Callable[[], bool], what: str, log: Callable[[], str]) -> None:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.3)
    raise AssertionError(f"timed out waiting for {what}; worker log:\n{log()[-6000:]}")


def admin_client() -> APIClient:
    email = "trino-admin@example.com"
    user = get_user_model().objects.create_user(
        username=email, email=email, password=None, is_staff=True
    )
    Operator.objects.create(email=email, role="admin")
    client = APIClient()
    client.force_login(user)
    return client


def test_trino_worker_ticks_and_publishes_an_enabled_org(
    kube_api: Any,
    catalog_store: CatalogStore,
    make_warehouse: Any,
    tmp_path: Path,
    trino_settings_reset: None,
    trino_lease_row: None,
) -> None:
    ca, server_ctx = tls_pair(tmp_path)
    gateway = GatewayDouble().start(tls=server_ctx)
    worker = None
    try:
        ns = kube_api.namespace
        doc = helpers.cell("pool-a", namespace=ns, routing_group="rg-e2e")
        doc["pool"].update(desired_instances=1, min_serving=1, tenant_admission=False)
        registry = helpers.registry(doc)
        cells_file = helpers.write(tmp_path, "cells.json", registry)
        blueprints.put_config_map(
            kube_api.core,
            ns,
            f"{PREFIX}-pool-a",
            {"cells.json": registry, "pool-a.json": blueprints.blueprint_text(namespace=ns)},
        )
        env = {
            "DUCKGRES_TRINO_CELLS_FILE": cells_file,
            "DUCKGRES_TRINO_DEFAULT_CELL": "",
            "DUCKGRES_TRINO_POOL_ENABLED": "true",
            "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED": "true",
            "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED": "true",
            "DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE": helpers.write(
                tmp_path, "dsn", catalog_store.dsn + "\n"
            ),
            "DUCKGRES_TRINO_POOL_CATALOG_SCHEMA": catalog_store.schema,
            "DUCKGRES_TRINO_POOL_CATALOG_BOOTSTRAP": "true",
            "DUCKGRES_TRINO_POOL_GATEWAY_URL": gateway.url,
            "DUCKGRES_TRINO_MANAGED_GATEWAY_SERVER_NAME": SERVER_NAME,
            "DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE": helpers.write(
                tmp_path, "token", gateway.token + "\n"
            ),
            "DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP": PREFIX,
            "DUCKGRES_TRINO_POOL_CONFIG_NAMESPACE": ns,
            "DUCKGRES_TRINO_METRICS_PORT": "0",
            "SSL_CERT_FILE": str(ca),
            "POD_NAME": "trino-worker-e2e",
            "PYTHONWARNINGS": "ignore",
            **kube_api.env(),
        }
        # This process is the API: the same Trino configuration, validated the same way.
        config.install_for_tests(config.load(env, service_account_token="/nonexistent"))
        worker = start_celery_worker(tmp_path, queues=("duckgres.trino",), extra_env=env)

        # 1. One pool tick in the worker: seed, authority, writer claim, Gateway configuration.
        pool_tick_task.delay()
        wait_for(
            lambda: (
                TrinoPool.objects.filter(pool_id="registered:pool-a", authority_epoch=1)
                .exclude(desired_release_id="")
                .exists()
            ),
            "the pool row to be seeded and acquired by the worker",
            worker.log_text,
        )
        pool = TrinoPool.objects.get(pool_id="registered:pool-a")
        assert pool.authority_owner.startswith("trino-worker-e2e.")
        wait_for(
            lambda: (gateway.pool("rg-e2e") or {}).get("epoch") == 1,
            "the Gateway pool to be configured at epoch 1",
            worker.log_text,
        )
        assert gateway.pool("rg-e2e")["owner"] == pool.authority_owner  # type: ignore[index]
        # The worker bootstrapped the catalog store and claimed the writer row at epoch 1.
        with psycopg.connect(catalog_store.dsn) as conn:
            writer = conn.execute(
                f"SELECT writer_epoch, writer_identity FROM {catalog_store.schema}."
                "trino_catalog_writer_state WHERE pool_key = 'registered:pool-a'"
            ).fetchone()
        assert writer == (1, pool.authority_owner)

        # 2. The API enables Trino; the worker reconciles the org and publishes its catalog.
        warehouse = bound_warehouse(make_warehouse, "acme_wh")
        WarehouseTrino.objects.create(
            warehouse=warehouse, trino_cell_id="registered:pool-a", enabled=False
        )
        response = admin_client().post(
            f"/api/v1/warehouses/{warehouse.org_id}/trino",
            data=json.dumps({"enabled": True}),
            content_type="application/json",
        )
        assert response.status_code == 202, response.content
        wait_for(
            lambda: WarehouseTrino.objects.get(warehouse=warehouse).state == "ready",
            "the org's Trino row to become ready",
            worker.log_text,
        )
        row = WarehouseTrino.objects.get(warehouse=warehouse)
        assert row.catalog_name
        with psycopg.connect(catalog_store.dsn) as conn:
            names = [
                r[0]
                for r in conn.execute(
                    f"SELECT catalog_name FROM {catalog_store.schema}.trino_catalogs "
                    "WHERE pool_key = 'registered:pool-a'"
                ).fetchall()
            ]
        assert names == [row.catalog_name] == ["org_acme_wh"]
        assert gateway.token not in worker.log_text()
    finally:
        if worker is not None:
            stop_celery_worker(worker)
        gateway.stop()
