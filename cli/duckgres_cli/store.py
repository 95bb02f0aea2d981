"""``duckgres store``: drains of a metadata store (docs/cli.md, docs/api.md "Store drains").

Thin commands over the API's drain routes: ``drain`` plans one (``POST
/metadata-stores/<name>/drains``; the janitor's leader launches the reshards, never this
client), ``drains`` lists a store's, ``show`` prints one with its per-org table, and
``pause``/``resume``/``cancel`` change its state (a state that does not allow it is the API's
409: exit 1). Output, errors and exit codes are :func:`duckgres_cli.app.call_and_print`'s.
"""

from __future__ import annotations

from typing import Any

import click

from duckgres_cli.app import _seg, call_and_print, cli, output_option

TABLE = "org\tstate\ttarget\top\treason"
LIST_HEADER = "id\tstate\ttargets\tmax_concurrent\tprogress\tcreated_at"
# Each state change: its help, and what the drain does next (printed after its new state).
ACTIONS = {
    "pause": (
        "Pause a running drain: no new reshard starts",
        "no new reshard starts; the active ones run to their end",
    ),
    "resume": (
        "Resume a paused drain",
        "the janitor launches the waiting warehouses again",
    ),
    "cancel": (
        "Cancel a running or paused drain: it ends cancelled once none of its reshards is active",
        "it ends cancelled once none of its reshards is active",
    ),
}


def _dash(value: Any) -> str:
    return "-" if value in (None, "") else str(value)


def _total(drain: dict[str, Any]) -> int:
    return sum(int(n) for n in (drain.get("progress") or {}).values())


def _progress(drain: dict[str, Any]) -> str:
    """``2 waiting, 1 succeeded (of 3)``: the non-zero counts, in the API's order."""
    counts = drain.get("progress") or {}
    parts = ", ".join(f"{n} {state}" for state, n in counts.items() if n)
    return f"{parts} (of {_total(drain)})" if parts else "no warehouses"


def _targets(drain: dict[str, Any]) -> str:
    return ", ".join(str(t) for t in drain.get("target_stores") or []) or "-"


def _headline(drain: dict[str, Any]) -> str:
    return f"drain {drain.get('id')} of store {drain.get('store')}: {drain.get('state')}"


def _item_line(item: dict[str, Any]) -> str:
    keys = ("org_id", "state", "target_store", "operation_id", "reason")
    return "\t".join(_dash(item.get(key)) for key in keys)


def _show_lines(drain: dict[str, Any]) -> list[str]:
    lines = [
        _headline(drain),
        f"targets: {_targets(drain)} (rule {_dash(drain.get('rule'))})",
        f"max_concurrent: {drain.get('max_concurrent')}",
        f"drain_timeout_seconds: {drain.get('drain_timeout_seconds')}",
        f"created: {drain.get('created_at')} by {_dash(drain.get('created_by'))}",
    ]
    if drain.get("finished_at"):
        lines.append(f"finished: {drain['finished_at']}")
    if drain.get("summary"):
        lines.append(f"summary: {drain['summary']}")
    lines.append(f"progress: {_progress(drain)}")
    return [*lines, TABLE, *(_item_line(item) for item in drain.get("items") or [])]


def _child(child: dict[str, Any]) -> str:
    where = (
        "cancelled before it started"
        if child.get("state") == "cancelled"
        else f"at step {_dash(child.get('step'))}"
    )
    return f"op {child.get('operation_id')} of {child.get('org_id')} ({where})"


def _cancel_lines(doc: dict[str, Any]) -> list[str]:
    """The cancel's answer: what its own transaction did, one line per active child."""
    cancel = doc.get("cancel") or {}
    asked = cancel.get("asked") or []
    late = cancel.get("past_point_of_no_return") or []
    return [
        f"{_headline(doc)}; {cancel.get('waiting_cancelled', 0)} waiting warehouse(s) dropped, "
        f"{len(asked)} active reshard(s) asked to stop, {len(late)} past the point of no return",
        *(f"asked to stop: {_child(child)}" for child in asked),
        *(f"past its point of no return, runs to its end: {_child(child)}" for child in late),
        ACTIONS["cancel"][1],
    ]


@cli.group()
def store() -> None:
    """Metadata stores: drain one to others, list, show, pause, resume, cancel its drains."""


@store.command("drain")
@click.argument("name")
@click.option(
    "--to",
    "targets",
    multiple=True,
    required=True,
    help="A cnpg store to move the warehouses to (repeat for several: each reshard goes to the "
    "one with the fewest warehouses).",
)
@click.option(
    "--max-concurrent",
    type=click.IntRange(1, 16),
    default=None,
    help="Reshards active at once (1-16; the API's default: 1).",
)
@click.option(
    "--drain-timeout",
    type=click.IntRange(1, 86400),
    default=None,
    help="Each reshard's drain timeout in seconds (the API's default: 1800).",
)
@output_option
def store_drain(
    name: str, targets: tuple[str, ...], max_concurrent: int | None, drain_timeout: int | None
) -> int:
    """Drain store NAME: one reshard per warehouse bound to it, launched by the janitor
    (POST /metadata-stores/<name>/drains)."""
    body: dict[str, Any] = {"target_stores": list(targets)}
    if max_concurrent is not None:
        body["max_concurrent"] = max_concurrent
    if drain_timeout is not None:
        body["drain_timeout_seconds"] = drain_timeout

    def text(drain: dict[str, Any]) -> list[str]:
        return [
            f"started {_headline(drain)}; {_total(drain)} warehouse(s) to move to "
            f"{_targets(drain)}, at most {drain.get('max_concurrent')} at a time"
        ]

    return call_and_print(
        "POST", f"metadata-stores/{_seg(name)}/drain", what="store drain", body=body, text=text
    )


@store.command("drains")
@click.argument("name")
@output_option
def store_drains(name: str) -> int:
    """List store NAME's drains, newest first (GET /metadata-stores/<name>/drains)."""

    def text(doc: dict[str, Any]) -> list[str]:
        return [
            LIST_HEADER,
            *(
                f"{d.get('id')}\t{d.get('state')}\t{_targets(d)}\t{d.get('max_concurrent')}\t"
                f"{_progress(d)}\t{d.get('created_at')}"
                for d in doc.get("drains") or []
            ),
        ]

    return call_and_print(
        "GET", f"metadata-stores/{_seg(name)}/drains", what="store drains", text=text
    )


@store.command("show")
@click.argument("drain_id", type=click.IntRange(min=1))
@output_option
def store_show(drain_id: int) -> int:
    """Show one drain: its progress and one line per org (GET /drains/<id>)."""
    return call_and_print("GET", f"drains/{drain_id}", what="store show", text=_show_lines)


def _action_command(action: str) -> None:
    help_text, next_text = ACTIONS[action]

    @store.command(action, help=f"{help_text} (POST /drains/<id>/{action}).")
    @click.argument("drain_id", type=click.IntRange(min=1))
    @output_option
    def command(drain_id: int) -> int:
        return call_and_print(
            "POST",
            f"drains/{drain_id}/{action}",
            what=f"store {action}",
            body={},
            text=_cancel_lines
            if action == "cancel"
            else lambda drain: [f"{_headline(drain)}; {next_text}"],
        )

    del command


for _action in ACTIONS:
    _action_command(_action)

__all__ = ["store"]
