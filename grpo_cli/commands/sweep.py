"""The end of a sweep (`grpo train -m ...`): one row per job in a rich table and in sweep.csv."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

COLUMNS = (
    "job",
    "overrides",
    "status",
    "reward_last20",
    "sampled_accuracy_after",
    "greedy_accuracy_after",
    "seconds",
    "run_dir",
    "error",
)


def read_rows(sweep_dir: Path, summary_file: str) -> list[dict[str, Any]]:
    """Every job's row (its `summary_file`), by job number (one that does not read is skipped, said)."""
    rows = []
    for path in sorted(sweep_dir.glob(f"*/{summary_file}")) + sorted(sweep_dir.glob(f"*/*/{summary_file}")):
        try:
            row = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as e:
            Console(stderr=True).print(f"[yellow]warning:[/] skipping {path} ({e}) in the sweep table")
            continue
        rows.append({**row, "status": row.get("status", "done")})
    return sorted(rows, key=lambda r: int(r.get("job", 0)))


def report(sweep_dir, summary_file: str) -> list[str]:
    """The sweep's table, printed, and sweep.csv beside its jobs, from each job's `summary_file`; returns the
    jobs that failed."""
    sweep_dir = Path(sweep_dir)
    rows = read_rows(sweep_dir, summary_file)
    if not rows:
        return []
    with open(sweep_dir / "sweep.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
        writer.writeheader()
        writer.writerows({**r, "overrides": " ".join(r["overrides"])} for r in rows)
    swept = varying_overrides([r["overrides"] for r in rows])
    table = Table(title=f"sweep: {len(rows)} jobs ({sweep_dir}/sweep.csv)")
    headers = {
        "job": "job",
        "overrides": "swept",
        "status": "status",
        "reward_last20": "reward (last 20)",
        "sampled_accuracy_after": "sampled acc.",
        "greedy_accuracy_after": "greedy acc.",
        "seconds": "s",
    }
    # a column no job has a value in (held-out accuracy with evaluation off) is left out: the table stays narrow
    headers = {
        c: h
        for c, h in headers.items()
        if c in ("job", "overrides", "status") or any(r.get(c) is not None for r in rows)
    }
    for col, header in headers.items():
        table.add_column(header, justify="left" if col in ("overrides", "status") else "right", overflow="fold")
    for r, overrides in zip(rows, swept):
        cells = [
            f"{r[c]:.3f}" if isinstance(r.get(c), float) else "" if r.get(c) is None else str(r[c]) for c in headers
        ]
        cells[1] = overrides
        if r["status"] == "failed":
            cells[2] = "[red]failed[/]"
        table.add_row(*cells)
    console = Console()
    console.print(table)
    for r in rows:
        if r["status"] == "failed":
            console.print(f"[red]job {r['job']} failed:[/] {escape(r['error'])}", highlight=False)
    return [str(r["job"]) for r in rows if r["status"] == "failed"]


def varying_overrides(per_job: list[list[str]]) -> list[str]:
    """Each job's overrides restricted to the keys whose values differ between jobs."""
    parsed = [dict(o.split("=", 1) for o in job if "=" in o) for job in per_job]
    keys = [k for k in dict.fromkeys(k for p in parsed for k in p) if len({p.get(k) for p in parsed}) > 1]
    # the key's last part when that names it alone (lr=0.001, not optimizer.lr=0.001): the table stays narrow
    short = {
        k: k.rpartition(".")[2] if sum(x.rpartition(".")[2] == k.rpartition(".")[2] for x in keys) == 1 else k
        for k in keys
    }
    return [" ".join(f"{short[k]}={p.get(k)}".replace("\\:", ":") for k in keys) for p in parsed]  # Hydra escapes ':'
