"""Rewrite tests/slow_tests.txt, the tests `make test-fast` leaves out, from a pytest `--durations=0` report.

    make slow-list        # runs the default suite with --durations=0 and rewrites the list

A test is listed when its call, setup and teardown together took over --seconds (1 by default) in that run:
mostly whole training runs, which the default suite still runs. --add keeps the tests already listed and adds
the report's (a `make test-fast --durations=0` report finds what has grown slow since).
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("report", help="pytest's output with --durations=0")
    ap.add_argument("--seconds", type=float, default=1.0)
    ap.add_argument("--add", action="store_true", help="keep the tests already listed")
    args = ap.parse_args(argv)
    seconds = defaultdict(float)
    listed = ROOT / "tests" / "slow_tests.txt"
    kept = {}
    if args.add and listed.exists():
        for line in listed.read_text().splitlines():
            if line.strip() and not line.startswith("#"):
                test, took = line.rsplit("  ", 1)
                kept[test.strip()] = float(took.rstrip("s"))
    for line in Path(args.report).read_text().splitlines():
        m = re.match(r"\s*([0-9.]+)s (call|setup|teardown)\s+(.+?)\s*$", line)
        if m:
            seconds[m.group(3)] += float(m.group(1))
    if not seconds:
        print(f"error: {args.report} has no durations; run pytest with --durations=0.", file=sys.stderr)
        return 2
    slow = sorted(
        (s, t)
        for t, s in {**kept, **{t: s for t, s in seconds.items() if s > args.seconds}}.items()
        if s > args.seconds
    )
    lines = [
        f"# Tests over {args.seconds:g} s in a full run (scripts/slow_tests.py): `make test-fast` leaves them out.",
        *(f"{t}  {s:.1f}s" for s, t in reversed(slow)),
    ]
    listed.write_text("\n".join(lines) + "\n")
    print(f"{len(slow)} tests listed ({len(kept)} kept, {len(seconds)} in the report): tests/slow_tests.txt")
    return 0


if __name__ == "__main__":
    sys.exit(main())
