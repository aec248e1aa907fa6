"""What reward=code's sandbox costs: one test of a 10-line program (median ms a call, tests one after
another), and a code-RL step's scoring (64 completions x 3 assert tests, one thread per core, as the
reward runs them). Variants run in turn, in processes of their own, repeats interleaved.

    python scripts/bench_sandbox.py                            # isolation os and process
    python scripts/bench_sandbox.py --also OLD_CHECKOUT        # and another checkout's sandbox (its default)
    python scripts/bench_sandbox.py --env                      # environment workers: env.sandbox none and os
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROGRAM = '''def f(words):
    """The words' lengths, longest first, ties in their first order."""
    seen = {}
    for w in words:
        if w not in seen:
            seen[w] = len(w)
    ordered = sorted(seen.items(), key=lambda kv: -kv[1])
    return [n for _, n in ordered]


total = sum(f(["a", "bb"]))
'''
TESTS = ["assert f(['aa', 'b', 'ccc']) == [3, 2, 1]", "assert f([]) == []", "assert f(['x', 'x']) == [1]"]


def measure(calls: int, completions: int, isolation: str | None) -> dict:
    """In this process: the median single call and one step's scoring."""
    from concurrent.futures import ThreadPoolExecutor

    from grpo_cli.rewards.code import parse_tests
    from grpo_cli.sandbox.program import Sandbox

    sandbox = Sandbox(2, 512, 1024, 16, *([isolation] if isolation else []))
    tests = [parse_tests([t], 0, "tests")[0] for t in TESTS]
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        assert sandbox.passes(PROGRAM, *tests[0])
        times.append(time.perf_counter() - start)
    jobs = [t for _ in range(completions) for t in tests]
    start = time.perf_counter()
    with ThreadPoolExecutor(len(os.sched_getaffinity(0))) as pool:
        assert all(pool.map(lambda t: sandbox.passes(PROGRAM, *t), jobs))
    return {"call_ms": 1000 * statistics.median(times), "step_s": time.perf_counter() - start}


def measure_env(calls: int, sandbox: str) -> dict:
    """In this process: an environment worker's start (the first episode's environment made) and the median
    round trip of a tool call (the demo's add), env.sandbox `sandbox`."""
    from grpo_cli.config import EnvConfig
    from grpo_cli.episodes.environments import environment

    spec = environment(EnvConfig(tools=["grpo_cli.demo.tools:add"], workers=1, sandbox=sandbox))
    start = time.perf_counter()
    add = spec.tools_of(spec.new({}, 1))["add"]
    started = time.perf_counter() - start
    times = []
    for i in range(calls):
        start = time.perf_counter()
        assert add.remote_call((), {"a": i, "b": 1}, 10.0, i) == i + 1
        times.append(time.perf_counter() - start)
    spec.workers.close()
    return {"start_s": started, "call_ms": 1000 * statistics.median(times)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--calls", type=int, default=30)
    ap.add_argument("--completions", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--also", help="another checkout of grpo-cli, measured with its own default sandbox")
    ap.add_argument("--env", action="store_true", help="measure environment workers (env.sandbox none, os) instead")
    ap.add_argument("--one", nargs=2, help=argparse.SUPPRESS)  # PATH ISOLATION: measure in this process
    args = ap.parse_args()
    if args.one:
        path, isolation = args.one
        sys.path.insert(0, path)
        if isolation.startswith("env-"):
            print(json.dumps(measure_env(args.calls, isolation.removeprefix("env-"))))
        else:
            print(json.dumps(measure(args.calls, args.completions, None if isolation == "default" else isolation)))
        return
    variants = [("os", str(ROOT), "os"), ("process", str(ROOT), "process")]
    if args.env:
        variants = [(f"env.sandbox={s}", str(ROOT), f"env-{s}") for s in ("none", "os")]
    if args.also:
        variants.append((f"{args.also} (its default)", args.also, "default"))
    results = {name: [] for name, _, _ in variants}
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for _ in range(args.repeats):
        for name, path, isolation in variants:
            out = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--calls",
                    str(args.calls),
                    "--completions",
                    str(args.completions),
                    "--one",
                    path,
                    isolation,
                ],
                env=env,
                capture_output=True,
                text=True,
                check=True,
                cwd=path,
            )
            results[name].append(json.loads(out.stdout.strip().splitlines()[-1]))
    import platform

    print(
        f"{platform.processor() or platform.machine()}, {len(os.sched_getaffinity(0))} cores, uid {os.getuid()}; "
        f"medians of {args.repeats} interleaved repeats"
    )
    if args.env:
        print("| environment worker | s to start | ms a tool call (round trip) |\n| --- | ---: | ---: |")
        for name, runs in results.items():
            print(
                f"| {name} | {statistics.median(r['start_s'] for r in runs):.2f} | "
                f"{statistics.median(r['call_ms'] for r in runs):.2f} |"
            )
        return
    print(f"| sandbox | ms a test (one at a time) | s to score {args.completions} completions x {len(TESTS)} tests |")
    print("| --- | ---: | ---: |")
    for name, runs in results.items():
        print(
            f"| {name} | {statistics.median(r['call_ms'] for r in runs):.0f} | "
            f"{statistics.median(r['step_s'] for r in runs):.2f} |"
        )


if __name__ == "__main__":
    main()
