"""Decode speed against its memory floor: eager steps against static-cache steps (CUDA graphs on CUDA), and
those with their kernels fused by torch.compile (generator.decode=compiled).

    python scripts/bench_decode.py --device cuda                       # Qwen2.5-0.5B's shape, bf16, batch 1/16/64
    python scripts/bench_decode.py --device cpu --shape small --batch 1 4 --new-tokens 16   # a smoke run
    python scripts/bench_decode.py --device cpu --model models/SmolLM2-135M-Instruct --dtype fp32 \
        --batch 1 16 --new-tokens 256

The floor of one decode step is the longer of reading the weights and every row's KV cache once from memory,
(weight bytes + batch x context x KV bytes per token) / bandwidth, and computing 2 x parameters FLOPs a row at
the device's measured matmul peak (grpo_cli/run/floors.py's probe; a CPU at 16 rows is compute-bound). The
bandwidth is the larger of the device's rated HBM bandwidth (where known: H100 SXM 3.35 TB/s, H200 4.8 TB/s)
and a measured device-to-device copy. The marginal time per token is measured as (t(T) - t(T/2)) / (T/2): decoding T
and T/2 new tokens from the same prompts, so the prefill and the one-time captures cancel. Rows never
stop (no EOS: the end id is out of the vocabulary), so every step runs the whole batch. Each case is the
median of --repeats runs, the kinds interleaved; the compiled steps are compiled in a warm-up first (two widths,
so the compile that follows a new shape happens there too). "step alone" is the model's part of a static or
compiled step without the sampling around it: one graph replay, timed back to back. Prints a table, and JSON
with --json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

RATED_TBPS = {"H100": 3.35, "H200": 4.8, "A100": 2.0}  # HBM bandwidth by GPU name (SXM parts)
SMALL_SHAPE = dict(
    vocab_size=4096,
    hidden_size=128,
    intermediate_size=344,
    num_hidden_layers=4,
    num_attention_heads=4,
    num_key_value_heads=2,
    max_position_embeddings=2048,
    tie_word_embeddings=True,
)


def build_model(shape: str, dtype: torch.dtype, device: str, path: str | None = None):
    """A Llama-architecture model of random weights: Qwen2.5-0.5B's sizes (attention biases included), or small;
    or the model saved in the local directory `path`."""
    import transformers

    if path:
        return (
            transformers.AutoModelForCausalLM.from_pretrained(path, dtype=dtype, attn_implementation="sdpa")
            .to(device)
            .eval()
        )

    from bench import QWEN_SHAPE

    torch.manual_seed(0)
    sizes = QWEN_SHAPE if shape == "qwen0.5b" else SMALL_SHAPE
    config = transformers.LlamaConfig(**sizes, attention_bias=shape == "qwen0.5b", rms_norm_eps=1e-6)
    config._attn_implementation = "sdpa"
    with torch.device(device):
        model = transformers.LlamaForCausalLM(config)
    return model.to(dtype).eval()


def bandwidth(device: str) -> tuple[float, float | None]:
    """(measured copy bandwidth in bytes/s counting read + write, rated bytes/s or None)."""
    n = 1 << 28 if device == "cuda" else 1 << 24
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    times = []
    for _ in range(6):
        sync(device)
        t0 = time.perf_counter()
        b.copy_(a)
        sync(device)
        times.append(time.perf_counter() - t0)
    measured = 2 * n / min(times[1:])
    rated = None
    if device == "cuda":
        name = torch.cuda.get_device_name()
        rated = next((tb * 1e12 for key, tb in RATED_TBPS.items() if key in name), None)
    return measured, rated


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed_decode(model, prompts, new_tokens: int, kind: str, device: str, eos: int) -> tuple[float, torch.Tensor]:
    from grpo_cli.config import SamplerConfig
    from grpo_cli.generate.hf import decode

    sampling = SamplerConfig(max_new_tokens=new_tokens, temperature=1.0)
    sync(device)
    t0 = time.perf_counter()
    tokens, _ = decode(
        model, prompts, 1, sampling, eos_ids=[eos], pad_id=0, seeds=list(range(len(prompts))), steps=kind
    )
    sync(device)
    return time.perf_counter() - t0, tokens


@torch.no_grad()
def step_ms(model, prompts, device: str, kind: str = "static", steps: int = 32) -> float:
    """The model's part of a static decode step alone: ms per graph replay (a static-cache forward on a CPU),
    with none of the host's sampling work around it."""
    from grpo_cli.generate.hf import prefill_rows
    from grpo_cli.generate.steps import decode_steps

    cache, _, mask, position, source = prefill_rows(model, prompts, 1, 0)
    stepper = decode_steps(model, cache, mask, position, 2 * steps + 2, kind, source)
    ids = torch.zeros(mask.shape[0], dtype=torch.long, device=mask.device)
    run = stepper.graph.replay if stepper.graph is not None else (lambda: stepper.step(ids))
    run()
    sync(device)
    t0 = time.perf_counter()
    for _ in range(steps):
        run()
    sync(device)
    return 1e3 * (time.perf_counter() - t0) / steps


def kv_bytes_per_token(model) -> int:
    c = model.config
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers * 2 * c.num_key_value_heads * head_dim * next(model.parameters()).element_size()


def case(model, batch: int, args, bw: float, flops: float) -> dict:
    """One batch size: marginal ms per token for each kind of steps, and the floor."""
    vocab = model.config.vocab_size
    g = torch.Generator().manual_seed(batch)
    prompts = torch.randint(1, vocab, (batch, args.prompt_len), generator=g).tolist()
    half = args.new_tokens // 2
    runs: dict = {kind: {half: [], args.new_tokens: []} for kind in args.kinds}
    tokens_of: dict = {}
    out: dict = {"batch": batch}
    for kind in args.kinds:  # warm-up: CUDA context, kernels, allocator; the compiled steps' compiles (two widths)
        t0 = time.perf_counter()
        for n in (4, 8) if kind == "compiled" else (4,):
            timed_decode(model, prompts, n, kind, args.device, vocab)
        out[f"{kind}_warmup_s"] = time.perf_counter() - t0
    for _ in range(args.repeats):
        for kind in args.kinds:
            for n in (half, args.new_tokens):
                seconds, tokens = timed_decode(model, prompts, n, kind, args.device, vocab)
                runs[kind][n].append(seconds)
                tokens_of[kind] = tokens
    for kind, by_n in runs.items():
        full, part = statistics.median(by_n[args.new_tokens]), statistics.median(by_n[half])
        out[f"{kind}_ms"] = 1e3 * (full - part) / (args.new_tokens - half)
        out[f"{kind}_total_s"] = full
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    context = args.prompt_len + (half + args.new_tokens) / 2  # the mean context over the marginal steps
    memory = (weights + batch * context * kv_bytes_per_token(model)) / bw
    out["floor_ms"] = 1e3 * max(memory, 2 * sum(p.numel() for p in model.parameters()) * batch / flops)
    for kind in args.kinds:
        out[f"{kind}_x_floor"] = out[f"{kind}_ms"] / out["floor_ms"]
        if kind != "eager":
            out[f"{kind}_step_ms"] = step_ms(model, prompts, args.device, kind)
            out[f"{kind}_step_x_floor"] = out[f"{kind}_step_ms"] / out["floor_ms"]
            if "eager" in tokens_of:  # the share of eager's tokens (bf16 kernels of other shapes may round apart)
                out[f"{kind}_same_tokens"] = float((tokens_of["eager"] == tokens_of[kind]).float().mean())
    if "static" in args.kinds:  # the names earlier JSON files used
        out["step_ms"], out["step_x_floor"] = out["static_step_ms"], out["static_step_x_floor"]
        out["same_tokens"] = out.get("static_same_tokens")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--shape", choices=["qwen0.5b", "small"], default="qwen0.5b")
    ap.add_argument("--model", help="a local model directory to decode with instead of a random --shape")
    ap.add_argument("--dtype", choices=["bf16", "fp32"], default="bf16")
    ap.add_argument("--batch", type=int, nargs="+", default=[1, 16, 64])
    ap.add_argument("--prompt-len", type=int, default=64)
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--kinds", nargs="+", default=["eager", "static", "compiled"], help="generator.decode kinds")
    ap.add_argument("--json", help="write the figures here")
    args = ap.parse_args(argv)
    if args.device == "cpu":
        torch.set_num_threads(1)
    from grpo_cli.run.floors import cached_peaks

    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float32
    model = build_model(args.shape, dtype, args.device, args.model)
    measured, rated = bandwidth(args.device)
    flops = cached_peaks(torch.device(args.device), dtype)[1]
    bw = max(measured, rated or 0.0)
    device_name = (
        torch.cuda.get_device_name() if args.device == "cuda" else f"CPU ({torch.backends.cpu.get_cpu_capability()})"
    )
    params = sum(p.numel() for p in model.parameters())
    print(
        f"{device_name}; {args.model or args.shape} ({params / 1e6:.0f}M parameters, {args.dtype}); prompt "
        f"{args.prompt_len}, {args.new_tokens} new tokens; bandwidth: measured copy {measured / 1e12:.3f} TB/s, rated "
        f"{'%.2f TB/s' % (rated / 1e12) if rated else 'unknown'}; floor at {bw / 1e12:.3f} TB/s and "
        f"{flops / 1e9:.0f} GFLOP/s"
    )
    rows = [case(model, b, args, bw, flops) for b in args.batch]
    print(f"{'batch':>5} {'floor ms':>9} " + " ".join(f"{k + ' ms':>12} {'x floor':>8}" for k in args.kinds), end="")
    print(" " + " ".join(f"{k[:8] + ' step':>14} {'x floor':>8} {'same':>6}" for k in args.kinds if k != "eager"))
    for r in rows:
        cells = [f"{r[k + '_ms']:>12.3f} {r[k + '_x_floor']:>7.1f}x" for k in args.kinds]
        same = {k: r.get(k + "_same_tokens") for k in args.kinds}
        steps = [
            f"{r[k + '_step_ms']:>14.3f} {r[k + '_step_x_floor']:>7.1f}x {same[k] if same[k] is not None else -1:>6.3f}"
            for k in args.kinds
            if k != "eager"
        ]
        print(f"{r['batch']:>5} {r['floor_ms']:>9.3f} " + " ".join(cells + steps))
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {
                    "device": device_name,
                    "shape": args.model or args.shape,
                    "dtype": args.dtype,
                    "kinds": args.kinds,
                    "flops": flops,
                    "parameters": params,
                    "bandwidth_measured": measured,
                    "bandwidth_rated": rated,
                    "rows": rows,
                },
                indent=1,
            )
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
