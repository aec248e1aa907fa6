"""Time one GRPO step (generation, scoring, update) per model and print a table.

    python scripts/bench.py                                   # tiny and qwen0.5b-shape, defaults below
    python scripts/bench.py --models tiny --repeats 3
    python scripts/bench.py --models qwen0.5b-shape --max-new-tokens 64 --precision bf16-mixed
    .venv-vllm/bin/python scripts/bench.py --models qwen0.5b-shape --generator hf,vllm   # make vllm-env first
    make bench ARGS="--models tiny --threads 1"

Each step is `grpo_cli.update.step.grpo_step`, the trainer's own step, and the phases are the ones it
times (gen_s, score_s, update_s):
  generation  sampling n prompts x G completions (one batched, KV-cached `generate`, or the vLLM
              engine with --generator vllm) and the reward calls
  scoring     advantages and the no-grad log-prob passes: the reference's when beta != 0, the old
              policy's when mu (algo.num_iterations) > 1
  update      mu clipped-surrogate passes with backward over micro-batches, clipping, AdamW step
              (with vllm: and the push of the new weights into the engine, shown apart as "push")

Models (none is downloaded):
  tiny            the built-in model (builtin:tiny) on the arithmetic prompts with the exact-match
                  reward, at the training defaults (32 prompts x G=8, 6 new tokens, micro-batch 64).
  qwen0.5b-shape  Qwen2.5-0.5B's architecture with random weights, a tokenizer with one token per id,
                  random prompts of --prompt-len tokens and a seeded random 0/1 reward. Defaults
                  (2 prompts x G=4, 16 new tokens, prompt 16, micro-batch 4) take two to three minutes
                  on a 2-core CPU; raise them on a GPU.

The numbers are means over --repeats timed steps, after --warmup untimed ones (the first step also
allocates AdamW's state). Each model runs in a fresh child process, so on CPU its peak RSS is its
own (interpreter and libraries included) and not the high-water mark of an earlier model.
"""

from __future__ import annotations

import argparse
import copy
import random
import resource
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from multiprocessing import get_context

import torch
import transformers
from rich.console import Console
from rich.table import Table
from torch.profiler import ProfilerActivity

from grpo_cli.config import GeneratorConfig, RewardConfig, TrainConfig, check
from grpo_cli.config.trainer import PRECISIONS
from grpo_cli.data.tasks import PromptBatch, PromptOrder, arithmetic_problems
from grpo_cli.errors import GrpoError
from grpo_cli.generate.base import make_generator
from grpo_cli.models.loading import disable_dropout, load_model, load_tokenizer, resolve_device
from grpo_cli.models.logprobs import enable_logprob_forward
from grpo_cli.models.lora import add_adapter
from grpo_cli.models.policies import BASE, Policies
from grpo_cli.models.precision import training_precision
from grpo_cli.models.runtime import prepare_libraries, prepare_process
from grpo_cli.rewards import Judge, build_reward
from grpo_cli.rollout.source import LocalSource
from grpo_cli.run import build as run_setup
from grpo_cli.samples.metrics import PHASES
from grpo_cli.samples.rollout import group_seed
from grpo_cli.samples.settings import StepSettings
from grpo_cli.update import step as step_fn  # a loop below names its counter `step`


@dataclass(frozen=True)
class Shape:
    prompts: int
    group_size: int
    max_new_tokens: int
    micro_batch: int
    prompt_len: int | None = None  # only for models whose prompts are random tokens
    lr: float = 3e-4


DEFAULTS = {
    "tiny": Shape(prompts=32, group_size=8, max_new_tokens=6, micro_batch=64),
    "qwen0.5b-shape": Shape(prompts=2, group_size=4, max_new_tokens=16, micro_batch=4, prompt_len=16, lr=1e-6),
}

# Qwen2.5-0.5B's shape. The ids of its <|endoftext|> and <|im_end|> serve as pad and EOS, and
# prompts draw from the ids below them (the real tokenizer's ordinary tokens).
QWEN_SHAPE = dict(
    vocab_size=151936,
    hidden_size=896,
    intermediate_size=4864,
    num_hidden_layers=24,
    num_attention_heads=14,
    num_key_value_heads=2,
    max_position_embeddings=32768,
    rope_theta=1000000.0,
    tie_word_embeddings=True,
)
QWEN_PAD_ID, QWEN_EOS_ID = 151643, 151645


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# --- qwen0.5b-shape: a random model, a tokenizer that decodes any id, random prompts and rewards ---


def id_tokenizer(vocab_size: int, pad_id: int, eos_id: int) -> transformers.PreTrainedTokenizerFast:
    """One WordLevel token "<tN>" per id; decoding fuses them into one string."""
    from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers

    tok = Tokenizer(models.WordLevel(vocab={f"<t{i}>": i for i in range(vocab_size)}, unk_token=f"<t{pad_id}>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"<t\d+>"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token=f"<t{pad_id}>",
        eos_token=f"<t{eos_id}>",
        unk_token=f"<t{pad_id}>",
        padding_side="left",
    )


def random_prompts(n: int, length: int, high: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(f"<t{rng.randrange(high)}>" for _ in range(length)) for _ in range(n)]


def random_reward(seed: int):
    """A seeded 0/1 reward, so groups have non-zero advantages and the update is a real one."""
    rng = random.Random(seed)

    def reward(prompts, completions, answers):
        return [float(rng.random() < 0.5) for _ in completions]

    return reward


def build_qwen_shape(cfg, shape: Shape, precision):
    torch.manual_seed(cfg.trainer.seed)
    config = transformers.Qwen2Config(
        **QWEN_SHAPE, pad_token_id=QWEN_PAD_ID, eos_token_id=QWEN_EOS_ID, bos_token_id=QWEN_PAD_ID
    )
    policy = transformers.Qwen2ForCausalLM(config)
    # The rollout stops on the generation config's EOS. A random model samples this id with p ~ 1/vocab
    # per token, so completions (almost always) run to max_new_tokens: a fixed, worst-case length.
    policy.generation_config.eos_token_id = QWEN_EOS_ID
    policy.generation_config.pad_token_id = QWEN_PAD_ID
    disable_dropout(policy)
    enable_logprob_forward(policy)
    policy = policy.to(device=resolve_device(cfg.model.device)).eval()
    tokenizer = id_tokenizer(config.vocab_size, QWEN_PAD_ID, QWEN_EOS_ID)
    n, length, seed = cfg.trainer.prompts_per_step, shape.prompt_len, cfg.trainer.seed

    def batch(step: int):
        return random_prompts(n, length, QWEN_PAD_ID, seed * 1_000_003 + step), [""] * n

    return tokenizer, policy, batch, random_reward(seed)


def build_tiny(cfg, shape: Shape, precision):
    m = cfg.model
    tokenizer = load_tokenizer(m.path)
    policy = load_model(m.path, torch.float32, m.device)
    train = arithmetic_problems(cfg.data.max_operand, cfg.data.num_test, cfg.data.seed)["train"]
    order = PromptOrder(len(train), cfg.trainer.prompts_per_step, cfg.trainer.seed)

    def batch(step: int):
        rows = train[order.indices(step)]
        return rows[cfg.data.prompt_field], rows[cfg.data.answer_field]

    return tokenizer, policy, batch, build_reward(RewardConfig())


BUILDERS = {"tiny": build_tiny, "qwen0.5b-shape": build_qwen_shape}


# --- one model, in its own process ---


def peak_rss_mib() -> float:
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, bytes on macOS
    return kib / (1024**2 if sys.platform == "darwin" else 1024)


def bench_model(name: str, shape: Shape, opts: dict) -> dict:
    prepare_libraries()  # as a job: transformers quiet, its losses without scipy (36 MiB of the peak otherwise)
    device = resolve_device(opts["device"])
    prepare_process(opts["threads"] or 0, device)  # threads and allocator, as `grpo train` sets them

    cfg = TrainConfig()
    cfg.model.name, cfg.model.path = name, ("builtin:tiny" if name == "tiny" else name)
    cfg.model.device, cfg.trainer.precision = str(device), opts["precision"]
    cfg.sampler.group_size, cfg.sampler.max_new_tokens = shape.group_size, shape.max_new_tokens
    cfg.trainer.prompts_per_step, cfg.trainer.micro_batch_size = shape.prompts, shape.micro_batch
    cfg.trainer.seed = opts["seed"]
    cfg.algo.beta = opts["beta"]
    cfg.optimizer.lr = shape.lr
    check(cfg)
    run_setup.set_seed(cfg.trainer.seed)

    log(f"[{name}] building")
    precision, _ = training_precision(cfg.trainer.precision, device)
    tokenizer, policy, batch, reward_fn = BUILDERS[name](cfg, shape, precision)
    if opts["lora"]:  # as the trainer does: a frozen base in the compute dtype, a float32 adapter, and the
        # reference is the base with the adapter off (no second copy)
        cfg.model.lora.r = opts["lora"]
        policy = add_adapter(policy.to(precision.frozen_dtype), cfg.model.lora)
        policies = Policies(policy, BASE if cfg.algo.beta else None)
    else:  # the reference: the initial policy in the compute dtype, only when used
        policy = policy.to(precision.param_dtype)
        reference = copy.deepcopy(policy).to(precision.frozen_dtype).requires_grad_(False) if cfg.algo.beta else None
        policies = Policies(policy, reference)
    generator = make_generator(
        GeneratorConfig(name=opts["generator"]),
        tokenizer,
        chat_template=False,
        precision=precision,
        device=device,
        seed=cfg.trainer.seed,
    )
    params = sum(p.numel() for p in policy.parameters())
    trained = sum(p.numel() for p in policy.parameters() if p.requires_grad)
    warmup, repeats = opts["warmup"], opts["repeats"]
    optimizer, scheduler = run_setup.build_optimizer(policy, cfg.optimizer, warmup + repeats)

    rows = []
    profiler, settings = None, StepSettings.of(cfg, Judge(cfg.reward, reward_fn))
    source = LocalSource(generator, policies, reward_fn, settings, precision=precision)  # the trainer's rollout stage
    # grpo_step synchronises CUDA at each phase boundary itself.
    for step in range(warmup + repeats):
        timed = step >= warmup
        if timed and opts["profile"] and profiler is None:  # the timed steps only, not the warm-up
            activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
            profiler = torch.profiler.profile(activities=activities)
            profiler.start()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
            if step == warmup:
                torch.cuda.reset_peak_memory_stats(device)
        prompts, answers = batch(step)
        seeds = [group_seed(cfg.trainer.seed, step, i) for i in range(len(prompts))]
        policy.train()  # as the trainer's loop does
        scored = source.sample(PromptBatch(prompts, answers, seeds))
        row, _ = step_fn.grpo_step(policies, optimizer, scored, settings, precision=precision)
        source.update(policy, step + 1)  # an engine with its own copy of the weights takes the update
        scheduler.step()
        log(f"[{name}] {'timed' if timed else 'warm-up'} step {step + 1}/{warmup + repeats}: {row['seconds']:.2f} s")
        if timed:
            rows.append(row)

    costs = {}
    if profiler is not None:
        profiler.stop()
        costs = phase_costs(profiler.events(), repeats, opts["profile"])
    mean = lambda key: sum(r[key] for r in rows) / len(rows)  # noqa: E731
    tokens = [r["completion_tokens"] for r in rows]  # completion tokens (up to and incl. EOS)
    return {
        "name": name,
        "params": params,
        "trained": trained,
        "batch": f"{shape.prompts} x {shape.group_size}",
        "tokens": sum(tokens) / len(tokens),
        "gen_s": mean("gen_s"),
        "score_s": mean("score_s"),
        "update_s": mean("update_s"),
        "seconds": mean("seconds"),
        "tokens_per_s": sum(tokens) / sum(r["seconds"] for r in rows),
        "peak_mib": (torch.cuda.max_memory_allocated(device) / 2**20) if device.type == "cuda" else peak_rss_mib(),
        "truncated_frac": mean("truncated_frac"),
        "push_s": getattr(generator, "push_seconds", 0.0) / (warmup + repeats),  # the engine's weight pushes
        "micro_batch": shape.micro_batch,
        "prompt_len": shape.prompt_len,
        "max_new_tokens": shape.max_new_tokens,
        "threads": torch.get_num_threads(),
        "profile": costs,
    }


def phase_costs(events, steps: int, top: int) -> dict[str, list[tuple[str, float]]]:
    """Per phase of the step (grpo_step's named ranges), its `top` operators by self time, in ms per
    step: each operator's own time (CPU, plus the CUDA kernels it launched) is billed to the phase
    whose range it started in. By time, not by parent: on CUDA the autograd engine runs backward on a
    thread of its own, outside the update's range in the call tree but inside it in time."""
    ranges = [(e.time_range.start, e.time_range.end, e.name) for e in events if e.name in PHASES]
    per: dict[str, dict[str, float]] = {phase: {} for phase in PHASES}
    for e in events:
        if e.name in per:
            continue
        phase = next((name for start, end, name in ranges if start <= e.time_range.start < end), None)
        if phase is not None:
            own = (e.self_cpu_time_total + getattr(e, "self_device_time_total", 0.0)) / 1e3 / steps
            per[phase][e.name] = per[phase].get(e.name, 0.0) + own
    return {phase.split("/")[1]: sorted(ops.items(), key=lambda kv: -kv[1])[:top] for phase, ops in per.items()}


# --- the command ---


@dataclass(frozen=True)
class Variant:
    precision: str
    lora: int = 0  # LoRA rank, 0 = full fine-tuning
    generator: str = "hf"

    def __str__(self) -> str:
        return (
            self.precision
            + (f" + LoRA r={self.lora}" if self.lora else "")
            + (f" + {self.generator}" if self.generator != "hf" else "")
        )


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default=",".join(DEFAULTS), help=f"comma-separated, from {', '.join(DEFAULTS)}")
    p.add_argument("--prompts", type=int, help="distinct prompts per step (default: per model, see above)")
    p.add_argument("--group-size", type=int, help="G completions per prompt (default: per model)")
    p.add_argument("--max-new-tokens", type=int, help="completion length cap (default: per model)")
    p.add_argument("--prompt-len", type=int, help="prompt tokens for qwen0.5b-shape (default 16)")
    p.add_argument("--micro-batch", type=int, help="completions per forward/backward (default: per model)")
    p.add_argument(
        "--precision",
        default=None,
        help=f"comma-separated trainer.precision values from {', '.join(PRECISIONS)}, each benchmarked "
        "(default fp32 on CPU, bf16-mixed on CUDA)",
    )
    p.add_argument("--lora", default="0", help="comma-separated LoRA ranks, each benchmarked (0 = full fine-tuning)")
    p.add_argument(
        "--generator",
        default="hf",
        help="comma-separated, from hf, vllm: each benchmarked (vllm needs "
        "vLLM: run with .venv-vllm/bin/python after `make vllm-env` on CPU)",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="run every model and variant this many times, interleaved; times are averaged (default 1)",
    )
    p.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    p.add_argument(
        "--beta",
        type=float,
        default=0.04,
        help="KL weight; != 0 loads a reference model and times its log-prob pass (default 0.04; 0 skips it)",
    )
    p.add_argument("--warmup", type=int, default=1, help="untimed steps first (default 1)")
    p.add_argument("--repeats", type=int, default=1, help="timed steps, averaged (default 1)")
    p.add_argument("--threads", type=int, help="torch.set_num_threads (default: torch's own)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="profile the timed steps (torch.profiler) and print each phase's N costliest operators by "
        "self time, in ms per step (default 0: off; the profiler slows the step it watches)",
    )
    args = p.parse_args(argv)
    args.model_list = [m.strip() for m in args.models.split(",") if m.strip()]
    unknown = [m for m in args.model_list if m not in DEFAULTS]
    if unknown or not args.model_list:
        p.error(f"--models: unknown {unknown or args.models!r}; choose from {', '.join(DEFAULTS)}")
    if args.warmup < 0 or args.repeats < 1 or args.rounds < 1:
        p.error("--warmup must be >= 0, --repeats and --rounds >= 1")
    if args.prompt_len is not None and args.prompt_len < 1:
        p.error("--prompt-len must be >= 1")
    if args.threads is not None and args.threads < 1:
        p.error("--threads must be >= 1")
    precisions = [x.strip() for x in (args.precision or "").split(",") if x.strip()]
    if any(x not in PRECISIONS for x in precisions):
        p.error(f"--precision: choose from {', '.join(PRECISIONS)}")
    try:
        ranks = [int(x) for x in args.lora.split(",")]
    except ValueError:
        p.error("--lora takes comma-separated integers")
    generators = [x.strip() for x in args.generator.split(",") if x.strip()]
    if not generators or any(g not in ("hf", "vllm") for g in generators):
        p.error("--generator: comma-separated, from hf, vllm")
    args.precisions, args.ranks, args.generators = precisions, ranks, generators
    return args


def shape_for(name: str, args) -> Shape:
    d = DEFAULTS[name]
    pick = lambda given, default: default if given is None else given  # noqa: E731
    return Shape(
        prompts=pick(args.prompts, d.prompts),
        group_size=pick(args.group_size, d.group_size),
        max_new_tokens=pick(args.max_new_tokens, d.max_new_tokens),
        micro_batch=pick(args.micro_batch, d.micro_batch),
        prompt_len=pick(args.prompt_len, d.prompt_len) if d.prompt_len is not None else None,
        lr=d.lr,
    )


def run_in_child(name: str, shape: Shape, opts: dict) -> dict:
    """One model and variant in a fresh process: its peak RSS is its own."""
    with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as pool:
        return pool.submit(bench_model, name, shape, opts).result()


def average(runs: list[dict]) -> dict:
    out = dict(runs[0])
    for key in ("gen_s", "score_s", "update_s", "seconds", "tokens", "truncated_frac"):
        out[key] = sum(r[key] for r in runs) / len(runs)
    out["tokens_per_s"] = sum(r["tokens"] for r in runs) / sum(r["seconds"] for r in runs)
    out["peak_mib"] = max(r["peak_mib"] for r in runs)
    out["rounds"] = len(runs)
    return out


def main(argv=None) -> int:
    args = parse_args(argv)
    out = Console()
    if not out.is_terminal:  # piped or redirected: rich would squeeze the table into 80 columns
        out = Console(width=max(out.width, 140))
    try:
        device = resolve_device(args.device)
    except GrpoError as e:
        out.print(f"[bold red]error:[/] {e}")
        return 2
    precisions = args.precisions or ["bf16-mixed" if device.type == "cuda" else "fp32"]
    variants = [Variant(p, r, g) for p in precisions for r in args.ranks for g in args.generators]
    threads = args.threads or torch.get_num_threads()
    where = f"{device} ({torch.cuda.get_device_name(device)})" if device.type == "cuda" else str(device)
    out.print(
        f"device [bold]{where}[/]  torch {torch.__version__}  transformers {transformers.__version__}  "
        f"threads {threads}"
    )
    out.print(
        f"one grpo_step per row: beta {args.beta} ({'reference scored' if args.beta else 'no reference'}), mu 1, "
        f"{args.warmup} warm-up + {args.repeats} timed step(s) per process, {args.rounds} round(s) interleaved, "
        f"seed {args.seed}"
    )
    runs: dict[tuple[str, Variant], list[dict]] = {}
    for round_ in range(args.rounds):
        for name in args.model_list:
            for v in variants:
                opts = dict(
                    device=args.device,
                    precision=v.precision,
                    lora=v.lora,
                    generator=v.generator,
                    beta=args.beta,
                    warmup=args.warmup,
                    repeats=args.repeats,
                    threads=args.threads,
                    seed=args.seed,
                    profile=args.profile,
                )
                log(f"round {round_ + 1}/{args.rounds}: {name}, {v}")
                try:
                    runs.setdefault((name, v), []).append(run_in_child(name, shape_for(name, args), opts))
                except GrpoError as e:
                    out.print(f"[bold red]error[/] ({name}, {v}): {e}")
                    return 1
    results = {key: average(r) for key, r in runs.items()}

    cuda = device.type == "cuda"
    table = Table(title="one GRPO step (means over the timed steps and rounds)")
    for col in (
        "model",
        "variant",
        "params\ntrained",
        "batch\nprompts x G",
        "completion\ntokens",
        "generation\ns",
        "scoring\ns",
        "update\ns",
        "total\ns",
        "tokens/s",
        "peak MiB\n" + ("(CUDA alloc)" if cuda else "(CPU RSS)"),
    ):
        table.add_column(col, justify="left" if col in ("model", "variant") else "right")
    for (name, v), r in results.items():
        table.add_row(
            name + (" *" if name == "qwen0.5b-shape" else ""),
            str(v),
            f"{r['trained'] / 1e6:.1f}M",
            r["batch"],
            f"{r['tokens']:.0f}",
            f"{r['gen_s']:.2f}",
            f"{r['score_s']:.2f}",
            f"{r['update_s']:.2f}",
            f"{r['seconds']:.2f}",
            f"{r['tokens_per_s']:.1f}",
            f"{r['peak_mib']:,.0f}",
        )
    out.print(table)
    for name in args.model_list:
        base = results[(name, variants[0])]
        for v in variants[1:]:
            r = results[(name, v)]
            out.print(
                f"{name}: {v} vs {variants[0]}: {r['seconds'] / base['seconds']:.2f}x the step time "
                f"(generation {r['gen_s'] / base['gen_s']:.2f}x, scoring "
                f"{r['score_s'] / max(base['score_s'], 1e-9):.2f}x, update {r['update_s'] / base['update_s']:.2f}x), "
                f"{r['peak_mib'] / base['peak_mib']:.2f}x the peak memory"
            )

    if args.profile:
        out.print("[dim]--profile: the times above were taken under the profiler, which slows a step[/]")
        for (name, v), r in runs.items():
            for phase, ops in r[-1]["profile"].items():  # the last round's profile
                if ops:
                    out.print(
                        f"{name}, {v}, {phase}: " + ", ".join(f"{op} {ms:.1f}" for op, ms in ops) + " (ms per step)"
                    )

    notes = [
        "tokens/s = completion tokens (up to and including EOS) / total seconds of the step.",
        *(
            [
                f"{name} {v}: {r['push_s']:.2f} s per step pushing the weights into the engine (in update)"
                for (name, v), r in results.items()
                if v.generator == "vllm"
            ]
        ),
        (
            "peak = torch.cuda.max_memory_allocated over the timed steps (after reset_peak_memory_stats)."
            if cuda
            else "peak = the child process's peak RSS (resource.getrusage ru_maxrss): interpreter, libraries, "
            "policy, " + ("reference, " if args.beta else "") + "gradients and AdamW state included."
        ),
        "generation = sampling + reward calls; scoring = advantages + the reference's log-prob pass"
        + (
            " (beta != 0; under LoRA the policy with its adapter off)."
            if args.beta
            else "; with --beta 0 there is none."
        ),
    ]
    for (name, v), r in results.items():
        if v != variants[0]:
            continue
        extra = f", prompt {r['prompt_len']} tokens" if r["prompt_len"] else ""
        notes.append(
            f"{name}: max_new_tokens {r['max_new_tokens']}, micro-batch {r['micro_batch']}{extra}, "
            f"{r['truncated_frac']:.0%} of completions hit max_new_tokens."
        )
    if "qwen0.5b-shape" in args.model_list:
        notes.append(
            f"* random weights in Qwen2.5-0.5B's shape, id-per-token tokenizer, random 0/1 reward; "
            f"generation_config.eos_token_id = {QWEN_EOS_ID}, which a random model samples with p ~ 1/151936 "
            "per token, so generation runs to max_new_tokens."
        )
    for n in notes:
        out.print(f"[dim]{n}[/]")
    return 0


if __name__ == "__main__":
    sys.exit(main())
