"""The end of a sweep (`grpo train -m ...`): one row per job in a rich table and in sweep.csv."""

from __future__ import annotations

import csv
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from hydra.types import RunMode
from rich.console import Console
from rich.markup import escape
from rich.table import Table

COLUMNS = ("job", "overrides", "status", "reward_last20", "sampled_accuracy_after", "greedy_accuracy_after",
           "seconds", "run_dir", "error")

# Jobs that stopped on a user mistake (a GrpoError, returned as {"status": "failed"}); the CLI exits 2
# after the sweep when there are any. A job that crashes with a bug never reaches this table: Hydra's
# BasicSweeper re-raises its exception once the batch has run, before on_multirun_end, and the sweep
# ends with that trace (exit 1).
failed_jobs: list[str] = []


class SweepSummary(Callback):
    """Registered in train.yaml under hydra.callbacks; Hydra calls it around every job."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []

    def on_multirun_start(self, config, **kwargs) -> None:
        self.rows.clear()
        failed_jobs.clear()

    def on_job_end(self, config, job_return, **kwargs) -> None:
        if config.hydra.mode != RunMode.MULTIRUN:  # Hydra calls job callbacks for single runs too
            return
        value = job_return._return_value  # the attribute: `.return_value` re-raises a job's exception
        row = {"job": config.hydra.job.num, "overrides": list(job_return.overrides or [])}
        if isinstance(value, dict) and value.get("status") == "failed":
            row.update(status="failed", error=value["error"])
        elif isinstance(value, dict):
            row.update(status="done", **{k: value.get(k) for k in COLUMNS if k in value})
        else:
            row.update(status="done")
        if row["status"] == "failed":
            failed_jobs.append(str(row["job"]))
        self.rows.append(row)

    def on_multirun_end(self, config, **kwargs) -> None:
        if not self.rows:
            return
        sweep_dir = Path(config.hydra.sweep.dir)
        sweep_dir.mkdir(parents=True, exist_ok=True)
        with open(sweep_dir / "sweep.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
            writer.writeheader()
            writer.writerows({**r, "overrides": " ".join(r["overrides"])} for r in self.rows)
        swept = varying_overrides([r["overrides"] for r in self.rows])
        table = Table(title=f"sweep: {len(self.rows)} jobs ({sweep_dir}/sweep.csv)")
        headers = {"job": "job", "overrides": "swept", "status": "status", "reward_last20": "reward (last 20)",
                   "sampled_accuracy_after": "sampled acc.", "greedy_accuracy_after": "greedy acc.", "seconds": "s"}
        for col, header in headers.items():
            table.add_column(header, justify="left" if col in ("overrides", "status") else "right")
        for r, overrides in zip(self.rows, swept):
            cells = [f"{r[c]:.3f}" if isinstance(r.get(c), float) else "" if r.get(c) is None else str(r[c])
                     for c in headers]
            cells[1] = overrides
            if r["status"] == "failed":
                cells[2] = "[red]failed[/]"
            table.add_row(*cells)
        console = Console()
        console.print(table)
        for r in self.rows:
            if r["status"] == "failed":
                console.print(f"[red]job {r['job']} failed:[/] {escape(r['error'])}", highlight=False)


def varying_overrides(per_job: list[list[str]]) -> list[str]:
    """Each job's overrides restricted to the keys whose values differ between jobs."""
    parsed = [dict(o.split("=", 1) for o in job if "=" in o) for job in per_job]
    keys = [k for k in dict.fromkeys(k for p in parsed for k in p) if len({p.get(k) for p in parsed}) > 1]
    return [" ".join(f"{k}={p.get(k)}" for k in keys) for p in parsed]
