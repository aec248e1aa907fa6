"""What a person sees (a rich progress bar, tables, warnings) and what a program reads (metrics.jsonl,
and TensorBoard event files when asked for)."""

from __future__ import annotations

import json
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console as RichConsole
from rich.markup import escape
from rich.measure import Measurement
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
from rich.table import Table

from grpo_cli.errors import write_failure

STARTED = time.perf_counter()  # cli.main resets it when a command starts: phase lines count from there


class Console:
    def __init__(self, progress: bool = True, quiet: bool = False, label: str = ""):
        # quiet: a rank other than 0 under torchrun, which says nothing but its errors
        # label: what each step line starts with, e.g. "job 3 " in a sweep whose jobs share one terminal
        self.label = label
        self.rich = RichConsole(stderr=True, quiet=quiet)  # progress and warnings
        if not self.rich.is_terminal:  # a log file (nohup, Slurm, CI): whole lines, never wrapped at 80 columns
            self.rich = RichConsole(stderr=True, quiet=quiet, soft_wrap=True)
        self.out = RichConsole(quiet=quiet)  # results: tables a user may pipe or save
        self._errors = RichConsole(stderr=True)
        self.show_progress = progress and not quiet
        self._progress: Any = None  # rich's Progress while training in a terminal
        self._task: Any = None  # its task
        self._plain: dict | None = (
            None  # outside a terminal: (total, log_every, time of the last line, start time, first step)
        )

    def error(self, message: str) -> None:
        """One sentence, printed whole (never wrapped mid-sentence), whatever the terminal."""
        self._errors.print(f"[bold red]error:[/] {escape(message)}", highlight=False, soft_wrap=True)

    def print(self, *args, **kwargs) -> None:
        self.rich.print(*args, **kwargs)

    def phase(self, message: str) -> None:
        """One line of a command's start (what loaded, what runs next), with the seconds since it began, so
        the wait before the first step is never silent, in a terminal or a log file."""
        self.rich.print(f"[dim]{time.perf_counter() - STARTED:5.1f}s[/] {escape(message)}", highlight=False)

    def announce_stop(self, signum: int) -> None:
        """A signal's first time: the run finishes its step and saves (stopping.GracefulStop calls it)."""
        import signal

        self.warn(
            f"{signal.Signals(signum).name}: finishing this step and saving a checkpoint (press Ctrl-C again to "
            "stop at once)"
        )

    def warn(self, message: str) -> None:
        self.rich.print(f"[bold yellow]warning:[/] {message}")

    @contextmanager
    def training(self, total: int, start: int = 0, log_every: int = 1, every_seconds: float = 30.0):
        """A live bar in a terminal; elsewhere one plain line every `log_every` steps or `every_seconds`,
        whichever comes first, so a log file shows the reward as the run goes."""
        if not self.show_progress:
            yield self
            return
        if not self.rich.is_terminal:
            now = time.monotonic()
            self._plain = {
                "total": total,
                "every": log_every,
                "seconds": every_seconds,
                "last": now,
                "t0": now,
                "first": start,
            }
            try:
                yield self
            finally:
                self._plain = None
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

    @contextmanager
    def task(self, description: str, total: int, every_seconds: float = 10.0):
        """Progress of a long job that is not training (an evaluation): a bar in a terminal, elsewhere a
        plain line at most every `every_seconds` and at the end. Yields advance(n)."""
        if self.rich.quiet:
            yield lambda n=1: None
            return
        if self.rich.is_terminal:
            with Progress(
                TextColumn(f"[bold]{escape(description)}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeRemainingColumn(),
                console=self.rich,
                transient=True,
            ) as progress:
                task = progress.add_task(description, total=total)
                yield lambda n=1: progress.advance(task, n)
            return
        state = {"done": 0, "last": time.monotonic()}

        def advance(n: int = 1) -> None:
            state["done"] += n
            now = time.monotonic()
            if state["done"] >= total or now - state["last"] >= every_seconds:
                state["last"] = now
                self.rich.print(f"{description}: {state['done']}/{total}", highlight=False)

        self.rich.print(f"{description}: 0/{total}", highlight=False)
        yield advance

    def step(self, row: dict) -> None:
        tools = f"  tool use {row['env/tool_use_frac']:.2f}" if "env/tool_use_frac" in row else ""  # episodes
        if self._plain is not None:
            p, now, step = self._plain, time.monotonic(), row["step"]
            if step % p["every"] == 0 or step == p["total"] or now - p["last"] >= p["seconds"]:
                p["last"] = now
                done = step - p["first"]
                left = (now - p["t0"]) / max(done, 1) * (p["total"] - step)
                self.rich.print(
                    f"{self.label}step {step}/{p['total']}  reward {row['reward_mean']:.3f}  kl {row['kl']:.4f}"
                    f"{tools}  {row['seconds']:.2f} s/step  eta {_clock(left)}",
                    highlight=False,
                )
            return
        if self._progress is None:
            if not self.show_progress:
                self.rich.print(
                    f"{self.label}step {row['step']}: reward {row['reward_mean']:.3f} kl {row['kl']:.4f}{tools} "
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

    def eval_table(
        self, rows: list[dict], columns: dict[str, str], title: str = "evaluation", caption: str = ""
    ) -> None:
        """One row per model (`columns` maps each key shown to its header, the first naming the model);
        turned on its side, one column per model, when that would not fit the terminal."""
        cell = lambda v: f"{v:.3f}" if isinstance(v, float) else "" if v is None else str(v)  # noqa: E731
        name, *keys = columns
        table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
        table.add_column(columns[name], min_width=min(max(len(str(r[name])) for r in rows), 24), overflow="fold")
        for k in keys:
            table.add_column(columns[k], justify="right", no_wrap=True)
        for r in rows:
            table.add_row(*[cell(r[k]) for k in columns])
        if Measurement.get(self.out, self.out.options.update(max_width=10_000), table).maximum > self.out.width:
            table = Table(title=title, caption=caption, box=box.SIMPLE_HEAD, pad_edge=False, collapse_padding=True)
            table.add_column("", no_wrap=True)
            for r in rows:
                table.add_column(str(r[name]), justify="right", overflow="fold")
            for k in keys:
                table.add_row(columns[k], *[cell(r[k]) for r in rows])
        self.out.print(table)

    def completions(self, rows: list[dict], heading: str, limit: int = 8) -> None:
        """A group of sampled completions, each distinct one once with its count, reward and advantage."""
        distinct: dict[str, list] = {}
        for r in rows:
            distinct.setdefault(r["completion"], [r, 0])[1] += 1
        table = Table(box=box.SIMPLE_HEAD, pad_edge=False)
        for col in ("completion", "times", "reward", "advantage"):
            table.add_column(col, justify="left" if col == "completion" else "right")
        for completion, (r, times) in list(distinct.items())[:limit]:
            text = completion if "messages" in r else repr(completion)  # an episode's transcript: a line per message
            table.add_row(
                escape(text),
                str(times),
                "none" if r["reward"] is None else f"{r['reward']:.3f}",
                f"{r['advantage']:+.3f}",
            )
        self.rich.print(escape(heading))
        self.rich.print(table)

    def summary(self, values: dict, title: str = "run summary") -> None:
        """A key/value table: readable at 80 columns whatever the number of keys."""
        table = Table(title=title, show_header=False)
        table.add_column("key", style="bold")
        table.add_column("value", justify="right")
        for k, v in values.items():
            table.add_row(k, f"{v:.3f}" if isinstance(v, float) else str(v))
        self.out.print(table)


def _clock(seconds: float) -> str:
    seconds = int(round(seconds))
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"


class MetricsLog:
    """One JSON object per line; appended as the run goes so a crash keeps every finished row. Each row
    also goes to every tracker in `trackers` (trackers.py: TensorBoard, wandb, MLflow, trackio)."""

    def __init__(self, path: Path, trackers: list | None = None, enabled: bool = True):
        self.path = Path(path)
        self.enabled = enabled  # under torchrun only rank 0 writes
        if enabled:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self.trackers = trackers or []

    def close(self) -> None:
        for tracker in self.trackers:
            tracker.close()

    def write(self, row: dict) -> None:
        if not self.enabled:
            return
        try:
            with open(self.path, "a") as f:
                f.write(json.dumps(row) + "\n")
        except OSError as e:
            raise write_failure(self.path, e) from None
        for tracker in self.trackers:
            tracker.write(row)

    def truncate(self, step: int) -> None:
        """Keep only rows up to `step` (atomically): a resumed run redoes the steps after it."""
        if not self.enabled or not self.path.exists():
            return
        kept = [r for r in self.read() if r.get("step", 0) <= step]
        tmp = self.path.with_suffix(".jsonl.tmp")
        tmp.write_text("".join(json.dumps(r) + "\n" for r in kept))
        tmp.replace(self.path)

    def read(self) -> list[dict]:
        """Every row; a last line that does not parse is dropped: a kill in mid-write leaves half a row."""
        if not self.path.exists():
            return []
        lines = [line for line in self.path.read_text().splitlines() if line.strip()]
        rows = [json.loads(line) for line in lines[:-1]]
        try:
            return rows + [json.loads(line) for line in lines[-1:]]
        except json.JSONDecodeError:
            return rows
