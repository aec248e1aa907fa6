"""Throughput of `grpo train` at 1 and N processes on one machine, launched the way users launch it.

    python scripts/bench_ranks.py                        # the default task, 1 rank x 2 threads vs 2 ranks x 1 thread
    python scripts/bench_ranks.py --ranks 1,2 --threads-per-machine 2 --steps 30 --rounds 2
    python scripts/bench_ranks.py --strategy fsdp

Each configuration is a real run: `grpo train` for one rank, `torchrun --nproc-per-node N -m grpo_cli
train trainer.strategy=...` for N, with the same global batch and seed (so the same completions), and
torch threads split so every run uses the same cores. The rounds are interleaved. Reported per step:
the median seconds over the steps after the first few (model loading and the first steps' allocations
excluded) and completion tokens per second; 'speed-up' is against one rank.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run(ranks: int, threads: int, strategy: str, steps: int, extra: list[str], out: Path) -> list[dict]:
    args = [
        f"output_dir={out}",
        f"trainer.steps={steps}",
        f"trainer.threads={threads}",
        "trainer.eval_before_after=false",
        "trainer.progress=false",
        "trainer.log_completions_every=0",
        "trainer.save_every=100000",
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    if ranks == 1:
        cmd = [sys.executable, "-m", "grpo_cli", "train", *args]
    else:
        cmd = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc-per-node",
            str(ranks),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(free_port()),
            "-m",
            "grpo_cli",
            "train",
            f"trainer.strategy={strategy}",
            *args,
        ]
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        raise SystemExit(f"error: {' '.join(cmd)} failed:\n{done.stderr[-2000:]}")
    return [
        json.loads(line)
        for line in (out / "metrics.jsonl").read_text().splitlines()
        if "reward_mean" in json.loads(line)
    ]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ranks", default="1,2", help="comma-separated process counts (default 1,2)")
    p.add_argument("--threads-per-machine", type=int, default=2, help="torch threads shared by the ranks (default 2)")
    p.add_argument("--strategy", default="ddp", choices=["ddp", "fsdp"])
    p.add_argument("--steps", type=int, default=30, help="steps per run (default 30)")
    p.add_argument("--skip", type=int, default=5, help="first steps left out of the timing (default 5)")
    p.add_argument("--rounds", type=int, default=2, help="interleaved repetitions (default 2)")
    p.add_argument("overrides", nargs="*", help="extra `grpo train` overrides, e.g. trainer.prompts_per_step=64")
    args = p.parse_args(argv)
    ranks = [int(r) for r in args.ranks.split(",")]
    times: dict[int, list[float]] = {r: [] for r in ranks}
    tokens: dict[int, list[float]] = {r: [] for r in ranks}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for r in ranks:
                threads = max(1, args.threads_per_machine // r)
                print(
                    f"round {round_ + 1}/{args.rounds}: {r} rank(s) x {threads} thread(s)", file=sys.stderr, flush=True
                )
                rows = run(r, threads, args.strategy, args.steps, args.overrides, Path(tmp) / f"{round_}-{r}")[
                    args.skip :
                ]
                times[r] += [row["seconds"] for row in rows]
                tokens[r] += [row["completion_tokens"] for row in rows]
    table = Table(
        title=f"grpo train on one machine: {args.threads_per_machine} threads shared, strategy {args.strategy} "
        f"for N > 1, steps {args.skip + 1}-{args.steps} of {args.rounds} interleaved runs each"
    )
    for col in ("ranks", "threads/rank", "s/step (median)", "completion tokens/s", "speed-up"):
        table.add_column(col, justify="right")
    base = statistics.median(times[ranks[0]])
    for r in ranks:
        median = statistics.median(times[r])
        table.add_row(
            str(r),
            str(max(1, args.threads_per_machine // r)),
            f"{median:.3f}",
            f"{sum(tokens[r]) / sum(times[r]):.0f}",
            f"{base / median:.2f}x",
        )
    Console(width=120).print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
