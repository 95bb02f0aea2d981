"""The ``duckgres`` commands (click). Thin: parse, call the API, print (docs/cli.md)."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar
from urllib.parse import quote

import click

from duckgres_cli.client import ApiClient, client_from_environ, default_environ
from duckgres_cli.config import load_profile
from duckgres_cli.errors import (
    EXIT_DEADLINE,
    EXIT_OK,
    EXIT_OP_NOT_SUCCEEDED,
    EXIT_TRANSPORT,
    EXIT_USAGE,
    CliError,
)
from duckgres_cli.text import clean
from duckgres_cli.version import __version__

TERMINAL = ("succeeded", "failed", "cancelled")
OUTPUTS = ("text", "json")
F = TypeVar("F", bound=Callable[..., Any])


@dataclass
class State:
    api_url: str | None = None
    profile: str | None = None
    timeout: float | None = None
    ca_file: str | None = None
    output: str = "text"
    token_file: str | None = None
    insecure_http: bool = False
    _client: ApiClient | None = None

    def client(self) -> ApiClient:
        if self._client is None:
            environ = default_environ()
            self._client = client_from_environ(
                api_url_value=self.api_url,
                timeout=self.timeout,
                ca_file=self.ca_file,
                environ=environ,
                token_file=self.token_file,
                insecure_http=self.insecure_http,
                profile=load_profile(self.profile, environ),
            )
        return self._client

    def scrub(self, text: str) -> str:
        return self._client.scrub(text) if self._client is not None else text


def _state() -> State:
    state = click.get_current_context().find_object(State)
    assert state is not None
    return state


def _set_output(ctx: click.Context, _param: click.Parameter, value: str | None) -> None:
    if value is not None:
        ctx.ensure_object(State).output = value


def output_option(func: F) -> F:
    """``--output text|json`` on every command, also accepted before the command."""
    return click.option(
        "--output",
        "-o",
        type=click.Choice(OUTPUTS),
        default=None,
        expose_value=False,
        callback=_set_output,
        is_eager=False,
        help="text (default) or json: the API's JSON document as it answered.",
    )(func)


def _emit_json(document: Any) -> None:
    click.echo(_state().scrub(json.dumps(document, indent=2, sort_keys=True, default=str)))


def _emit(text: str) -> None:
    """Print server-provided text: escapes and controls removed (``cli.text``), then scrubbed."""
    click.echo(_state().scrub(clean(text, multiline=True)))


def _run(action: Callable[[], int]) -> int:
    """Run ``action``; a :class:`CliError` becomes its message (stderr, or a JSON document on
    stdout with ``--output json``) and its exit code."""
    state = _state()
    try:
        return action()
    except CliError as exc:
        message = state.scrub(exc.message)
        if state.output == "json":  # json.dumps escapes every control character
            click.echo(
                json.dumps(
                    {"error": message, "status": exc.status, "exit_code": exc.exit_code},
                    sort_keys=True,
                )
            )
        else:
            click.echo(f"duckgres: {state.scrub(clean(exc.message, multiline=True))}", err=True)
        return exc.exit_code


def call_and_print(
    method: str,
    path: str,
    *,
    what: str = "",
    body: Any = None,
    text: Callable[[Any], list[str]],
) -> int:
    """One API call, printed: the answer's document with ``--output json``, else the lines
    ``text`` makes of it; a refusal or failure is :func:`_run`'s message and exit code."""

    def action() -> int:
        answer = _state().client().call(method, path, body=body, what=what)
        if _state().output == "json":
            _emit_json(answer.body)
        else:
            for line in text(answer.body or {}):
                _emit(line)
        return EXIT_OK

    return _run(action)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(
    __version__, "--version", "-V", prog_name="duckgres", message="%(prog)s %(version)s"
)
@click.option(
    "--profile",
    default=None,
    help="A profile of the config file ~/.config/duckgres/config.toml (env DUCKGRES_PROFILE; "
    "the file: env DUCKGRES_CONFIG); options and variables override its values.",
)
@click.option(
    "--api-url",
    envvar="DUCKGRES_API_URL",
    default=None,
    help="The API's base URL, e.g. https://admin.example.com (env DUCKGRES_API_URL).",
)
@click.option(
    "--timeout",
    type=click.FloatRange(1, 600),
    default=None,
    help="Seconds for each HTTP request (default: the profile's timeout, else 30).",
)
@click.option(
    "--ca-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="CA bundle for an https API (env DUCKGRES_API_CA_FILE).",
)
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False),
    default=None,
    help="File holding your personal API token (or env DUCKGRES_API_TOKEN[_FILE]); never "
    "the token itself on the command line.",
)
@click.option(
    "--insecure-http",
    is_flag=True,
    default=False,
    help="Allow plain http:// to a host that is not loopback (env DUCKGRES_INSECURE_HTTP=1).",
)
@output_option
@click.pass_context
def cli(
    ctx: click.Context,
    profile: str | None,
    api_url: str | None,
    timeout: float | None,
    ca_file: str | None,
    token_file: str | None,
    insecure_http: bool,
) -> None:
    """Duckgres Admin API client. Identity: your personal token (DUCKGRES_API_TOKEN or
    --token-file) or, for automation, DUCKGRES_INTERNAL_SECRET."""
    state = ctx.ensure_object(State)
    state.api_url, state.timeout, state.ca_file = api_url, timeout, ca_file
    state.profile = profile
    state.token_file, state.insecure_http = token_file, insecure_http


# --- reshard ----------------------------------------------------------------------------------


@cli.group()
def reshard() -> None:
    """Reshard operations: start, list, show, follow, cancel."""


def _target(
    to_shard: str | None,
    endpoint: str | None,
    user: str | None,
    database: str | None,
    sslmode: str | None,
    password_ref: str | None,
    password_stdin: bool,
) -> dict[str, Any]:
    external = any((endpoint, user, database, sslmode, password_stdin))
    if to_shard and external:
        raise click.UsageError("--to-shard and the external target options are exclusive")
    if to_shard:
        target: dict[str, Any] = {"type": "cnpg", "cnpg_shard": to_shard}
        if password_ref:
            target["password_secret_ref"] = password_ref
        return target
    if not endpoint:
        raise click.UsageError(
            "give --to-shard NAME, or --endpoint HOST[:PORT] for an external target"
        )
    target = {"type": "external", "endpoint": endpoint}
    for key, value in (
        ("user", user),
        ("database", database),
        ("sslmode", sslmode),
        ("password_secret_ref", password_ref),
    ):
        if value:
            target[key] = value
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
        if not password:
            raise click.UsageError("--password-stdin: no password on standard input")
        target["password"] = password
    return target


def kind_label(op: dict[str, Any], default: str = "reshard") -> str:
    """What an operation is, as the CLI names it: ``reshard``, ``restore`` or ``in-place
    restore`` (the API's ``kind`` and ``in_place``; an API without them: ``default``)."""
    if op.get("kind") == "restore":
        return "in-place restore" if op.get("in_place") else "restore"
    return str(op.get("kind") or default)


def _op_line(op: dict[str, Any]) -> str:
    source = op.get("from_shard") or op.get("source_endpoint") or op.get("source_kind") or "?"
    target = op.get("to_shard") or op.get("target_endpoint") or op.get("target_kind") or "?"
    step = op.get("step") or "-"
    error = f"  {op['error']}" if op.get("error") else ""
    return (
        f"{op.get('id')}\t{op.get('org_id')}\t{kind_label(op)}\t{op.get('state')}\t{step}\t"
        f"{source} -> {target}\t{op.get('created_at')}{error}"
    )


@reshard.command("start")
@click.argument("org")
@click.option("--to-shard", help="cnpg target: the registered metadata store's name.")
@click.option("--endpoint", help="External target HOST[:PORT].")
@click.option("--user", help="External target tenant user.")
@click.option("--database", help="External target database.")
@click.option("--sslmode", type=click.Choice(["require", "verify-ca", "verify-full"]))
@click.option("--password-secret-ref", "password_ref", help="k8s:<ns>/<secret>#<key> reference.")
@click.option(
    "--password-stdin",
    is_flag=True,
    help="Read the external target's password from the first line of standard input "
    "(never pass a password as an argument).",
)
@click.option("--drain-timeout", type=click.IntRange(0, 86400), default=None)
@click.option("--cutover-timeout", type=click.IntRange(0, 86400), default=None)
@click.option(
    "--copy-mode",
    type=click.Choice(["online", "offline"]),
    default=None,
    help="online: pre-copy while the tenant runs, block only to catch up (cnpg to cnpg; "
    "otherwise the operation runs offline and says why). Default: the server's setting.",
)
@click.option("--dry-run", is_flag=True, help="Run every check; create nothing.")
@click.option("--follow", "follow_after", is_flag=True, help="Follow the new operation.")
@click.option("--deadline", type=click.FloatRange(min=0), default=0, help="With --follow.")
@output_option
def reshard_start(
    org: str,
    to_shard: str | None,
    endpoint: str | None,
    user: str | None,
    database: str | None,
    sslmode: str | None,
    password_ref: str | None,
    password_stdin: bool,
    drain_timeout: int | None,
    cutover_timeout: int | None,
    copy_mode: str | None,
    dry_run: bool,
    follow_after: bool,
    deadline: float,
) -> int:
    """Start a reshard of ORG's catalog (POST /warehouses/<org>/reshards)."""
    body: dict[str, Any] = {
        "target": _target(to_shard, endpoint, user, database, sslmode, password_ref, password_stdin)
    }
    if drain_timeout is not None:
        body["drain_timeout_seconds"] = drain_timeout
    if cutover_timeout is not None:
        body["cutover_timeout_seconds"] = cutover_timeout
    if copy_mode is not None:
        body["copy_mode"] = copy_mode
    if dry_run:
        body["dry_run"] = True

    return _start_and_report(org, "reshards", "reshard", body, dry_run, follow_after, deadline)


def _start_and_report(
    org: str,
    route: str,
    what: str,
    body: dict[str, Any],
    dry_run: bool,
    follow_after: bool,
    deadline: float,
) -> int:
    """POST a start (or its dry run) and print the plan's checks or the new operation."""

    def action() -> int:
        state = _state()
        answer = state.client().call(
            "POST", f"warehouses/{_seg(org)}/{route}", body=body, what=f"{what} start"
        )
        doc = answer.body or {}
        if dry_run:
            if state.output == "json":
                _emit_json(doc)
            else:
                for check in doc.get("preflight", []):
                    mark = "ok  " if check.get("ok") else "FAIL"
                    _emit(f"{mark} {check.get('check')}: {check.get('detail')}")
            failed = [c for c in doc.get("preflight", []) if not c.get("ok")]
            return 1 if failed else EXIT_OK
        if state.output == "json" and not follow_after:
            _emit_json(doc)
        elif state.output != "json":
            label = kind_label(doc, what)
            _emit(f"started {label} {doc.get('id')} of org {doc.get('org_id')}: {doc.get('state')}")
        if follow_after:
            return _follow(int(doc["id"]), deadline=deadline, interval=2.0)
        return EXIT_OK

    return _run(action)


@reshard.command("list")
@click.option("--org", default="", help="Only this org's operations.")
@click.option("--state", "op_state", type=click.Choice(["pending", "running", *TERMINAL]))
@click.option("--limit", type=click.IntRange(1, 500), default=None)
@click.option("--before", type=int, default=None, help="Page cursor (next_before).")
@output_option
def reshard_list(org: str, op_state: str | None, limit: int | None, before: int | None) -> int:
    """List operations, newest first (GET /reshards)."""

    def action() -> int:
        query: dict[str, str | int] = {"org": org, "state": op_state or ""}
        if limit is not None:
            query["limit"] = limit
        if before is not None:
            query["before"] = before
        doc = _state().client().call("GET", "reshards", query=query).body or {}
        if _state().output == "json":
            _emit_json(doc)
            return EXIT_OK
        _emit("id\torg\tkind\tstate\tstep\tsource -> target\tcreated_at")
        for op in doc.get("operations", []):
            _emit(_op_line(op))
        if doc.get("next_before") is not None:
            _emit(f"(more: --before {doc['next_before']})")
        return EXIT_OK

    return _run(action)


@reshard.command("show")
@click.argument("op_id", type=click.IntRange(min=1))
@output_option
def reshard_show(op_id: int) -> int:
    """Show one operation (GET /reshards/<id>)."""

    def action() -> int:
        op = _state().client().call("GET", f"reshards/{op_id}").body or {}
        if _state().output == "json":
            _emit_json(op)
            return EXIT_OK
        for key in sorted(op):
            value = op[key]
            if value not in ("", None, {}, []):
                _emit(f"{key}: {value}")
        return EXIT_OK

    return _run(action)


@reshard.command("cancel")
@click.argument("op_id", type=click.IntRange(min=1))
@output_option
def reshard_cancel(op_id: int) -> int:
    """Cancel an operation (POST /reshards/<id>/cancel): 200 cancelled, 202 requested."""

    def action() -> int:
        answer = _state().client().call("POST", f"reshards/{op_id}/cancel", body={})
        if _state().output == "json":
            _emit_json(answer.body)
        elif answer.status == 200:
            _emit(f"reshard {op_id} cancelled (before its runner started)")
        else:
            _emit(f"reshard {op_id}: cancel requested; the runner stops at its next check")
        return EXIT_OK

    return _run(action)


def _log_line(entry: dict[str, Any]) -> str:
    """One op-log entry as one printed line: no escape, control character or newline."""
    line = f"{entry.get('ts')} [{entry.get('source')}/{entry.get('level')}] {entry.get('message')}"
    return clean(line)


def _follow(op_id: int, *, deadline: float, interval: float) -> int:
    """Print the op log as it grows until the op is terminal and its log is drained."""
    state = _state()
    client = state.client()
    end = time.monotonic() + deadline if deadline > 0 else None
    after = 0
    failures = 0
    label = "operation"  # until the first read says which kind it is
    while True:
        try:
            op = client.call("GET", f"reshards/{op_id}").body or {}
            label = kind_label(op)
            while True:
                page = (
                    client.call(
                        "GET", f"reshards/{op_id}/log", query={"after": after, "limit": 500}
                    ).body
                    or {}
                )
                entries = page.get("entries", [])
                for entry in entries:
                    if state.output == "json":
                        click.echo(state.scrub(json.dumps({"log": entry}, sort_keys=True)))
                    else:
                        _emit(_log_line(entry))
                after = int(page.get("next_after") or after)
                if not entries:
                    break
            failures = 0
        except CliError as exc:
            # A transient failure (transport, 5xx) is retried within the deadline; a refusal
            # (e.g. 404 for an unknown op) ends the follow at once.
            if exc.exit_code != EXIT_TRANSPORT or failures >= 4:
                raise
            failures += 1
            click.echo(f"duckgres: {state.scrub(clean(exc.message))} (retrying)", err=True)
            op = {}
        op_state = op.get("state")
        if op_state in TERMINAL:
            if state.output == "json":
                click.echo(state.scrub(json.dumps({"operation": op}, sort_keys=True, default=str)))
            else:
                error = f": {op['error']}" if op.get("error") else ""
                _emit(f"{label} {op_id} {op_state}{error}")
            return EXIT_OK if op_state == "succeeded" else EXIT_OP_NOT_SUCCEEDED
        if end is not None and time.monotonic() >= end:
            raise CliError(
                f"follow: the deadline of {deadline:g} s passed; {label} {op_id} is still "
                f"{op_state or 'unknown'}",
                EXIT_DEADLINE,
            )
        pause = interval * (2**failures)
        if end is not None:
            pause = max(0.0, min(pause, end - time.monotonic()))
        time.sleep(pause)


@reshard.command("follow")
@click.argument("op_id", type=click.IntRange(min=1))
@click.option(
    "--deadline",
    type=click.FloatRange(min=0),
    default=0,
    help="Stop after this many seconds (exit 6 if still active); 0: until terminal.",
)
@click.option("--interval", type=click.FloatRange(0.2, 60), default=2.0, show_default=True)
@output_option
def reshard_follow(op_id: int, deadline: float, interval: float) -> int:
    """Tail the op log until the operation is terminal: exit 0 succeeded, 4 failed/cancelled."""
    return _run(lambda: _follow(op_id, deadline=deadline, interval=interval))


# --- routes the issue names that this API build does not serve yet ------------------------------


def _seg(value: str) -> str:
    return quote(value, safe="")


def _simple(method: str, path: str, what: str, body: Any = None) -> int:
    return call_and_print(
        method,
        path,
        what=what,
        body=body,
        text=lambda doc: [json.dumps(doc, indent=2, sort_keys=True, default=str)],
    )


@cli.group()
def restore() -> None:
    """Restores of a warehouse's catalog from a backup."""


def _backup_key(backup: str) -> str:
    """A backup as ``duckgres backups list`` shows it: its key, or its ``s3://`` URI."""
    if backup.startswith("s3://"):
        return backup.removeprefix("s3://").partition("/")[2]
    return backup


@restore.command("start")
@click.argument("org")
@click.option(
    "--backup",
    "backup",
    required=True,
    help="The backup: its key (_reshard_catalog_backups/op-…dump) or its s3:// URI, as "
    "`duckgres backups list ORG` shows them.",
)
@click.option(
    "--to-shard",
    required=True,
    help="The cnpg store to restore onto (the current one: in place).",
)
@click.option("--drain-timeout", type=click.IntRange(0, 86400), default=None)
@click.option("--dry-run", is_flag=True, help="Run every check; create nothing.")
@click.option("--follow", "follow_after", is_flag=True, help="Follow the new operation.")
@click.option("--deadline", type=click.FloatRange(min=0), default=0, help="With --follow.")
@output_option
def restore_start(
    org: str,
    backup: str,
    to_shard: str,
    drain_timeout: int | None,
    dry_run: bool,
    follow_after: bool,
    deadline: float,
) -> int:
    """Restore one of ORG's backups onto a store, in place when it is ORG's own
    (POST /warehouses/<org>/restores)."""
    key = _backup_key(backup)
    body: dict[str, Any] = {"backup_key": key, "target": {"type": "cnpg", "cnpg_shard": to_shard}}
    if drain_timeout is not None:
        body["drain_timeout_seconds"] = drain_timeout
    if dry_run:
        body["dry_run"] = True
    return _start_and_report(org, "restores", "restore", body, dry_run, follow_after, deadline)


@cli.group()
def backups() -> None:
    """Backups of a warehouse's catalog."""


@backups.command("list")
@click.argument("org")
@click.option(
    "--retention-plan",
    is_flag=True,
    help="Add the retention dry run: keep or delete, and why, per backup (deletes nothing).",
)
@output_option
def backups_list(org: str, retention_plan: bool) -> int:
    """List an org's backups, newest first (GET /warehouses/<org>/backups)."""

    def action() -> int:
        query: dict[str, str | int] = {"retention": "plan"} if retention_plan else {}
        doc = (
            _state()
            .client()
            .call("GET", f"warehouses/{_seg(org)}/backups", query=query, what="backups list")
            .body
            or {}
        )
        if _state().output == "json":
            _emit_json(doc)
            return EXIT_OK
        header = "key\tsize\tlast_modified\top\tstate\tsha256\tverified"
        _emit(header + ("\tretention" if retention_plan else ""))
        for b in doc.get("backups", []):
            verified = "-" if b.get("verified") is None else str(b.get("verified")).lower()
            line = (
                f"{b.get('key')}\t{b.get('size')}\t{b.get('last_modified')}\t{b.get('op_id')}\t"
                f"{b.get('op_state')}\t{str(b.get('sha256') or '-')[:12]}\t{verified}"
            )
            if retention_plan:
                decision = b.get("retention") or {}
                line += f"\t{decision.get('action')}: {decision.get('reason')}"
            _emit(line)
        for changed in doc.get("changed_objects") or []:
            _emit(f"not listed, changed since it was recorded: {changed.get('key')}: "
                  f"{changed.get('reason')}")  # fmt: skip
        if doc.get("unrecorded_objects"):
            _emit(
                f"({doc['unrecorded_objects']} object(s) of this org's operations are not "
                "recorded backups (a killed attempt's, or not written by the product): not "
                "listed)"
            )
        if doc.get("truncated"):
            _emit(f"(listing truncated at {doc.get('max_listed_objects')} objects)")
        if retention_plan and doc.get("retention"):
            _emit(f"retention: {doc['retention'].get('note')}")
        return EXIT_OK

    return _run(action)


@backups.command("test")
@click.argument("org")
@click.option(
    "--key",
    "backup",
    default=None,
    help="The backup to test: its key or s3:// URI, as `duckgres backups list ORG` shows "
    "them. Default: ORG's newest backup of an ended operation.",
)
@output_option
def backups_test(org: str, backup: str | None) -> int:
    """Queue a restore test of one of ORG's backups (POST /warehouses/<org>/backups/
    restore-test); the default worker runs it and records the result."""
    body: dict[str, Any] = {"backup_key": _backup_key(backup)} if backup else {}

    def text(doc: Any) -> list[str]:
        previous = doc.get("previous") or {}
        before = {None: "never tested", True: "passed", False: "failed"}.get(
            previous.get("verified"), "?"
        )
        if previous.get("verified_at"):
            before += f" at {previous['verified_at']}"
        return [
            f"queued a restore test of {doc.get('uri')} (operation {doc.get('op_id')}; until "
            f"now {before}) on store {doc.get('store')}: task {doc.get('task_id')}",
            f"once the default worker ran it, its result (replacing any earlier one) shows in "
            f"`duckgres backups list {org}` (verified) and in the operation's log "
            f"(`duckgres reshard follow {doc.get('op_id')}`)",
        ]

    return call_and_print(
        "POST",
        f"warehouses/{_seg(org)}/backups/restore-test",
        what="backups test",
        body=body,
        text=text,
    )


__all__ = ["EXIT_USAGE", "call_and_print", "cli", "output_option"]
