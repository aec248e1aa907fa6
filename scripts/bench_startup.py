"""How fast grpo answers: `--help`, `--cfg job`, a Tab completion, and the first line a `grpo train` prints.

    python scripts/bench_startup.py                       # this checkout
    python scripts/bench_startup.py . /tmp/before         # two checkouts, interleaved round by round

Each checkout runs as `python -m grpo_cli.cli` from its own root (so its own package is imported), one
torch thread, in the same rounds, so machine load falls on both alike. Prints the median and range of
each measure, in seconds, per checkout.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def wall(root: Path, args: list[str], env: dict | None = None) -> float:
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "grpo_cli.cli", *args],
        cwd=root,
        env={**ENV, **(env or {})},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
        timeout=300,
    )
    return time.perf_counter() - start


def first_line(root: Path, out_dir: str) -> float:
    """Seconds from launching `grpo train` (the built-in default) to its first line on stdout or stderr."""
    start = time.perf_counter()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grpo_cli.cli",
            "train",
            f"output_dir={out_dir}",
            "overwrite=true",
            "trainer.progress=false",
        ],
        cwd=root,
        env=ENV,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    proc.stdout.readline()
    seconds = time.perf_counter() - start
    proc.kill()
    proc.wait()
    return seconds


MEASURES = {
    "--help": lambda root, tmp: wall(root, ["train", "--help"]),
    "--cfg job": lambda root, tmp: wall(root, ["train", "--cfg", "job"]),
    "Tab completion": lambda root, tmp: wall(
        root, ["train", "-sc", "query=bash"], {"COMP_LINE": "grpo trainer.st", "COMP_POINT": "15"}
    ),
    "first line of grpo train": lambda root, tmp: first_line(root, tmp),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("roots", nargs="*", default=["."], help="checkouts to compare (repository roots)")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    roots = [Path(r).resolve() for r in args.roots]
    times = {(r, m): [] for r in roots for m in MEASURES}
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(args.rounds):
            for measure, fn in MEASURES.items():
                for root in roots:
                    times[(root, measure)].append(fn(root, str(Path(tmp) / "run")))
    print(f"{'measure':<26}" + "".join(f"{str(r)[-28:]:>30}" for r in roots))
    for measure in MEASURES:
        cells = []
        for root in roots:
            t = times[(root, measure)]
            cells.append(f"{statistics.median(t):.2f} s ({min(t):.2f}-{max(t):.2f})")
        print(f"{measure:<26}" + "".join(f"{c:>30}" for c in cells))


if __name__ == "__main__":
    main()
