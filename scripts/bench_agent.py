"""The tool demo's step time with its agent written as code against the endpoint (experiment=tool_agent) against
the in-process tool driver (experiment=tool_use), side by side.

    python scripts/bench_agent.py                        # 8 prompts x 8 = 64 episodes a step, 6 steps, 3 rounds
    python scripts/bench_agent.py --prompts 16 --rounds 2
    python scripts/bench_agent.py --agent-workers 2      # and the agent in 2 helper processes (env.workers=2)

Each round trains both from the same seed, one after the other (interleaved, so a busy machine slows both), one
torch thread each, without held-out scoring. Prints the median seconds per step and generation seconds per step
over steps 2 on (the first warms up), their ratios, and whether the two runs logged the same reward every step.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path


def run(experiment: str, args, out: Path, extra: list[str]) -> list[dict]:
    cmd = [sys.executable, "-m", "grpo_cli", "train", f"experiment={experiment}", f"output_dir={out}", *extra]
    cmd += [
        f"trainer.steps={args.steps}",
        f"trainer.prompts_per_step={args.prompts}",
        "trainer.eval_before_after=false",
    ]
    cmd += ["trainer.eval_every=0", f"env.concurrency={args.prompts * 8}"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if done.returncode != 0:
        sys.exit(f"{experiment} failed:\n{done.stdout[-2000:]}\n{done.stderr[-2000:]}")
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    return [r for r in rows if r.get("kind") is None and "seconds" in r]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--prompts", type=int, default=8, help="prompts a step (8 episodes each)")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--agent-workers", type=int, default=0, help="also the agent in N helper processes")
    args = parser.parse_args()
    arms = {"in-process driver": ("tool_use", []), "agent via the endpoint": ("tool_agent", [])}
    if args.agent_workers:
        arms[f"agent in {args.agent_workers} workers"] = ("tool_agent", [f"env.workers={args.agent_workers}"])
    figures: dict[str, dict[str, list[float]]] = {label: {"seconds": [], "gen_s": []} for label in arms}
    same = True
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            rewards = []
            for i, (label, (experiment, extra)) in enumerate(arms.items()):
                rows = run(experiment, args, Path(tmp) / f"{i}-{r}", extra)
                for key in ("seconds", "gen_s"):
                    figures[label][key] += [row[key] for row in rows[1:]]
                rewards.append([x["reward_mean"] for x in rows])
            same &= all(x == rewards[0] for x in rewards)
    print(f"{args.prompts * 8} episodes a step, {args.steps} steps x {args.rounds} rounds (medians of steps 2 on)")
    print("| | s/step | generation s/step | step ratio | generation ratio |\n|---|---|---|---|---|")
    base = {k: statistics.median(figures["in-process driver"][k]) for k in ("seconds", "gen_s")}
    for label, f in figures.items():
        step, gen = statistics.median(f["seconds"]), statistics.median(f["gen_s"])
        print(f"| {label} | {step:.3f} | {gen:.3f} | {step / base['seconds']:.2f}x | {gen / base['gen_s']:.2f}x |")
    print(f"same reward every step: {same}")


if __name__ == "__main__":
    main()
