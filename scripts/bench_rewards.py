"""Reward throughput: a slow reward scored in the training process against reward.workers=1 and 2.

    python scripts/bench_rewards.py [--ms 20] [--kind cpu|sleep] [--completions 64] [--repeats 3]

The reward takes `--ms` per completion, busy on the CPU (`cpu`, a verifier) or waiting (`sleep`, a call
to a service). Each setting scores the same batch `--repeats` times, the settings interleaved, after
one warm-up batch (the workers' start); the figures are completions per second, medians, and the
ratio to in-process.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

SLOW = """import time

def score(completions, **kw):
    out = []
    for c in completions:
        end = time.perf_counter() + {seconds}
        if {busy}:
            while time.perf_counter() < end:
                pass
        else:
            time.sleep({seconds})
        out.append(float(len(c) % 2))
    return out
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ms", type=float, default=20.0)
    parser.add_argument("--kind", choices=("cpu", "sleep"), default="cpu")
    parser.add_argument("--completions", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()

    import torch

    from grpo_cli.config import RewardConfig
    from grpo_cli.rewards import build_reward

    home = Path(tempfile.mkdtemp(prefix="bench-rewards-"))
    (home / "slow.py").write_text(SLOW.format(seconds=args.ms / 1000, busy=args.kind == "cpu"))
    completions = [f"completion {i}" for i in range(args.completions)]
    settings = {"in-process": 0, "1 worker": 1, "2 workers": 2}
    rewards = {
        name: build_reward(RewardConfig(name="python", fn="slow.py:score", fn_dir=str(home), workers=n, timeout_s=60.0))
        for name, n in settings.items()
    }
    for reward in rewards.values():  # warm-up: the workers start and build the reward
        reward.score(["p"] * 4, completions[:4], ["1"] * 4)
    rates: dict[str, list[float]] = {name: [] for name in settings}
    for _ in range(args.repeats):
        for name, reward in rewards.items():
            start = time.perf_counter()
            reward.score(["p"] * len(completions), completions, ["1"] * len(completions))
            rates[name].append(len(completions) / (time.perf_counter() - start))
    for reward in rewards.values():
        reward.close()

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        platform.machine(),
    )
    print(
        f"CPU: {cpu}, {len(os.sched_getaffinity(0))} cores, torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()})"
    )
    print(
        f"reward: {args.ms:g} ms per completion ({args.kind}), {args.completions} completions, "
        f"{args.repeats} interleaved repeats, medians"
    )
    base = statistics.median(rates["in-process"])
    for name, values in rates.items():
        rate = statistics.median(values)
        print(f"  {name:<11} {rate:8.1f} completions/s  {rate / base:5.2f}x in-process")


if __name__ == "__main__":
    main()
