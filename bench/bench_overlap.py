"""Maintenance-window benchmark of the backup beside the copy (issue 15 item 6).

    .venv/bin/python bench/bench_overlap.py [--tables 20000] [--pairs 1]

Runs ``scripts/demo.sh`` (a real reshard of a DEMO_TABLES-table DuckLake catalog from 5433 to
5434 through the API, a Celery worker and a runner process; needs ``make services``) in pairs:
first with ``DUCKGRES_RESHARD_BACKUP_OVERLAP=false`` (the backup alone inside its step: the
baseline, measured in the same run), then with it on. After each run it reads the operation's
step timings and op log from the demo config store (database clock) before the next run
replaces it, and prints ``name: value unit (ratio vs baseline)`` lines and a Markdown table:

- window: ``blocked_at`` → ``unblocked_at``; outside the propagation wait: minus ``blocking``;
- backup: the ``backup_catalog`` step (serial), or the dump's own time from its
  ``catalog backup finished N s after it started`` line (overlapped);
- copy: the ``copying`` step; verify: the ``verifying`` step minus the join's wait;
- goal: window outside the propagation wait <= 1.1 x max(backup, copy) + verify.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parent.parent
DSN = "postgresql://postgres@127.0.0.1:5432/duckgres_demo?sslmode=require"
FINISHED = re.compile(
    r"catalog backup finished ([\d.]+) s after it started; the steps waited ([\d.]+) s"
)

STEPS = """
SELECT s.step, sum(extract(epoch FROM s.ended_at - s.started_at))
  FROM duckgres_reshard_operation_steps s WHERE s.operation_id = %s GROUP BY s.step
"""


@dataclass
class Run:
    overlap: bool
    window: float
    blocking: float
    backup: float
    copy: float
    verify: float
    waited: float

    @property
    def outside(self) -> float:
        return self.window - self.blocking

    @property
    def goal(self) -> float:
        return 1.1 * max(self.backup, self.copy) + self.verify


def _measure(overlap: bool) -> Run:
    with psycopg.connect(DSN) as conn:
        row = conn.execute(
            "SELECT id, extract(epoch FROM unblocked_at - blocked_at) FROM "
            "duckgres_reshard_operations WHERE state = 'succeeded' ORDER BY id DESC LIMIT 1"
        ).fetchone()
        if row is None:
            raise SystemExit("the demo left no succeeded operation")
        op_id, window = int(row[0]), float(row[1])
        steps = {str(k): float(v) for k, v in conn.execute(STEPS, [op_id]).fetchall()}
        lines = [
            str(r[0])
            for r in conn.execute(
                "SELECT message FROM duckgres_reshard_operation_log WHERE operation_id = %s",
                [op_id],
            )
        ]
    found = [m for m in map(FINISHED.search, lines) if m]
    if overlap and not found:
        raise SystemExit("overlap on, but the op log has no 'catalog backup finished' line")
    backup = float(found[0].group(1)) if found else steps.get("backup_catalog", 0.0)
    waited = float(found[0].group(2)) if found else 0.0
    return Run(
        overlap=overlap,
        window=window,
        blocking=steps.get("blocking", 0.0),
        backup=backup,
        copy=steps.get("copying", 0.0),
        verify=steps.get("verifying", 0.0) - waited,
        waited=waited,
    )


def _demo(tables: int, overlap: bool) -> Run:
    env = {
        **os.environ,
        "DEMO_TABLES": str(tables),
        "DUCKGRES_RESHARD_BACKUP_OVERLAP": "true" if overlap else "false",
    }
    print(f"# demo run: {tables} tables, overlap {'on' if overlap else 'off'}", flush=True)
    done = subprocess.run(
        [str(ROOT / "scripts" / "demo.sh")], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode != 0:
        sys.stderr.write(done.stdout[-4000:] + done.stderr[-4000:])
        raise SystemExit(f"the demo failed (exit {done.returncode})")
    return _measure(overlap)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, default=20000)
    parser.add_argument("--pairs", type=int, default=1)
    args = parser.parse_args()
    runs: list[tuple[Run, Run]] = []
    for _ in range(args.pairs):
        runs.append((_demo(args.tables, False), _demo(args.tables, True)))
    print(
        "| run | window | outside the propagation wait | backup | copy | verify | join wait "
        "| goal 1.1 x max + verify |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for index, (base, over) in enumerate(runs, 1):
        for run in (base, over):
            name = f"{index} overlap {'on' if run.overlap else 'off'}"
            ratio = run.outside / base.outside
            print(
                f"| {name} | {run.window:.2f} s | {run.outside:.2f} s ({ratio:.2f}x) | "
                f"{run.backup:.2f} s | {run.copy:.2f} s | {run.verify:.2f} s | {run.waited:.2f} s "
                f"| {run.goal:.2f} s: {'met' if run.outside <= run.goal else 'missed'} |"
            )
        print(f"window_outside_wait_ratio_{index}: {over.outside / base.outside:.2f}x of serial")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
