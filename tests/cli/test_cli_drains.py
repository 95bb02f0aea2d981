"""``duckgres store`` against the live API: a drain's creation, list, show (progress and the
per-org table), pause/resume/cancel (a cancel prints which active reshards it asked to stop and
which were past their point of no return), the API's refusals as exit 1 with its message, usage
as exit 2, and ``--output json`` (docs/cli.md "Store drains")."""

from __future__ import annotations

import json

import pytest

from duckgres_admin.models import (
    ItemState,
    MetadataStore,
    ReshardOperation,
    StoreDrain,
    StoreDrainItem,
    Warehouse,
)
from tests.fixtures.cli import Cli
from tests.fixtures.rows import new_op, new_store, new_warehouse, unique


def bound(store: MetadataStore, count: int) -> list[Warehouse]:
    """``count`` warehouses bound to ``store``, each with its own catalog identity, in the
    order of their org ids (a drain's items are)."""
    names = [unique("cat") for _ in range(count)]
    warehouses = [
        new_warehouse(
            store=store,
            metadata_store_database=name,
            metadata_store_user=name,
            metadata_store_password_ref=f"env:DUCKGRES_TEST_PW_{name.replace('-', '_')}",
        )
        for name in names
    ]
    return sorted(warehouses, key=lambda wh: wh.org_id)


def test_drain_list_and_show_print_the_plan_and_each_orgs_progress(
    cli: Cli,
    transactional_db: None,
) -> None:
    source, first, second = new_store(), new_store(), new_store()
    warehouses = bound(source, 3)
    targets = f"{first.name}, {second.name}"

    started = cli(
        "store", "drain", source.name, "--to", first.name, "--to", second.name,
        "--max-concurrent", "2", "--drain-timeout", "600",
    )  # fmt: skip
    assert started.returncode == 0, started.stderr
    drain = StoreDrain.objects.get(store=source)
    assert (drain.target_stores, drain.max_concurrent, drain.drain_timeout_seconds) == (
        [first.name, second.name],
        2,
        600,
    )
    assert started.stdout == (
        f"started drain {drain.id} of store {source.name}: running; 3 warehouse(s) to move to "
        f"{targets}, at most 2 at a time\n"
    )

    # The janitor launches the children (none runs here): launch one and skip one by hand.
    waiting, launched, skipped = drain.items.order_by("id")
    assert [i.org_id for i in (waiting, launched, skipped)] == [w.org_id for w in warehouses]
    op = new_op(warehouses[1], to_store=first, state="running", drain_item=launched)
    launched.state, launched.target_store = ItemState.LAUNCHED, first.name
    launched.save()
    skipped.state, skipped.reason = ItemState.SKIPPED, "org is Trino-enabled"
    skipped.save()
    progress = "1 waiting, 1 running, 1 skipped (of 3)"

    listed = cli("store", "drains", source.name)
    assert listed.returncode == 0, listed.stderr
    header, line = listed.stdout.splitlines()
    assert header == "id\tstate\ttargets\tmax_concurrent\tprogress\tcreated_at"
    assert line.startswith(f"{drain.id}\trunning\t{targets}\t2\t{progress}\t")
    as_json = json.loads(cli("-o", "json", "store", "drains", source.name).stdout)
    assert [(d["id"], "items" in d) for d in as_json["drains"]] == [(drain.id, False)]

    shown = cli("store", "show", str(drain.id))
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.splitlines()
    assert lines[0] == f"drain {drain.id} of store {source.name}: running"
    for expected in (
        f"targets: {targets} (rule fewest_warehouses)",
        "max_concurrent: 2",
        "drain_timeout_seconds: 600",
        f"progress: {progress}",
    ):
        assert expected in lines, (expected, lines)
    assert lines[-4:] == [
        "org\tstate\ttarget\top\treason",
        f"{waiting.org_id}\twaiting\t-\t-\t-",
        f"{launched.org_id}\trunning\t{first.name}\t{op.id}\t-",
        f"{skipped.org_id}\tskipped\t-\t-\torg is Trino-enabled",
    ]
    shown_json = json.loads(cli("store", "show", str(drain.id), "--output", "json").stdout)
    assert [(i["org_id"], i["state"], i["operation_id"]) for i in shown_json["items"]] == [
        (waiting.org_id, "waiting", None),
        (launched.org_id, "running", op.id),
        (skipped.org_id, "skipped", None),
    ]
    assert shown_json["progress"]["skipped"] == 1
    cli.assert_no_secret()


@pytest.mark.safeguard("reshard-90")
def test_pause_resume_cancel_and_the_apis_refusals(cli: Cli, transactional_db: None) -> None:
    source, target = new_store(), new_store()
    created = cli("store", "drain", source.name, "--to", target.name, "-o", "json")
    assert created.returncode == 0, created.stderr
    drain = json.loads(created.stdout)
    drain_id = drain["id"]
    assert (drain["store"], drain["target_stores"], drain["max_concurrent"]) == (
        source.name,
        [target.name],
        1,
    )
    assert (drain["state"], drain["items"], set(drain["progress"].values())) == ("running", [], {0})
    assert "progress: no warehouses" in cli("store", "show", str(drain_id)).stdout

    # A second drain of the store: the API's 409 with its message and code, exit 1.
    again = cli("store", "drain", source.name, "--to", target.name)
    assert again.returncode == 1
    assert again.stdout == ""
    assert again.stderr.startswith(
        f"duckgres: POST /api/v1/metadata-stores/{source.name}/drain: HTTP 409: metadata store "
        f"{source.name} is being drained (drain {drain_id})"
    )
    assert again.stderr.rstrip().endswith("[store_draining]")

    headline = f"drain {drain_id} of store {source.name}"
    for action, state, note in (
        ("pause", "paused", "no new reshard starts"),
        ("resume", "running", "the janitor launches the waiting warehouses again"),
        ("pause", "paused", "no new reshard starts"),
        ("cancel", "cancelling", "0 active reshard(s) asked to stop"),
    ):
        result = cli("store", action, str(drain_id))
        assert result.returncode == 0, (action, result.stderr)
        assert result.stdout.startswith(f"{headline}: {state}; "), result.stdout
        assert note in result.stdout
    assert StoreDrain.objects.get(pk=drain_id).state == "cancelling"

    refused = cli("store", "resume", str(drain_id))
    assert refused.returncode == 1
    assert refused.stderr == (
        f"duckgres: POST /api/v1/drains/{drain_id}/resume: HTTP 409: drain {drain_id} is "
        "cancelling: only a paused drain can resume [drain_state]\n"
    )
    refused_json = cli("store", "cancel", str(drain_id), "-o", "json")
    assert refused_json.returncode == 1
    assert json.loads(refused_json.stdout) == {
        "error": f"POST /api/v1/drains/{drain_id}/cancel: HTTP 409: drain {drain_id} is "
        "cancelling: only a running or paused drain can cancel [drain_state]",
        "exit_code": 1,
        "status": 409,
    }

    # Other refusals (exit 1) and usage (exit 2, before any request).
    for args, message in (
        (("store", "show", "99999999"), "HTTP 404: no such drain"),
        (("store", "pause", "99999999"), "HTTP 404: no such drain"),
        (("store", "drains", "no-such-store-x"), "HTTP 404: no metadata store named no-such"),
        (
            ("store", "drain", new_store().name, "--to", "no-such-store-x"),
            "HTTP 400: invalid body: target_stores: no metadata store named no-such-store-x",
        ),
    ):
        result = cli(*args)
        assert (result.returncode, result.stdout) == (1, ""), (args, result.stderr)
        assert message in result.stderr, (args, result.stderr)
    for usage in (
        ("store", "drain", source.name),  # no --to
        ("store", "drain", source.name, "--to", target.name, "--max-concurrent", "17"),
        ("store", "drain", source.name, "--to", target.name, "--drain-timeout", "0"),
        ("store", "show", "not-a-number"),
        ("store", "cancel", "0"),
        ("store", "frobnicate"),
    ):
        assert cli(*usage).returncode == 2, usage
    assert StoreDrain.objects.filter(store=source).count() == 1
    cli.assert_no_secret()


@pytest.mark.safeguard("reshard-111")
def test_cancel_prints_the_reshards_asked_and_those_past_their_point_of_no_return(
    cli: Cli, transactional_db: None
) -> None:
    source, target = new_store(), new_store()
    moving, late, queued, waiting = bound(source, 4)
    created = cli("store", "drain", source.name, "--to", target.name, "-o", "json")
    drain_id = json.loads(created.stdout)["id"]
    ops = {}
    for wh, state, step in (
        (moving, "running", "blocking"),
        (late, "running", "cleaning_up"),
        (queued, "pending", ""),
    ):
        item = StoreDrainItem.objects.get(drain_id=drain_id, org_id=wh.org_id)
        ops[step] = new_op(wh, to_store=target, state=state, step=step, drain_item=item)
        StoreDrainItem.objects.filter(pk=item.pk).update(state=ItemState.LAUNCHED)

    result = cli("store", "cancel", str(drain_id))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"drain {drain_id} of store {source.name}: cancelling; 1 waiting warehouse(s) dropped, "
        "2 active reshard(s) asked to stop, 1 past the point of no return",
        f"asked to stop: op {ops['blocking'].id} of {moving.org_id} (at step blocking)",
        f"asked to stop: op {ops[''].id} of {queued.org_id} (cancelled before it started)",
        f"past its point of no return, runs to its end: op {ops['cleaning_up'].id} of "
        f"{late.org_id} (at step cleaning_up)",
        "it ends cancelled once none of its reshards is active",
    ]
    assert ReshardOperation.objects.get(pk=ops["blocking"].pk).cancel_requested is True
    assert StoreDrainItem.objects.get(drain_id=drain_id, org_id=waiting.org_id).state == (
        "cancelled"
    )
    cli.assert_no_secret()
