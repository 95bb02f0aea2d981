"""The installation's tag (safeguard reshard-132; docs/restore.md "Names on a shared store").

Names a restore or a restore test creates on a shared store carry the tag. It used to be a
digest of the config store's host, port and database name, so two installations whose config
stores were both ``postgres:5432/duckgres`` took and swept each other's names. It is now drawn
at random by migration 0021, which an upgraded installation (one with operations already) runs
keeping its old tag for what was named with it.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import re
from typing import Any

import pytest
from django.db import connection
from django.db.migrations.executor import MigrationExecutor
from psycopg import sql

from duckgres_admin.models import Installation, ReshardOperation
from reshard.backups import restore_test
from reshard.engines.restore import stream
from tests.fixtures.backups_listing import warehouse_with_bucket
from tests.fixtures.rows import new_op, new_store
from tests.fixtures.stores import StoreClusters

pytestmark = pytest.mark.safeguard("reshard-132")

BEFORE = [("duckgres_admin", "0020_installation")]


def _address_tag() -> str:
    db = connection.settings_dict
    where = f"{db.get('HOST', '')}:{db.get('PORT', '')}/{db.get('NAME', '')}"
    return hashlib.sha256(where.encode()).hexdigest()[:8]


def _migrate_again() -> Installation:
    """Migration 0021 run again on this database, as on a new or an upgraded installation."""
    executor = MigrationExecutor(connection)
    latest = executor.loader.graph.leaf_nodes("duckgres_admin")
    executor.migrate(BEFORE)
    Installation.objects.all().delete()
    MigrationExecutor(connection).migrate(latest)
    return Installation.objects.get(pk=1)


def test_a_new_installation_draws_a_random_tag_that_its_address_does_not_decide(
    transactional_db: Any,
) -> None:
    tags = {_migrate_again().tag for _ in range(3)}
    assert len(tags) == 3, "the same config-store address, three different installations"
    for tag in tags:
        assert re.fullmatch(r"[0-9a-f]{12}", tag)
        assert tag != _address_tag()
    row = Installation.objects.get(pk=1)
    assert row.previous_tag == ""
    assert stream.installation_tag() == row.tag
    assert restore_test.installation_prefix() == f"duckgres_restore_test_{row.tag}_"


def test_an_upgraded_installation_keeps_its_old_names_for_what_it_made_before(
    transactional_db: Any, store_clusters: StoreClusters
) -> None:
    before = new_op(warehouse_with_bucket("b"), to_store=new_store())
    row = _migrate_again()
    old = _address_tag()
    assert (row.previous_tag, row.tag != old) == (old, True)
    # An in-place restore created before the migration keeps finding its login role.
    ReshardOperation.objects.filter(pk=before.id).update(
        created_at=row.created_at - dt.timedelta(minutes=5)
    )
    before.refresh_from_db()
    assert stream.login_role_name(before) == f"duckgres_restore_{old}_op{before.id}"
    after = new_op(warehouse_with_bucket("b"), to_store=new_store())
    assert stream.login_role_name(after) == f"duckgres_restore_{row.tag}_op{after.id}"
    # The sweep recognises a killed run's scratch database named with the old tag, and only
    # this installation's tags: another installation's (same old address, new tag) is left.
    cluster = store_clusters.target
    ours = f"duckgres_restore_test_{old}_op{before.id}"
    theirs = f"duckgres_restore_test_{'f' * 12}_op{before.id}"
    with cluster.superuser_conn() as conn:
        for name in (ours, theirs):
            conn.execute(sql.SQL("CREATE ROLE {}").format(sql.Identifier(name)))
            conn.execute(  # as a run makes it: the provisioner is a member
                sql.SQL("GRANT {} TO provisioner").format(sql.Identifier(name))
            )
            conn.execute(
                sql.SQL("CREATE DATABASE {} OWNER {}").format(
                    sql.Identifier(name), sql.Identifier(name)
                )
            )
    try:
        store = new_store(cluster)
        swept = restore_test.sweep(store, cluster.provisioner_password)
        assert swept == [ours]
    finally:
        with cluster.superuser_conn() as conn:
            for name in (ours, theirs):
                conn.execute(
                    sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name))
                )
                conn.execute(sql.SQL("DROP ROLE IF EXISTS {}").format(sql.Identifier(name)))
