"""The cancel cutoff in the admin (issue 29 item 1): the start page's dry-run plan, the restore
page's dry-run plan and the operation detail page each name the operation kind's cutoff
(``Kind.cancel_cutoff``) — a reshard's differs per target, a restore's from both."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest

from reshard import kinds
from reshard.engines.backup import backup_key
from tests.fixtures.backups_listing import op_in_state, put_object
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique
from tests.fixtures.s3 import S3Bucket
from tests.fixtures.start import Setup, cnpg_source

__all__ = ["cnpg_source"]

pytestmark = pytest.mark.django_db

OPS = "/admin/duckgres_admin/reshardoperation/"
_PLAN_ROW = re.compile(r'<tr id="plan-cancel-cutoff"><th>cancel cutoff</th><td>(.*?)</td></tr>')
_SUMMARY_ROW = re.compile(r"<tr><th>cancel cutoff</th><td>(.*?)</td></tr>")


def _cutoff(kind: str, *, target_kind: str = "cnpg", in_place: bool = False) -> str:
    chosen = kinds.RESHARD if kind == "reshard" else kinds.restore_kind(in_place=in_place)
    return chosen.cancel_cutoff(target_kind).description


def _row(pattern: re.Pattern[str], response: Any) -> str:
    assert response.status_code == 200
    rows = pattern.findall(response.content.decode())
    assert len(rows) == 1, rows
    return html.unescape(rows[0])


def _plan(admin_client: Any, setup: Setup, **target: str) -> Any:
    body = {
        "stage": "plan",
        "org_id": setup.org,
        "drain_timeout_seconds": "1800",
        "cutover_timeout_seconds": "0",
        **target,
    }
    return admin_client.post(f"{OPS}start/", body)


def test_the_start_plan_shows_the_reshards_cutoff_per_target(
    admin_client: Any, cnpg_source: Setup, tenant_catalog: Any
) -> None:
    to_cnpg = _plan(
        admin_client, cnpg_source, target_type="cnpg", cnpg_shard=cnpg_source.target_store.name
    )
    assert _row(_PLAN_ROW, to_cnpg) == _cutoff("reshard", target_kind="cnpg")
    assert "until the target login is ready in the cutover" in to_cnpg.content.decode()

    ext = tenant_catalog(cnpg_source.clusters.target, with_tables=False)
    to_external = _plan(
        admin_client,
        cnpg_source,
        target_type="external",
        endpoint=f"{ext.cluster.host}:{ext.cluster.port}",
        user=ext.role,
        database=ext.database,
        password_secret_ref=ext.password_ref,
        password=ext.password,
    )
    assert _row(_PLAN_ROW, to_external) == _cutoff("reshard", target_kind="external")
    assert "cancelled until orphaning_source" in to_external.content.decode()
    assert _cutoff("reshard", target_kind="cnpg") != _cutoff("reshard", target_kind="external")


def test_the_restore_plan_shows_the_restores_cutoff(
    admin_client: Any, cnpg_source: Setup, bucket: S3Bucket
) -> None:
    wh = cnpg_source.warehouse
    type(wh).objects.filter(pk=wh.pk).update(data_bucket=bucket.bucket)
    key = put_object(bucket, backup_key(op_in_state(wh, "succeeded").id))
    page = f"/admin/duckgres_admin/warehouse/{cnpg_source.org}/restore/"

    def plan(store: str) -> Any:
        body = {"stage": "plan", "backup_key": key, "cnpg_shard": store}
        return admin_client.post(page, {**body, "drain_timeout_seconds": "1800"})

    elsewhere = _row(_PLAN_ROW, plan(cnpg_source.target_store.name))
    assert elsewhere == _cutoff("restore")
    assert "a restore onto another store can be cancelled until cleaning_up" in elsewhere
    in_place = _row(_PLAN_ROW, plan(cnpg_source.source_store.name))
    assert in_place == _cutoff("restore", in_place=True)
    assert "a restore in place can be cancelled until cleaning_up" in in_place
    assert elsewhere != _cutoff("reshard", target_kind="cnpg")


def test_the_detail_page_shows_each_kinds_cutoff(viewer_client: Any) -> None:
    store = new_store()
    warehouses = [
        new_warehouse(
            store=store,
            metadata_store_database=(name := unique("cat")),
            metadata_store_user=name,
            metadata_store_password_ref=f"env:DUCKGRES_TEST_PW_{name}",
        )
        for _ in range(4)
    ]
    key = backup_key(1)
    ops = {
        _cutoff("reshard", target_kind="cnpg"): new_op(warehouses[0], to_store=new_store()),
        _cutoff("reshard", target_kind="external"): new_op(
            warehouses[1],
            target_endpoint="127.0.0.1",
            target_port=5434,
            target_user=unique("u"),
            target_database=unique("db"),
            target_password_secret_ref="env:DUCKGRES_TEST_EXTERNAL_PASSWORD",
        ),
        _cutoff("restore"): new_op(
            warehouses[2], to_store=new_store(), kind="restore", restore_backup_key=key
        ),
        _cutoff("restore", in_place=True): new_op(
            warehouses[3], to_store=store, kind="restore", restore_backup_key=key
        ),
    }
    assert len(ops) == 4, "each kind's cutoff is worded differently"
    for expected, op in ops.items():
        assert _row(_SUMMARY_ROW, viewer_client.get(f"{OPS}{op.id}/change/")) == expected
