"""Each phase of a run against its floor: runs `grpo train` in a fresh process (one torch thread unless
--threads), then prints, per phase, the seconds per step, the floor per step and the efficiency (floor /
seconds) from the run's own metrics rows (`efficiency/<phase>`, grpo_cli/run/floors.py), with the machine
and the peaks it was measured against.

    python scripts/bench_floors.py                                   # the built-in default task, 20 steps
    python scripts/bench_floors.py --task smollm2                    # SmolLM2-135M-Instruct (make smollm2)
    python scripts/bench_floors.py --task long --steps 3             # SmolLM2, G = 4, up to 256 new tokens, fp32
    python scripts/bench_floors.py --steps 5 -- algo.beta=0          # more overrides after --

Runs with a generation worker log the update's efficiency alone (their generation time is the worker's).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct"
TASKS = {
    "default": [],
    "smollm2": ["experiment=smollm2_arithmetic", f"model.path={SMOLLM2}"],
    # the long, variable-length workload's shape: a real model, G = 4, completions up to 256 tokens, fp32
    "long": [
        "experiment=smollm2_arithmetic",
        f"model.path={SMOLLM2}",
        "sampler.group_size=4",
        "sampler.max_new_tokens=256",
        "data.system_prompt=null",
        "trainer.precision=fp32",
    ],
}
PHASES = ("generation", "scoring", "update")


def table(rows: list[dict]) -> list[str]:
    """Per phase: mean seconds per step, the floor per step (efficiency x seconds, row by row), and the
    efficiency over the run (the floors summed over the seconds summed)."""
    sys.path.insert(0, str(ROOT))
    from grpo_cli.run.floors import phase_seconds

    out = [f"{'phase':<12}{'s/step':>10}{'floor s/step':>14}{'efficiency':>12}"]
    spent = phase_seconds(rows)
    for phase in PHASES:
        timed = [r for r in rows if f"efficiency/{phase}" in r]
        if not timed:
            out.append(f"{phase:<12}{spent[phase] / len(rows):>10.3f}{'-':>14}{'-':>12}")
            continue
        floor = sum(r[f"efficiency/{phase}"] * phase_seconds([r])[phase] for r in timed)
        seconds = sum(phase_seconds([r])[phase] for r in timed)
        out.append(f"{phase:<12}{seconds / len(timed):>10.3f}{floor / len(timed):>14.3f}{floor / seconds:>12.2f}")
    wall = sum(r["seconds"] for r in rows) / len(rows)
    out.append(f"{'step (wall)':<12}{wall:>10.3f}")
    positions = sum(r.get("completion_len_max", 0.0) for r in rows)  # decode steps: the longest row's length
    if positions:
        out.append(
            f"generation: {1000 * spent['generation'] / positions:.1f} ms a decode step "
            f"({positions / len(rows):.0f} steps a step, the longest completion's length)"
        )
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--task", choices=sorted(TASKS), default="default")
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("overrides", nargs="*", help="more grpo train overrides (after --)")
    args = ap.parse_args(argv)
    if args.task != "default" and not (SMOLLM2 / "model.safetensors").exists():
        print(f"error: {SMOLLM2} is missing; build it with make smollm2.", file=sys.stderr)
        return 2
    cache = Path(os.environ.get("GRPO_CLI_CACHE") or Path.home() / ".cache" / "grpo-cli") / "peaks.json"
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads), "MKL_NUM_THREADS": str(args.threads)}
    with tempfile.TemporaryDirectory() as tmp:
        command = [
            sys.executable,
            "-m",
            "grpo_cli",
            "train",
            *TASKS[args.task],
            f"trainer.steps={args.steps}",
            f"trainer.threads={args.threads}",
            "trainer.eval_before_after=false",
            "trainer.eval_every=0",
            "trainer.log_completions_every=0",
            "trainer.progress=false",
            f"trainer.save_every={args.steps}",
            f"output_dir={tmp}/run",
            *args.overrides,
        ]
        done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True)
        if done.returncode:
            print(done.stderr[-3000:], file=sys.stderr)
            return done.returncode
        rows = [json.loads(line) for line in (Path(tmp) / "run" / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward_mean" in r]
    print(f"task {args.task}: {args.steps} steps, {args.threads} thread(s): {' '.join(command[3:])}")
    print(f"machine peaks (bandwidth B/s, FLOP/s), probed once and cached in {cache}:")
    for key, (bandwidth, flops) in (json.loads(cache.read_text()) if cache.exists() else {}).items():
        print(f"  {key}: {bandwidth / 1e9:.1f} GB/s, {flops / 1e9:.0f} GFLOP/s")
    print("\n".join(table(rows)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
