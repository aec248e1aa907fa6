"""How many steps the default task needs with one-step-stale sampling, against on-policy.

    python scripts/compare_staleness.py                      # seeds 0 1 2, max_staleness 0 and 1
    python scripts/compare_staleness.py --seeds 0 --staleness 0,1,2 --target 0.9

Each run is `grpo train` on the embedded default (builtin:tiny, arithmetic, exact match) with
trainer.threads=1 and no held-out scoring; a run with max_staleness > 0 generates in a worker process
(one more thread). For each run it prints the first step at which the mean training reward over the
last --window steps reaches --target, and per staleness the mean of those steps over the seeds with
its ratio to on-policy. Runs go one at a time, interleaved by seed.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path


def steps_to(rows: list[dict], target: float, window: int) -> int | None:
    rewards = [r["reward_mean"] for r in rows if "reward_mean" in r]
    for i in range(window, len(rewards) + 1):
        if sum(rewards[i - window : i]) / window >= target:
            return i
    return None


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--staleness", default="0,1")
    p.add_argument("--target", type=float, default=0.9)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--steps", type=int, default=300)
    a = p.parse_args(argv)
    seeds = [int(s) for s in a.seeds.split(",")]
    ks = [int(k) for k in a.staleness.split(",")]
    found: dict[int, list] = {k: [] for k in ks}
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for k in ks:
                out = Path(tmp) / f"s{seed}-k{k}"
                cmd = [
                    sys.executable,
                    "-m",
                    "grpo_cli.cli",
                    "train",
                    f"trainer.seed={seed}",
                    f"trainer.max_staleness={k}",
                    f"trainer.steps={a.steps}",
                    "trainer.threads=1",
                    "trainer.eval_before_after=false",
                    "trainer.eval_every=0",
                    "trainer.progress=false",
                    "trainer.log_completions_every=0",
                    f"output_dir={out}",
                ]
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
                n = steps_to(rows, a.target, a.window)
                found[k].append(n)
                secs = sum(r.get("seconds", 0) for r in rows)
                print(
                    f"seed {seed}  max_staleness {k}: {a.window}-step mean reward >= {a.target} at step {n}  "
                    f"(step seconds summed {secs:.0f})",
                    flush=True,
                )
    base = found[ks[0]]
    for k in ks:
        got = found[k]
        if None in got or None in base:
            print(f"max_staleness {k}: steps {got} (None: not reached in {a.steps})")
            continue
        mean, ratio = sum(got) / len(got), sum(got) / sum(base)
        print(f"max_staleness {k}: steps {got}, mean {mean:.1f}, {ratio:.2f}x the steps of max_staleness {ks[0]}")


if __name__ == "__main__":
    main()
