"""What a person sees (a rich progress bar, tables, warnings) and what a program reads (metrics.jsonl)."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console as RichConsole
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table


class Console:
    def __init__(self, progress: bool = True):
        self.rich = RichConsole(stderr=True)  # progress, warnings, errors
        self.out = RichConsole()  # results: tables a user may pipe or save
        self.show_progress = progress
        self._progress = None
        self._task = None

    def print(self, *args, **kwargs) -> None:
        self.rich.print(*args, **kwargs)

    def warn(self, message: str) -> None:
        self.rich.print(f"[bold yellow]warning:[/] {message}")

    @contextmanager
    def training(self, total: int, start: int = 0):
        if not self.show_progress:
            yield self
            return
        columns = [
            TextColumn("[bold]train"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("reward [green]{task.fields[reward]}"),
            TextColumn("kl {task.fields[kl]}"),
            TextColumn("{task.fields[step_s]} s/step"),
            TimeRemainingColumn(),
        ]
        with Progress(*columns, console=self.rich, transient=False) as progress:
            self._progress = progress
            self._task = progress.add_task("train", total=total, completed=start, reward="-", kl="-", step_s="-")
            try:
                yield self
            finally:
                self._progress = None

    def step(self, row: dict) -> None:
        if self._progress is None:
            if not self.show_progress:
                self.rich.print(
                    f"step {row['step']}: reward {row['reward_mean']:.3f} kl {row['kl']:.4f} "
                    f"{row['seconds']:.2f}s"
                )
            return
        self._progress.update(
            self._task,
            completed=row["step"],
            reward=f"{row['reward_mean']:.3f}",
            kl=f"{row['kl']:.4f}",
            step_s=f"{row['seconds']:.2f}",
        )

    def eval_table(self, rows: list[dict], title: str = "evaluation") -> None:
        table = Table(title=title)
        keys = [k for k in rows[0] if k not in ("num_prompts",)]
        for k in keys:
            table.add_column(k, justify="right" if isinstance(rows[0][k], (int, float)) else "left")
        for r in rows:
            table.add_row(*[f"{r[k]:.3f}" if isinstance(r[k], float) else str(r[k]) for k in keys])
        self.out.print(table)


    def summary(self, values: dict, title: str = "run summary") -> None:
        """A key/value table: readable at 80 columns whatever the number of keys."""
        table = Table(title=title, show_header=False)
        table.add_column("key", style="bold")
        table.add_column("value", justify="right")
        for k, v in values.items():
            table.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
        self.out.print(table)


class MetricsLog:
    """One JSON object per line; appended as the run goes so a crash keeps every finished row."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def write(self, row: dict) -> None:
        with open(self.path, "a") as f:
            f.write(json.dumps(row) + "\n")

    def truncate(self, step: int) -> None:
        """Keep only rows up to `step` (atomically): a resumed run redoes the steps after it."""
        if not self.path.exists():
            return
        kept = [r for r in self.read() if r.get("step", 0) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(self.path)

    def read(self) -> list[dict]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines() if line.strip()]
