"""Builders for Trino registry documents and environments used across tests/trino."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

TOKEN = "gateway-admin-token-" + "t" * 40
DSN = "postgresql://publisher:pw-never-logged-1234@127.0.0.1:5432/catalogs?sslmode=prefer"


def cell(cell_id: str = "pool-a", **overrides: Any) -> dict[str, Any]:
    doc: dict[str, Any] = {
        "id": cell_id,
        "mode": "shared-pool",
        "namespace": f"trino-{cell_id}",
        "routing_group": f"rg-{cell_id}",
        "client_url": f"https://{cell_id}.trino.example.com",
        "pool": {
            "desired_instances": 3,
            "min_serving": 2,
            "max_surge": 1,
            "max_repair": 1,
            "blueprint_file": f"/etc/duckgres/blueprints/{cell_id}.json",
            "coordinator_service_port": 8080,
            "node_environment": "production",
            "tenant_admission": True,
        },
    }
    for key, value in overrides.items():
        if value is None:
            doc.pop(key, None)
        else:
            doc[key] = value
    return doc


def with_pool(base: dict[str, Any], **pool: Any) -> dict[str, Any]:
    doc = copy.deepcopy(base)
    for key, value in pool.items():
        if value is None:
            doc["pool"].pop(key, None)
        else:
            doc["pool"][key] = value
    return doc


def registry(*cells: dict[str, Any]) -> str:
    return json.dumps({"cells": list(cells)})


def write(tmp: Path, name: str, content: str) -> str:
    path = tmp / name
    path.write_text(content, encoding="utf-8")
    return str(path)


def full_env(tmp: Path, **overrides: str | None) -> dict[str, str]:
    """A complete, valid operator-enabled environment with one pool (``pool-a``)."""
    env = {
        "DUCKGRES_TRINO_CELLS_FILE": write(tmp, "cells.json", registry(cell())),
        "DUCKGRES_TRINO_DEFAULT_CELL": "pool-a",
        "DUCKGRES_TRINO_POOL_ENABLED": "true",
        "DUCKGRES_TRINO_POOL_OPERATOR_ENABLED": "true",
        "DUCKGRES_TRINO_POOL_CATALOG_WRITER_ENABLED": "true",
        "DUCKGRES_TRINO_POOL_CATALOG_DSN_FILE": write(tmp, "dsn", DSN + "\n"),
        "DUCKGRES_TRINO_POOL_CATALOG_SCHEMA": "trino_catalogs",
        "DUCKGRES_TRINO_POOL_GATEWAY_URL": "https://gateway.example.com",
        "DUCKGRES_TRINO_ROLLOUT_TOKEN_FILE": write(tmp, "token", TOKEN + "\n"),
        "DUCKGRES_TRINO_POOL_CONFIG_CONFIGMAP": "duckgres-trino-pool",
        "DUCKGRES_KUBE_API_URL": "https://127.0.0.1:16443",
    }
    for key, value in overrides.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env
