"""Rebuild the built-in base model shipped in grpo_cli/assets/tiny (about 3-4 minutes on 2 CPU cores).

    python scripts/build_tiny_model.py                 # writes grpo_cli/assets/tiny
    python scripts/build_tiny_model.py --out /tmp/t --steps 100
    python scripts/build_tiny_model.py --tools          # the tool-calling model, grpo_cli/assets/tiny_tools
    python scripts/build_tiny_model.py --chain          # the multi-call model, grpo_cli/assets/tiny_chain

Deterministic for a given seed on CPU. See scripts/tiny_models/tiny.py for what the warm-up does and why.
"""

import argparse
from pathlib import Path

import torch

from tiny_models import tiny, tiny_chain, tiny_tools


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tools", action="store_true", help="build the tool-calling model (tiny_models/tiny_tools.py)")
    p.add_argument("--chain", action="store_true", help="build the multi-call model (tiny_models/tiny_chain.py)")
    p.add_argument(
        "--out", default=None, help="default: grpo_cli/assets/tiny (tiny_tools with --tools, tiny_chain with --chain)"
    )
    p.add_argument(
        "--steps", type=int, default=None, help="supervised warm-up steps (default 1500; 1200 with --tools or --chain)"
    )
    p.add_argument("--p-correct", type=float, default=0.35, help="share of warm-up targets that are right")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(1)  # faster than 2 for a model this small, and bitwise repeatable
    assets = Path(tiny.__file__).parent / "assets"
    if args.chain:
        out = tiny_chain.build(args.out or assets / "tiny_chain", steps=args.steps or 1200, seed=args.seed)
    elif args.tools:
        out = tiny_tools.build(args.out or assets / "tiny_tools", steps=args.steps or 1200, seed=args.seed)
    else:
        out = tiny.build(
            args.out or assets / "tiny", steps=args.steps or 1500, p_correct=args.p_correct, seed=args.seed
        )
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
