"""The end of a sweep (`grpo train -m ...`): one row per job in a rich table and in sweep.csv."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
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

SUMMARY_FILE = "summary.json"  # each job writes its row (cli.write_job_summary); the table is built from them

# Jobs that stopped on a user mistake (a GrpoError: status "failed" in their summary.json); the CLI exits 2
# after the sweep when there are any. A job that crashes with a bug writes no summary: the launcher
# re-raises its exception once the batch has run, before on_multirun_end, and the sweep ends with that trace.
failed_jobs: list[str] = []


class SweepSummary(Callback):
    """Registered in train.yaml under hydra.callbacks. At the end of a sweep it reads the summary.json
    each job wrote in its own directory, so the table is the same whatever process ran the jobs."""

    def on_multirun_start(self, config, **kwargs) -> None:
        failed_jobs.clear()

    def read_rows(self, sweep_dir: Path) -> list[dict[str, Any]]:
        rows = []
        for path in sorted(sweep_dir.glob(f"*/{SUMMARY_FILE}")) + sorted(sweep_dir.glob(f"*/*/{SUMMARY_FILE}")):
            try:
                row = json.loads(path.read_text())
            except (OSError, json.JSONDecodeError) as e:
                Console(stderr=True).print(f"[yellow]warning:[/] skipping {path} ({e}) in the sweep table")
                continue
            rows.append({**row, "status": row.get("status", "done")})
        return sorted(rows, key=lambda r: int(r.get("job", 0)))

    def on_multirun_end(self, config, **kwargs) -> None:
        sweep_dir = Path(config.hydra.sweep.dir)
        self.rows = self.read_rows(sweep_dir)
        if not self.rows:
            return
        failed_jobs.extend(str(r["job"]) for r in self.rows if r["status"] == "failed")
        with open(sweep_dir / "sweep.csv", "w", newline="") as f:
            writer = csv.DictWriter(f, fieldnames=list(COLUMNS), extrasaction="ignore")
            writer.writeheader()
            writer.writerows({**r, "overrides": " ".join(r["overrides"])} for r in self.rows)
        swept = varying_overrides([r["overrides"] for r in self.rows])
        table = Table(title=f"sweep: {len(self.rows)} jobs ({sweep_dir}/sweep.csv)")
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
            if c in ("job", "overrides", "status") or any(r.get(c) is not None for r in self.rows)
        }
        for col, header in headers.items():
            table.add_column(header, justify="left" if col in ("overrides", "status") else "right", overflow="fold")
        for r, overrides in zip(self.rows, swept):
            cells = [
                f"{r[c]:.3f}" if isinstance(r.get(c), float) else "" if r.get(c) is None else str(r[c]) for c in headers
            ]
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
    # the key's last part when that names it alone (lr=0.001, not optimizer.lr=0.001): the table stays narrow
    short = {
        k: k.rpartition(".")[2] if sum(x.rpartition(".")[2] == k.rpartition(".")[2] for x in keys) == 1 else k
        for k in keys
    }
    return [" ".join(f"{short[k]}={p.get(k)}".replace("\\:", ":") for k in keys) for p in parsed]  # Hydra escapes ':'
