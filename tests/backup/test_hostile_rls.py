"""A tenant's planted row-security policy cannot escalate during the backup (safeguard
reshard-60).

The backup reads the source twice: the product's fact read (``lib.pgadmin``: pinned
``search_path``/``row_security``) and ``pg_dump`` with ``--role=<tenant>`` on a cnpg source
(``pg_dump`` pins both itself). A ``FORCE ROW LEVEL SECURITY`` policy on a ``ducklake_*`` table
calling a ``SECURITY INVOKER`` function that runs ``RESET ROLE`` and ``CREATE ROLE`` makes the
dump fail; the function never runs and the role never exists.
"""

from __future__ import annotations

import secrets
from typing import Any

import pytest

from reshard.engines.backup import BackupDestination, BackupError, run_backup
from reshard.engines.clients import BackupSource
from tests.fixtures.backup import MotoS3, assert_nothing_left
from tests.fixtures.hooks import RecordingHooks
from tests.fixtures.hostile import evil_calls, plant_policy, role_exists
from tests.fixtures.stores import StoreClusters

pytestmark = pytest.mark.safeguard("reshard-60")


def test_a_planted_row_security_policy_never_runs_in_the_backup(
    moto_s3: MotoS3, hooks: RecordingHooks, tenant_catalog: Any, store_clusters: StoreClusters
) -> None:
    catalog = tenant_catalog(rows=3)
    backdoor = f"backdoor_{secrets.token_hex(4)}"
    plant_policy(catalog.cluster, catalog.database, catalog.role, backdoor)
    cluster = catalog.cluster
    # As the runner dumps a (fenced) cnpg source: the provisioner with --role=<tenant>.
    source = BackupSource(
        host=cluster.host, port=cluster.port, database=catalog.database,
        user=cluster.provisioner_user, sslmode=cluster.sslmode,
        password=cluster.provisioner_password, role=catalog.role,
    )  # fmt: skip
    with pytest.raises(BackupError, match="row-level security"):
        run_backup(64, source, BackupDestination(moto_s3.bucket), hooks)
    assert evil_calls(cluster, catalog.database) == (False, False)
    for each in store_clusters:
        assert not role_exists(each, backdoor)
    assert_nothing_left(moto_s3, hooks)
