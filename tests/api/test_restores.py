"""``POST /warehouses/<org>/restores`` at the API's edge (docs/restore.md, docs/api.md): who may
call it, the body's shape, the refusals that create nothing, and the audit of a dry run. The
restore itself, against real runner processes and stores, is in
tests/reshard/test_restore_operation.py.
"""

from __future__ import annotations

import re

import pytest

from duckgres_admin.models import AuditRecord, ReshardOperation
from reshard.engines.backup import backup_key
from tests.fixtures.api import error
from tests.fixtures.backups_listing import op_in_state, put_object, warehouse_with_bucket
from tests.fixtures.rows import new_op, new_store
from tests.fixtures.s3 import S3Bucket

pytestmark = pytest.mark.django_db


def _url(org: str) -> str:
    return f"/api/v1/warehouses/{org}/restores"


@pytest.mark.safeguard("reshard-103")
def test_the_shape_the_identity_and_the_refusals(clients, bucket: S3Bucket) -> None:
    wh = warehouse_with_bucket(bucket.bucket)
    made = op_in_state(wh, "succeeded")
    key = put_object(bucket, backup_key(made.id))
    other_store = new_store()
    body = {"backup_key": key, "target": {"type": "cnpg", "cnpg_shard": other_store.name}}

    assert clients.viewer.post(_url(wh.org_id), body, format="json").status_code == 403
    assert clients.dataplane.post(_url(wh.org_id), body, format="json").status_code in (401, 403)
    missing = clients.internal.post(_url(wh.org_id), {"target": body["target"]}, format="json")
    assert (missing.status_code, error(missing)) == (400, "invalid body: backup_key: required")
    unknown = clients.internal.post(_url(wh.org_id), {**body, "bogus": 1}, format="json")
    assert (unknown.status_code, error(unknown)) == (400, "invalid body: bogus: unknown field")
    external = clients.internal.post(
        _url(wh.org_id), {**body, "target": {"type": "external", "endpoint": "h"}}, format="json"
    )
    assert external.status_code == 400
    assert error(external).startswith("target.type: a restore's target is a cnpg metadata store")
    same = clients.internal.post(
        _url(wh.org_id),
        {**body, "target": {"type": "cnpg", "cnpg_shard": wh.metadata_store_id}, "dry_run": True},
        format="json",
    )
    assert same.status_code == 200, "its own store: an in-place restore's plan"
    assert same.json()["restore"]["in_place"] is True
    assert re.fullmatch(
        rf"{wh.metadata_store_database}_restored_[0-9a-f]{{8}}", same.json()["target"]["database"]
    )
    foreign = clients.internal.post(
        _url(wh.org_id), {**body, "backup_key": backup_key(99_999_999)}, format="json"
    )
    assert foreign.status_code == 404
    assert "is not a recorded backup of this warehouse" in error(foreign)
    assert clients.internal.post(_url("no-such-org"), body, format="json").status_code == 404
    assert not ReshardOperation.objects.filter(kind="restore").exists()


def test_a_dry_run_is_audited_as_one_even_when_refused(clients, bucket: S3Bucket) -> None:
    wh = warehouse_with_bucket(bucket.bucket)
    body = {
        "backup_key": backup_key(99_999_998),
        "target": {"type": "cnpg", "cnpg_shard": new_store().name},
        "dry_run": True,
    }
    refused = clients.admin.post(_url(wh.org_id), body, format="json")
    assert refused.status_code == 200, "a dry run reports the backup row like every other check"
    rows = {row["check"]: row for row in refused.json()["preflight"]}
    assert not rows["restore_backup"]["ok"]
    assert "is not a recorded backup of this warehouse" in rows["restore_backup"]["detail"]
    assert "(start would answer 404)" in rows["restore_backup"]["detail"]
    assert rows["restore_target"]["ok"], rows["restore_target"]
    assert list(rows)[:3] == ["restore_target", "restore_backup", "warehouse_ready"]
    assert refused.json()["restore"]["uri"] is None
    started = clients.admin.post(_url(wh.org_id), {**body, "dry_run": False}, format="json")
    assert started.status_code == 404
    actions = list(
        AuditRecord.objects.filter(org_id=wh.org_id).order_by("id").values_list("action", flat=True)
    )
    assert actions == ["restore.dry_run", "restore.create"]


def test_an_unknown_field_is_named_before_a_missing_backup_key(clients, bucket: S3Bucket) -> None:
    """A misspelt ``backup_kee`` is answered as a reshard start answers an unknown field, on the
    start and on its dry run, not as a missing ``backup_key``."""
    wh = warehouse_with_bucket(bucket.bucket)
    target = {"type": "cnpg", "cnpg_shard": new_store().name}
    key = backup_key(op_in_state(wh, "succeeded").id)
    for extra in ({}, {"dry_run": True}):
        body = {"backup_kee": key, "target": target, **extra}
        answer = clients.internal.post(_url(wh.org_id), body, format="json")
        assert (answer.status_code, error(answer)) == (
            400,
            "invalid body: backup_kee: unknown field",
        ), extra
    reshard = clients.internal.post(
        f"/api/v1/warehouses/{wh.org_id}/reshards", {"backup_kee": key, "target": target},
        format="json",
    )  # fmt: skip
    assert error(reshard) == "invalid body: backup_kee: unknown field", "the same message form"
    assert not ReshardOperation.objects.filter(kind="restore").exists()


@pytest.mark.safeguard("reshard-114")
def test_the_reads_say_which_kind_an_operation_is(clients, bucket: S3Bucket) -> None:
    """``kind`` and ``in_place`` on GET /reshards and /reshards/<id>: an in-place restore
    (``S -> S``) is told from a reshard and from a restore onto another store."""
    key = "_reshard_catalog_backups/op-1-20260101T000000Z.dump"
    wh = warehouse_with_bucket(bucket.bucket)
    here = wh.metadata_store
    reshard = new_op(wh, to_store=new_store(), state="succeeded")
    elsewhere = new_op(
        wh, to_store=new_store(), state="failed", kind="restore", restore_backup_key=key
    )
    in_place = new_op(
        wh, to_store=here, state="cancelled", kind="restore", restore_backup_key=key,
        target_database=f"{wh.metadata_store_database}_restored_0123abcd",
    )  # fmt: skip
    listed = clients.viewer.get("/api/v1/reshards", {"org": wh.org_id}).json()["operations"]
    assert [(o["id"], o["kind"], o["in_place"]) for o in listed] == [
        (in_place.id, "restore", True),
        (elsewhere.id, "restore", False),
        (reshard.id, "reshard", False),
    ]
    assert (listed[0]["from_shard"], listed[0]["to_shard"]) == (here.name, here.name)
    shown = clients.viewer.get(f"/api/v1/reshards/{in_place.id}").json()
    assert (shown["kind"], shown["in_place"]) == ("restore", True)
