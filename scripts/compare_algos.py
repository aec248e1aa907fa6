"""Train the default task with every algo preset and compare them.

    python scripts/compare_algos.py                       # all presets, 2 at a time
    python scripts/compare_algos.py --algos grpo,dapo --jobs 1 -- trainer.steps=100

Prints a table (preset, steps until the 20-step mean reward reaches 0.9, final reward = mean of the
last 20 steps, held-out greedy accuracy after, seconds) and writes it as CSV beside the runs.
Each run is a real `grpo train` in its own process with one torch thread, so two fit on 2 cores.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from rich.console import Console
from rich.table import Table

PRESETS = ["grpo", "dr_grpo", "dapo", "gspo", "seq_ratio", "cispo", "sapo"]
TARGET = 0.9


def run(algo: str, out: Path, extra: list[str]) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    cmd = [
        sys.executable,
        "-m",
        "grpo_cli.cli",
        "train",
        f"algo={algo}",
        f"output_dir={out / algo}",
        "trainer.progress=false",
        *extra,
    ]
    start = time.perf_counter()
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    seconds = time.perf_counter() - start
    if proc.returncode != 0:
        return {"algo": algo, "error": (proc.stderr or proc.stdout).strip().splitlines()[-1], "seconds": seconds}
    rows = [json.loads(line) for line in (out / algo / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward_mean" in r]  # training rows; held-out eval/ rows have no reward_mean
    rewards = [r["reward_mean"] for r in rows]
    window = [sum(rewards[max(0, i - 19) : i + 1]) / len(rewards[max(0, i - 19) : i + 1]) for i in range(len(rewards))]
    reached = next((rows[i]["step"] for i, m in enumerate(window) if i >= 19 and m >= TARGET), None)
    after = next(
        (line for line in proc.stderr.splitlines() if line.startswith("held-out accuracy on") and "->" in line), ""
    )
    return {
        "algo": algo,
        "steps_to_0.9": reached,
        "first_reward": rewards[0],
        "final_reward": window[-1],
        # "held-out accuracy on N prompts: greedy B -> A, sampled B -> A"
        "accuracy_after": float(after.split("sampled")[1].split("->")[1].split()[0]) if after else None,
        "seconds": seconds,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--algos", default=",".join(PRESETS))
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default=f"runs/compare_algos/{time.strftime('%Y-%m-%d_%H-%M-%S')}")
    p.add_argument("overrides", nargs="*", help="extra `grpo train` overrides for every run")
    args = p.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    algos = args.algos.split(",")
    with ThreadPoolExecutor(args.jobs) as pool:
        results = list(pool.map(lambda a: run(a, out, args.overrides), algos))

    table = Table(title=f"every preset on the default task ({out})")
    for col in (
        "preset",
        "steps to 0.9",
        "first reward",
        "final reward (last 20)",
        "held-out sampled acc. after",
        "seconds",
    ):
        table.add_column(col, justify="left" if col == "preset" else "right")
    for r in results:
        if "error" in r:
            table.add_row(r["algo"], "[red]failed[/]", "", r["error"][:60], "", f"{r['seconds']:.0f}")
            continue
        table.add_row(
            r["algo"],
            str(r["steps_to_0.9"] or "never"),
            f"{r['first_reward']:.3f}",
            f"{r['final_reward']:.3f}",
            f"{r['accuracy_after']:.3f}" if r["accuracy_after"] is not None else "",
            f"{r['seconds']:.0f}",
        )
    Console().print(table)
    with open(out / "compare_algos.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=sorted({k for r in results for k in r}))
        writer.writeheader()
        writer.writerows(results)


if __name__ == "__main__":
    main()
