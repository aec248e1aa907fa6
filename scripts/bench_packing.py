"""Packed against padded batches at the same settings: seconds and peak RSS of the scoring phase (the
reference's no-grad forward) and the update (forward, backward, AdamW), on one rollout whose completion
lengths spread the way a long reasoning run's do.

    python scripts/bench_packing.py                       # SmolLM2-135M's shape, 2 x 8 rows, cap 512
    python scripts/bench_packing.py --max-new-tokens 1024 --rounds 2
    python scripts/bench_packing.py --budget 2048         # a third run: packed, 2,048-token micro-batches

The model has SmolLM2-135M-Instruct's architecture (`models/SmolLM2-135M-Instruct` when `make smollm2`
has built it, else random weights of that shape). The rollout: G completions of each prompt (prompt
40 tokens), half the groups short answers (lengths 3 to 60) and half open-ended (200 to the cap, a
quarter of them at the cap), drawn from a seeded generator; generation is not run, since packing does
not touch it. Each run is a fresh child process (its peak RSS is its own), runs alternate, and the
same micro-batch size in rows is used for both (--micro-batch), so only the layout differs. On CPU the
peaks are the process's resident high-water mark after scoring and at the end; on CUDA (--device cuda)
they are torch's peak allocation during scoring and during the update.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct"
PROMPT_LEN = 40


def lengths(n_groups: int, G: int, cap: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    out = []
    for g in range(n_groups):
        if g % 2 == 0:
            out += [rng.randint(3, 60) for _ in range(G)]
        else:
            out += [cap if rng.random() < 0.25 else rng.randint(min(200, cap // 2), cap) for _ in range(G)]
    return out


def child(args) -> dict:
    import torch
    import transformers

    from grpo_cli.config import TrainConfig
    from grpo_cli.models.forward import score
    from grpo_cli.models.logprobs import enable_logprob_forward
    from grpo_cli.models.memory import peak_resident_bytes
    from grpo_cli.models.precision import Precision
    from grpo_cli.models.runtime import prepare_process
    from grpo_cli.samples.rollout import Rollout
    from grpo_cli.samples.settings import StepSettings
    from grpo_cli.update.step import optimise

    device = torch.device(args.device)
    prepare_process(args.threads, device)
    torch.manual_seed(0)
    if (SMOLLM2 / "config.json").exists():
        config = transformers.AutoConfig.from_pretrained(SMOLLM2)
        policy = transformers.AutoModelForCausalLM.from_pretrained(SMOLLM2, dtype=torch.float32)
    else:
        config = transformers.LlamaConfig(
            vocab_size=49152,
            hidden_size=576,
            intermediate_size=1536,
            num_hidden_layers=30,
            num_attention_heads=9,
            num_key_value_heads=3,
            max_position_embeddings=8192,
            tie_word_embeddings=True,
        )
        policy = transformers.LlamaForCausalLM(config)
    enable_logprob_forward(policy)
    reference = transformers.AutoModelForCausalLM.from_config(config).requires_grad_(False)
    reference.load_state_dict(policy.state_dict())
    enable_logprob_forward(reference)
    policy, reference = policy.to(device), reference.to(device)
    lens = lengths(args.prompts, args.group_size, args.max_new_tokens, args.seed)
    B, T, P = len(lens), max(lens), PROMPT_LEN
    g = torch.Generator().manual_seed(args.seed)
    ids = torch.randint(3, config.vocab_size, (B, P + T), generator=g)
    roll = Rollout.of_rows(
        [str(i) for i in range(args.prompts)],
        args.group_size,
        [row[:P].tolist() for row in ids],
        [row[P : P + n].tolist() for row, n in zip(ids, lens)],
        truncated=[False] * B,
        device=device,
        advantages=torch.randn(B, generator=g).to(device),
    )
    cfg = TrainConfig()
    cfg.sampler.max_new_tokens, cfg.trainer.micro_batch_size = args.max_new_tokens, args.micro_batch
    cfg.trainer.packing, cfg.trainer.max_tokens_per_micro_batch = args.packing == "on", args.budget
    settings = StepSettings.of(cfg)
    optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-6, fused=True)
    precision = Precision(args.precision, device.type)
    peak = (lambda: torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else peak_resident_bytes
    sync = (lambda: torch.cuda.synchronize(device)) if device.type == "cuda" else (lambda: None)
    for _ in range(args.warmup):  # untimed passes: CUDA's kernels and allocator, the CPU heap
        roll.ref_logp = score(reference, roll, 1.0, settings, precision)
        optimise(policy, optimizer, roll, settings, precision, with_entropy=True)
    sync()
    if device.type == "cuda":  # the peaks below are the timed passes' own, not the warm-up's
        torch.cuda.reset_peak_memory_stats(device)
    base = peak()
    t0 = time.perf_counter()
    roll.ref_logp = score(reference, roll, 1.0, settings, precision)
    sync()
    t1 = time.perf_counter()
    peak_score = peak()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    optimise(policy, optimizer, roll, settings, precision, with_entropy=True)
    sync()
    t2 = time.perf_counter()
    real = int(roll.lengths.sum())
    return {
        "score_s": t1 - t0,
        "update_s": t2 - t1,
        "peak_score_mib": peak_score / 2**20,
        "peak_mib": peak() / 2**20,
        "base_mib": base / 2**20,
        "real_tokens": real,
        "padded_tokens": B * (P + T),
        "lengths": lens,
    }


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=512)
    p.add_argument("--micro-batch", type=int, default=4, help="rows per micro-batch, both layouts (default 4)")
    p.add_argument(
        "--budget", type=int, default=0, help="also run packed with micro-batches of at most this many tokens"
    )
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda (on CUDA the peak is torch's peak allocation)")
    p.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed"])
    p.add_argument("--warmup", type=int, default=0, help="untimed passes first (default 0; use 1 on CUDA)")
    p.add_argument("--packing", choices=["on", "off"], help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.result:
        Path(args.result).write_text(json.dumps(child(args)))
        return 0
    import torch

    cpu = next(
        (
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        ),
        "unknown CPU",
    )
    where = (
        torch.cuda.get_device_name(0)
        if args.device == "cuda"
        else f"CPU {cpu} ({torch.backends.cpu.get_cpu_capability()}), {args.threads} thread(s)"
    )
    print(
        f"{where}, {args.precision}; model "
        f"{'SmolLM2-135M-Instruct' if (SMOLLM2 / 'config.json').exists() else 'SmolLM2-135M shape, random weights'}"
    )
    runs = [("padded", "off", 0), ("packed", "on", 0)] + (
        [(f"packed, {args.budget}-token", "on", args.budget)] if args.budget else []
    )
    results = {name: [] for name, *_ in runs}
    tmp = Path(tempfile.mkdtemp(prefix="bench_packing_"))
    for r in range(args.rounds):
        for name, packing, budget in runs if r % 2 == 0 else runs[::-1]:
            out = tmp / f"{r}-{packing}-{budget}.json"
            cmd = [
                sys.executable,
                __file__,
                "--packing",
                packing,
                "--budget",
                str(budget),
                "--result",
                str(out),
                "--prompts",
                str(args.prompts),
                "--group-size",
                str(args.group_size),
                "--max-new-tokens",
                str(args.max_new_tokens),
                "--micro-batch",
                str(args.micro_batch),
                "--threads",
                str(args.threads),
                "--seed",
                str(args.seed),
                "--device",
                args.device,
                "--precision",
                args.precision,
                "--warmup",
                str(args.warmup),
            ]
            env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
            subprocess.run(cmd, check=True, env=env)
            results[name].append(json.loads(out.read_text()))
            print(f"  {name}: round {r + 1} done", file=sys.stderr, flush=True)
    first = results["padded"][0]
    lens = sorted(first["lengths"])
    print(
        f"rollout: {len(lens)} completions, lengths min {lens[0]}, median {lens[len(lens) // 2]}, max {lens[-1]}; "
        f"real tokens {first['real_tokens']:,} of {first['padded_tokens']:,} padded positions "
        f"({1 - first['real_tokens'] / first['padded_tokens']:.0%} padding)\n"
    )
    print("| layout | scoring s | update s | peak while scoring MiB | peak MiB |")
    print("| --- | --- | --- | --- | --- |")
    mean = lambda rows, k: sum(x[k] for x in rows) / len(rows)  # noqa: E731
    for name, rows in results.items():
        print(
            f"| {name} | {mean(rows, 'score_s'):.1f} | {mean(rows, 'update_s'):.1f} | "
            f"{mean(rows, 'peak_score_mib'):,.0f} | {mean(rows, 'peak_mib'):,.0f} |"
        )
    pad, pack = results["padded"], results["packed"]
    print(
        f"\npacked / padded: scoring {mean(pack, 'score_s') / mean(pad, 'score_s'):.2f}x, update "
        f"{mean(pack, 'update_s') / mean(pad, 'update_s'):.2f}x, peak memory "
        f"{mean(pack, 'peak_mib') / mean(pad, 'peak_mib'):.2f}x"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
