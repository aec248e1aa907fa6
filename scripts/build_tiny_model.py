"""Rebuild the built-in base model shipped in grpo_cli/assets/tiny (about 3-4 minutes on 2 CPU cores).

    python scripts/build_tiny_model.py                 # writes grpo_cli/assets/tiny
    python scripts/build_tiny_model.py --out /tmp/t --steps 100

Deterministic for a given seed on CPU. See grpo_cli/tiny.py for what the warm-up does and why.
"""

import argparse
from pathlib import Path

import torch

from grpo_cli import tiny


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(Path(tiny.__file__).parent / "assets" / "tiny"))
    p.add_argument("--steps", type=int, default=1500, help="supervised warm-up steps (batch 128)")
    p.add_argument("--p-correct", type=float, default=0.35, help="share of warm-up targets that are right")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)  # faster than 2 for a model this small, and bitwise repeatable
    out = tiny.build(args.out, steps=args.steps, p_correct=args.p_correct, seed=args.seed)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
