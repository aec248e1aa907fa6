"""model.recompute_pointwise on and off: one forward and backward of a micro-batch, timed and measured.

    python scripts/bench_recompute.py                        # SmolLM2-135M's shape, 1,024 tokens, 3 rounds
    python scripts/bench_recompute.py --model models/SmolLM2-135M-Instruct --tokens 2048

Prints, for each setting: the memory a forward adds per token (what autograd keeps for the backward), after a
warm-up forward and backward, and the process's peak RSS after its backward, both in a fresh process each where glibc
maps every block of 128 KiB or
more on its own (MALLOC_MMAP_THRESHOLD_), so the resident size follows the live tensors; then the seconds of a
forward and backward, the two settings interleaved in one process for --rounds rounds after a warm-up. The model is
--model when given (a local transformers directory), else a Llama with SmolLM2-135M's shape and random weights.
One torch thread unless --threads.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def build(model_path: str | None):
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if model_path:
        return AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    torch.manual_seed(0)
    return LlamaForCausalLM(
        LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
        )
    )


def memory(args, setting: str) -> dict:
    """In this (fresh) process: the resident MiB one forward adds, and the peak after its backward."""
    import resource

    import torch

    from grpo_cli.models import recompute

    torch.set_num_threads(args.threads)
    model = build(args.model)
    recompute.recompute_pointwise(model, setting)
    ids = torch.randint(
        0, min(5000, model.config.vocab_size), (1, args.tokens), generator=torch.Generator().manual_seed(1)
    )

    def rss() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20

    model.model(ids).last_hidden_state.pow(2).mean().backward()  # a warm-up pass: gradients and one-time buffers
    before = rss()
    hidden = model.model(ids).last_hidden_state
    added = rss() - before
    hidden.pow(2).mean().backward()
    return {
        "kib_per_token": added * 1024 / args.tokens,
        "peak_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def timing(args) -> dict:
    import torch

    from grpo_cli.models import recompute

    torch.set_num_threads(args.threads)
    plain = build(args.model)
    lean = build(args.model)
    lean.load_state_dict(plain.state_dict())
    recompute.recompute_pointwise(lean, "true")
    ids = torch.randint(
        0, min(5000, plain.config.vocab_size), (1, args.tokens), generator=torch.Generator().manual_seed(1)
    )
    seconds = {"false": [], "true": []}
    for round_ in range(args.rounds + 1):  # the first round warms up
        for setting, model in (("false", plain), ("true", lean)):
            model.zero_grad(set_to_none=True)
            start = time.perf_counter()
            model.model(ids).last_hidden_state.pow(2).mean().backward()
            if round_:
                seconds[setting].append(time.perf_counter() - start)
    return seconds


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=None, help="a local model directory (default: SmolLM2-135M's shape, random)")
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--child", choices=["false", "true"], help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    if args.child:
        print(json.dumps(memory(args, args.child)))
        return 0
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "131072", "OMP_NUM_THREADS": str(args.threads)}
    passed = list(argv if argv is not None else sys.argv[1:])
    measured = {}
    for setting in ("false", "true"):
        out = subprocess.run(
            [sys.executable, __file__, *passed, "--child", setting], env=env, capture_output=True, text=True
        )
        if out.returncode != 0:
            sys.exit(f"the measuring process (recompute_pointwise={setting}) failed:\n{out.stderr[-3000:]}")
        measured[setting] = json.loads(out.stdout.strip().splitlines()[-1])
    seconds = timing(args)
    import torch

    print(
        f"model {args.model or 'SmolLM2-135M shape, random weights'}, {args.tokens} tokens, fp32, {args.threads} "
        f"thread(s), torch {torch.__version__} ({torch.backends.cpu.get_cpu_capability()})"
    )
    print(f"{'recompute_pointwise':<20}{'KiB/token kept':>16}{'peak RSS MiB':>14}{'fwd+bwd s':>11}")
    for setting in ("false", "true"):
        m, s = measured[setting], seconds[setting]
        print(f"{setting:<20}{m['kib_per_token']:>16.0f}{m['peak_mib']:>14.0f}{sum(s) / len(s):>11.3f}")
    print(
        f"on / off: {measured['true']['kib_per_token'] / measured['false']['kib_per_token']:.2f}x the memory kept, "
        f"{sum(seconds['true']) / sum(seconds['false']):.2f}x the time ({args.rounds} interleaved rounds)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
