"""grpo-cli against TRL's GRPOTrainer on the same model, prompts and settings, runs interleaved.

    pip install 'grpo-cli[compare]'                   # TRL; never a runtime dependency of grpo-cli
    python scripts/compare_trl.py                      # both workloads, 1 round each
    python scripts/compare_trl.py --task default --rounds 2
    python scripts/compare_trl.py --task qwen-shape --precision fp32 bf16
    python scripts/compare_trl.py --task long          # SmolLM2-135M-Instruct (make smollm2), lengths up to 1,024
    python scripts/compare_trl.py --device cuda --task qwen-shape --precision bf16   # on a GPU (peak: CUDA's
    allocation)
    python scripts/compare_trl.py --task default --grpo trainer.shared_prompts=true  # grpo-cli's side with overrides

Workloads:
  default     the built-in tiny model on the built-in arithmetic task, the training defaults
              (32 prompts x G=8, 6 new tokens, micro-batch 64, lr 3e-4, beta 0.04, fp32) for --steps
              steps; both trainers see the same prompts in the same order (TRL's dataset is grpo-cli's
              prompt order, unshuffled). Reports seconds per step, steps and seconds until the 20-step
              mean reward reaches 0.9, peak RSS, CPU seconds.
  qwen-shape  Qwen2.5-0.5B's architecture with random weights (written once to a local directory, one
              token per id), 2 prompts x G=4 of 16 random tokens, 64 new tokens (a random model does not
              emit EOS), a seeded random 0/1 reward, beta 0.04, --qwen-steps steps of which the first
              --qwen-warmup are not timed; at each --precision (fp32; bf16 = TRL's bf16=True autocast vs grpo-cli's
              trainer.precision=bf16-mixed).
  long        SmolLM2-135M-Instruct (`make smollm2`; no hub), chat prompts alternating short-answer questions
              and open-ended requests (every step: one of each), 2 prompts x G=8 sampled at temperature 1 with up to
              1,024 new tokens,
              so a step's lengths spread from a few tokens to the cap; a seeded random 0/1 reward, beta 0.04,
              micro-batches of 8 completions on both sides (TRL's per_device_train_batch_size=8 padded,
              grpo-cli's micro_batch_size=8 packed), --long-steps steps of which the first --long-warmup are
              not timed. The length distribution of both is printed.
  long-prompt SmolLM2-135M-Instruct, 2 chat prompts of about 500 tokens (a logbook, then a question answered in a
              word), G=8, up to 32 new tokens, micro-batches of 8 on both sides, a seeded random 0/1 reward, beta
              0.04, --prompt-steps steps of which the first is not timed: where a group's prompt dominates its
              rows (grpo-cli's trainer.shared_prompts computes it once per group).

Both sides run with gradient checkpointing off (TRL 1.16 defaults it on; --gradient-checkpointing on sets
it on for both) and TRL's use_bias_correction_kl=False (its default True multiplies the KL term by the
importance ratio, a different gradient from the DeepSeekMath KL grpo-cli uses); the header prints both.

Each run is a fresh child process (so peak RSS is its own), with --threads torch threads; rounds
alternate TRL and grpo-cli so a busy machine slows both alike. Phases: TRL's generation phase is its
`_generate_and_score_completions` (sampling, rewards, reference and old log-probs), grpo-cli's is
generation + scoring; the update is the rest of the step.

Settings that cannot be matched exactly (listed so the comparison is honest):
  - advantages: TRL divides by std (unbiased) + 1e-4, grpo-cli by sqrt(var + eps^2); grpo-cli is run
    with algo.std=sample so only the epsilon differs;
  - TRL computes the "old" log-probs only when needed, as grpo-cli does; both keep the reference in fp32
    at fp32 (grpo-cli stores frozen models in bf16 under bf16-mixed);
  - sampling noise: each draws its own, from the same seed, so the reward curves differ by chance.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "scripts"))

STEPS_DEFAULT = 300
QWEN_PROMPT_LEN, QWEN_NEW_TOKENS = 16, 64
LONG_NEW_TOKENS, LONG_PROMPTS, LONG_G, LONG_MICRO = 1024, 2, 8, 4
SMOLLM2 = ROOT / "models" / "SmolLM2-135M-Instruct"
# Every step asks the same pair (so both trainers see the same prompts whatever their data order): one
# question answered in a few tokens and one request that runs on, often to the cap.
LONG_ASKS = [
    "What is the chemical symbol for gold?",
    "Write a detailed story about a lighthouse keeper who finds a message in a bottle.",
]
# long-prompt: a logbook of about PROMPT_TOKENS tokens, then a question answered in a word or two.
PROMPT_TOKENS, PROMPT_NEW_TOKENS, PROMPT_G, PROMPT_MICRO = 480, 32, 8, 8


DEVICE = "cpu"  # --device: cpu, or cuda (the peak is then CUDA's allocated memory, not the process's RSS)
GRPO_OVERRIDES: list[str] = []  # --grpo: overrides for grpo-cli's runs


def usage() -> dict:
    """This process's peak memory and CPU seconds. On CPU the peak is VmHWM (ru_maxrss survives exec on Linux,
    so a child started by a parent that held the 0.5B model would report the parent's peak); on CUDA it is
    torch.cuda.max_memory_allocated, the tensors both trainers hold at their peak."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    if DEVICE == "cuda":
        import torch

        return {"peak_mib": torch.cuda.max_memory_allocated() / 2**20, "cpu_s": r.ru_utime + r.ru_stime}
    hwm = next(
        int(line.split()[1]) for line in Path("/proc/self/status").read_text().splitlines() if line.startswith("VmHWM:")
    )
    return {"peak_mib": hwm / 1024, "cpu_s": r.ru_utime + r.ru_stime}


# --- the workloads' shared inputs -------------------------------------------------------------------


def default_prompts(steps: int) -> list[dict]:
    """grpo-cli's prompts for steps 1..steps, in order (32 per step): TRL reads them unshuffled."""
    from grpo_cli.data.tasks import PromptOrder, arithmetic_problems

    train = arithmetic_problems(49, 200, 0)["train"]
    order = PromptOrder(len(train), 32, 0)
    rows = []
    for step in range(steps):
        part = train[order.indices(step)]
        rows += [{"prompt": p, "answer": a} for p, a in zip(part["prompt"], part["answer"])]
    return rows


def qwen_dir(root: Path) -> Path:
    """A Qwen2.5-0.5B-shaped model with random weights and an id-per-token tokenizer, saved once. It is
    saved as a Llama with attention biases (Qwen2 is a Llama with q/k/v biases; this adds o's 896 too):
    transformers reloads any `qwen2` directory with Qwen's own tokenizer class, whatever the directory
    holds, and that would not read the id-per-token tokenizer both trainers must share."""
    out = root / "qwen0.5b-shape"
    if (out / "config.json").exists():
        return out
    import torch
    import transformers
    from bench import QWEN_EOS_ID, QWEN_PAD_ID, QWEN_SHAPE, id_tokenizer

    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        **QWEN_SHAPE,
        attention_bias=True,
        rms_norm_eps=1e-6,
        pad_token_id=QWEN_PAD_ID,
        eos_token_id=QWEN_EOS_ID,
        bos_token_id=QWEN_PAD_ID,
    )
    model = transformers.LlamaForCausalLM(config)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = QWEN_EOS_ID, QWEN_PAD_ID
    model.save_pretrained(out)
    id_tokenizer(config.vocab_size, QWEN_PAD_ID, QWEN_EOS_ID).save_pretrained(out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
    return out


def qwen_prompts(n: int) -> list[dict]:
    from bench import QWEN_PAD_ID, random_prompts

    return [{"prompt": p, "answer": ""} for p in random_prompts(n, QWEN_PROMPT_LEN, QWEN_PAD_ID, 0)]


def long_prompts(n: int) -> list[dict]:
    """n chat prompts: LONG_ASKS in turn."""
    return [{"prompt": [{"role": "user", "content": LONG_ASKS[i % 2]}], "answer": ""} for i in range(n)]


def logbook_prompts(n: int) -> list[dict]:
    """n chat prompts: a lighthouse logbook of PROMPT_TOKENS tokens under SmolLM2's chat template (each prompt's
    own entries), then a short question."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(SMOLLM2)
    colours = ["red", "white", "green", "blue", "yellow", "black", "grey"]
    rows = []
    for i in range(n):
        entries, day = [], 0
        while True:
            text = " ".join(entries) + f"\nQuestion: what colour was the lamp on day {1 + i % 5}? Answer in one word."
            messages = [{"role": "user", "content": text}]
            rendered = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
            if len(tok(rendered, add_special_tokens=False)["input_ids"]) >= PROMPT_TOKENS:
                break
            day += 1
            entries.append(
                f"Day {day}: the keeper of station {i} lit the {colours[(day * 3 + i) % 7]} lamp at "
                f"{(day * 7 + i) % 12 + 1} o'clock and saw {(day * 5 + i) % 9} ships."
            )
        rows.append({"prompt": messages, "answer": ""})
    return rows


REWARD_MODULE = '''
import random
from grpo_cli.rewards.exact_match import exact_match_reward

_rng = random.Random(0)
_exact = exact_match_reward("last_number", None)

def exact(prompts, completions, answer=None, answers=None, **kwargs):
    return _exact(prompts, completions, answer if answer is not None else answers)

def coin(prompts, completions, **kwargs):
    """A seeded 0/1 reward: groups have advantages, so the update is a real one."""
    return [float(_rng.random() < 0.5) for _ in completions]
'''


# --- one run in a child -----------------------------------------------------------------------------


def run_trl(task: str, precision: str, steps: int, work: Path, checkpointing: bool = False) -> dict:
    import compare_rewards as rewards
    import torch
    from datasets import Dataset
    from transformers import TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    if task == "default":
        from grpo_cli.models.loading import resolve_path

        model, data, reward = resolve_path("builtin:tiny"), default_prompts(steps), rewards.exact
        shape = dict(
            num_generations=8,
            per_device_train_batch_size=64,
            gradient_accumulation_steps=4,
            max_completion_length=6,
            learning_rate=3e-4,
        )
    elif task == "long":
        model, data, reward = str(SMOLLM2), long_prompts(LONG_PROMPTS * steps), rewards.coin
        shape = dict(
            num_generations=LONG_G,
            per_device_train_batch_size=LONG_MICRO,
            gradient_accumulation_steps=LONG_PROMPTS * LONG_G // LONG_MICRO,
            max_completion_length=LONG_NEW_TOKENS,
            learning_rate=1e-6,
        )
    elif task == "long-prompt":
        model, data, reward = str(SMOLLM2), logbook_prompts(2) * steps, rewards.coin
        shape = dict(
            num_generations=PROMPT_G,
            per_device_train_batch_size=PROMPT_MICRO,
            gradient_accumulation_steps=2 * PROMPT_G // PROMPT_MICRO,
            max_completion_length=PROMPT_NEW_TOKENS,
            learning_rate=1e-6,
        )
    else:
        model, data, reward = str(qwen_dir(work.parent)), qwen_prompts(2 * steps), rewards.coin
        shape = dict(
            num_generations=4,
            per_device_train_batch_size=8,
            gradient_accumulation_steps=1,
            max_completion_length=QWEN_NEW_TOKENS,
            learning_rate=1e-6,
        )
    args = GRPOConfig(
        gradient_checkpointing=checkpointing,
        use_bias_correction_kl=False,  # TRL 1.16 defaults: True, True
        output_dir=str(work),
        max_steps=steps,
        beta=0.04,
        epsilon=0.2,
        loss_type="grpo",
        scale_rewards="group",
        temperature=1.0,
        top_p=1.0,
        top_k=0,
        num_iterations=1,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        seed=0,
        shuffle_dataset=False,
        use_cpu=DEVICE == "cpu",
        bf16=precision == "bf16",
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        disable_dropout=True,
        dataloader_num_workers=0,
        **shape,
    )
    times, gen = [], [0.0]

    class Clock(TrainerCallback):
        def on_step_begin(self, *a, **k):
            times.append([time.perf_counter(), None, gen[0]])

        def on_step_end(self, *a, **k):
            times[-1][1] = time.perf_counter()
            times[-1][2] = gen[0] - times[-1][2]

    trainer = GRPOTrainer(
        model=model, reward_funcs=reward, args=args, train_dataset=Dataset.from_list(data), callbacks=[Clock()]
    )
    inner = trainer._generate_and_score_completions

    def timed(*a, **k):
        t0 = time.perf_counter()
        out = inner(*a, **k)
        gen[0] += time.perf_counter() - t0
        return out

    trainer._generate_and_score_completions = timed
    trainer.train()
    logs = [h for h in trainer.state.log_history if "reward" in h]
    step_s = [end - start for start, end, _ in times]
    lengths = []
    if task == "long":  # the last step's completions (TRL keeps one generation batch), re-tokenised as grpo-cli's
        tok = trainer.processing_class
        texts = [c if isinstance(c, str) else "".join(m["content"] for m in c) for c in trainer._logs["completion"]]
        lengths = [len(tok(t, add_special_tokens=False)["input_ids"]) for t in texts]
    return {
        "rewards": [h["reward"] for h in logs],
        "step_s": step_s,
        "gen_s": [g for *_, g in times],
        "tokens": [h.get("completions/mean_length") for h in logs],
        "min_len": [h.get("completions/min_length") for h in logs],
        "max_len": [h.get("completions/max_length") for h in logs],
        "lengths": lengths,
        "texts": texts[:4] if task == "long" else [],
        "threads": torch.get_num_threads(),
        **usage(),
    }


def run_grpo(
    task: str,
    precision: str,
    steps: int,
    work: Path,
    checkpointing: bool = False,
    budget: int = 0,
    overrides: tuple[str, ...] = (),
) -> dict:
    import torch

    from grpo_cli.cli import main

    common = [
        f"output_dir={work}",
        f"trainer.steps={steps}",
        "trainer.progress=false",
        "trainer.eval_before_after=false",
        "trainer.eval_every=0",
        f"trainer.save_every={steps + 1}",
        "algo.std=sample",
        "algo.beta=0.04",
        f"trainer.threads={torch.get_num_threads()}",
        f"model.device={DEVICE}",
        f"model.gradient_checkpointing={str(checkpointing).lower()}",
        f"trainer.max_tokens_per_micro_batch={budget}",
    ]
    if task == "default":
        extra = ["trainer.log_completions_every=0"]
    elif task == "long":
        prompts = work.parent / "long_prompts.jsonl"  # the pair: each step draws both
        prompts.write_text("".join(json.dumps(r) + "\n" for r in long_prompts(2)))
        extra = [
            f"model.path={SMOLLM2}",
            "data=files",
            f"data.train_file={prompts}",
            f"data.test_file={prompts}",
            "data.chat_template=true",
            "reward=python",
            "reward.fn=compare_rewards:coin",
            f"trainer.prompts_per_step={LONG_PROMPTS}",
            f"sampler.group_size={LONG_G}",
            f"sampler.max_new_tokens={LONG_NEW_TOKENS}",
            f"trainer.micro_batch_size={LONG_MICRO}",
            "optimizer.lr=1e-6",
            "optimizer.warmup_steps=0",
            "trainer.log_completions_every=1",
            f"trainer.log_completions_groups={LONG_PROMPTS}",
        ]
    elif task == "long-prompt":
        prompts = work / "logbook_prompts.jsonl"
        work.mkdir(parents=True, exist_ok=True)
        prompts.write_text("".join(json.dumps(r) + "\n" for r in logbook_prompts(2)))  # the pair: each step draws both
        extra = [
            f"model.path={SMOLLM2}",
            "data=files",
            f"data.train_file={prompts}",
            f"data.test_file={prompts}",
            "data.chat_template=true",
            "reward=python",
            "reward.fn=compare_rewards:coin",
            "trainer.prompts_per_step=2",
            f"sampler.group_size={PROMPT_G}",
            f"sampler.max_new_tokens={PROMPT_NEW_TOKENS}",
            f"trainer.micro_batch_size={PROMPT_MICRO}",
            "optimizer.lr=1e-6",
            "optimizer.warmup_steps=0",
            "trainer.log_completions_every=0",
        ]
    else:
        prompts = work.parent / "qwen_prompts.jsonl"
        prompts.write_text("".join(json.dumps(r) + "\n" for r in qwen_prompts(2 * steps)))
        extra = [
            f"model.path={qwen_dir(work.parent)}",
            "data=files",
            f"data.train_file={prompts}",
            "data.test_size=2",
            "reward=python",
            "reward.fn=compare_rewards:coin",
            "trainer.prompts_per_step=2",
            "sampler.group_size=4",
            f"sampler.max_new_tokens={QWEN_NEW_TOKENS}",
            "trainer.micro_batch_size=8",
            "optimizer.lr=1e-6",
            "trainer.log_completions_every=0",
            f"trainer.precision={'bf16-mixed' if precision == 'bf16' else 'fp32'}",
        ]
    try:
        main(["train", *common, *extra, *overrides])
    except SystemExit as e:
        if e.code not in (0, None):
            raise
    rows = [json.loads(line) for line in (work / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward_mean" in r]
    lengths = []
    if task == "long":  # every completion's length, its text re-tokenised (the EOS token is not in the text)
        from transformers import AutoTokenizer

        tok = AutoTokenizer.from_pretrained(SMOLLM2)
        logged = [json.loads(line) for line in (work / "completions.jsonl").read_text().splitlines()]
        lengths = [len(tok(r["completion"], add_special_tokens=False)["input_ids"]) for r in logged]
    return {
        "rewards": [r["reward_mean"] for r in rows],
        "step_s": [r["seconds"] for r in rows],
        "gen_s": [r["gen_s"] + r["score_s"] for r in rows],
        "tokens": [r["completion_len"] for r in rows],
        "min_len": [r["completion_len_min"] for r in rows],
        "max_len": [r["completion_len_max"] for r in rows],
        "padding_frac": [r["padding_frac"] for r in rows],
        "phases": [[r["gen_s"], r["score_s"], r["update_s"]] for r in rows],
        "lengths": lengths,
        "threads": torch.get_num_threads(),
        **usage(),
    }


def child(args) -> None:
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.work)
    sys.path.insert(0, str(work.parent))
    fn = run_trl if args.child == "trl" else run_grpo
    result = fn(
        args.task,
        args.precision[0],
        args.steps,
        work,
        args.gradient_checkpointing == "on",
        *([args.budget, tuple(args.grpo)] if args.child == "grpo" else []),
    )
    Path(args.result).write_text(json.dumps(result))


# --- the parent: interleaved runs, then the tables ---------------------------------------------------


def matmul_peak(threads: int, device: str = "cpu") -> dict:
    """The measured GFLOP/s of a square matmul (2048^3 on CPU with `threads` threads, 8192^3 on CUDA), fp32 and bf16."""
    import torch

    torch.set_num_threads(threads)
    n = 8192 if device == "cuda" else 2048
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    out = {}
    for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
        a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
        for _ in range(2):
            a @ b
        best = min(_timed(lambda: (a @ b, sync())) for _ in range(5))
        out[name] = 2 * n**3 / best / 1e9
    return out


def _timed(fn) -> float:
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def first_reaching(rewards: list[float], target: float = 0.9, window: int = 20) -> int | None:
    """The first step (1-based) at which the mean of the last `window` rewards reaches `target`."""
    for i in range(window, len(rewards) + 1):
        if sum(rewards[i - window : i]) / window >= target:
            return i
    return None


def spawn(
    who: str,
    task: str,
    precision: str,
    steps: int,
    threads: int,
    root: Path,
    tag: str,
    checkpointing: str = "off",
    budget: int = 0,
) -> dict:
    work, result = root / f"{who}-{task}-{precision}-{tag}", root / f"{who}-{task}-{precision}-{tag}.json"
    env = {
        **os.environ,
        "OMP_NUM_THREADS": str(threads),
        "TOKENIZERS_PARALLELISM": "false",
        "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
    }
    cmd = [
        sys.executable,
        __file__,
        "--child",
        who,
        "--task",
        task,
        "--precision",
        precision,
        "--steps",
        str(steps),
        "--threads",
        str(threads),
        "--work",
        str(work),
        "--result",
        str(result),
        "--gradient-checkpointing",
        checkpointing,
        "--budget",
        str(budget),
        "--long-new-tokens",
        str(LONG_NEW_TOKENS),
        "--device",
        DEVICE,
        "--grpo",
        *GRPO_OVERRIDES,
    ]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, env=env, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{who} {task} {precision} failed:\n{done.stderr[-4000:]}")
    out = json.loads(result.read_text())
    out["wall_s"] = time.perf_counter() - t0
    print(
        f"  {who:5s} {task} {precision}: {sum(out['step_s']):.1f} s in steps, peak {out['peak_mib']:.0f} MiB",
        file=sys.stderr,
        flush=True,
    )
    return out


def summarise(runs: list[dict], skip: int) -> dict:
    """Means over rounds of the per-step figures (after `skip` warm-up steps)."""

    def mean(xs):
        return sum(xs) / len(xs)

    per_round = []
    for r in runs:
        step, gen = r["step_s"][skip:], r["gen_s"][skip:]
        reach = first_reaching(r["rewards"])
        per_round.append(
            {
                "step_s": mean(step),
                "gen_s": mean(gen),
                "update_s": mean(step) - mean(gen),
                "peak_mib": r["peak_mib"],
                "cpu_s": r["cpu_s"],
                "reach": reach,
                "reach_s": sum(r["step_s"][:reach]) if reach else None,
                "last20": mean(r["rewards"][-20:]),
                "first": r["rewards"][0],
                "tokens": mean([t for t in r["tokens"][skip:] if t is not None] or [0]),
            }
        )
    keys = per_round[0]
    return {k: (mean([p[k] for p in per_round]) if all(p[k] is not None for p in per_round) else None) for k in keys}


def main(argv=None) -> int:
    global LONG_NEW_TOKENS, DEVICE, GRPO_OVERRIDES
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "--task", nargs="+", default=["default", "qwen-shape"], choices=["default", "qwen-shape", "long", "long-prompt"]
    )
    p.add_argument("--prompt-steps", type=int, default=3, help="long-prompt: steps per run (default 3)")
    p.add_argument("--precision", nargs="+", default=["fp32", "bf16"], choices=["fp32", "bf16"])
    p.add_argument("--steps", type=int, default=STEPS_DEFAULT, help="default task: steps per run")
    p.add_argument(
        "--qwen-steps",
        type=int,
        default=4,
        help="qwen-shape: steps per run, the first --qwen-warmup untimed (default 4)",
    )
    p.add_argument(
        "--qwen-warmup",
        type=int,
        default=2,
        help="qwen-shape: untimed steps (default 2: AdamW's state is allocated in the first, and grpo-cli's "
        "heap settles over the first two)",
    )
    p.add_argument("--long-steps", type=int, default=2, help="long: steps per run (default 2)")
    p.add_argument("--long-warmup", type=int, default=0, help="long: untimed steps (default 0)")
    p.add_argument("--long-new-tokens", type=int, default=LONG_NEW_TOKENS, help="long: max new tokens (default 1024)")
    p.add_argument(
        "--long-budget",
        type=int,
        default=1024,
        help="long: also run grpo-cli with micro-batches of at most this many tokens (0 = not)",
    )
    p.add_argument("--budget", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument(
        "--gradient-checkpointing",
        choices=["off", "on"],
        default="off",
        help="on both sides (default off; TRL 1.16's own default is on)",
    )
    p.add_argument(
        "--grpo",
        nargs="*",
        default=[],
        metavar="KEY=VALUE",
        help="overrides for grpo-cli's runs, after the matched settings (e.g. trainer.shared_prompts=true)",
    )
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="where both trainers run (default cpu)")
    p.add_argument("--json", help="also write each workload's figures (both trainers' means) here")
    p.add_argument("--work", default=None, help="where runs and the random model go (default: a temporary dir)")
    p.add_argument("--child", choices=["trl", "grpo"], help=argparse.SUPPRESS)
    p.add_argument("--result", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    LONG_NEW_TOKENS, DEVICE, GRPO_OVERRIDES = args.long_new_tokens, args.device, args.grpo
    if not 0 <= args.qwen_warmup < args.qwen_steps:
        p.error("--qwen-warmup must be >= 0 and below --qwen-steps")
    if args.child:
        args.task = args.task[0]
        child(args)
        return 0
    try:
        import trl
    except ImportError:
        sys.exit("TRL is not installed: pip install 'grpo-cli[compare]'")
    root = Path(args.work or tempfile.mkdtemp(prefix="compare_trl_"))
    root.mkdir(parents=True, exist_ok=True)
    (root / "compare_rewards.py").write_text(REWARD_MODULE)
    import torch
    import transformers

    peak = matmul_peak(args.threads, DEVICE)
    where = (
        torch.cuda.get_device_name()
        if DEVICE == "cuda"
        else f"CPU {cpu_name()} ({torch.backends.cpu.get_cpu_capability()})"
    )
    print(
        f"TRL {trl.__version__}, transformers {transformers.__version__}, torch {torch.__version__}, "
        f"{args.threads} thread(s); matmul peak: fp32 {peak['fp32']:.0f}, bf16 {peak['bf16']:.0f} GFLOP/s; {where}"
    )
    print(
        f"both sides: gradient checkpointing {args.gradient_checkpointing}; TRL use_bias_correction_kl=False "
        "(grpo-cli's KL term is DeepSeekMath's, without the importance ratio)"
        + (f"; grpo-cli also {' '.join(args.grpo)}" if args.grpo else "")
    )
    workloads = [("default", "fp32", args.steps, 0)] if "default" in args.task else []
    if "qwen-shape" in args.task:
        workloads += [("qwen-shape", pr, args.qwen_steps, args.qwen_warmup) for pr in args.precision]
        qwen_dir(root)
    if "long" in args.task:
        if not (SMOLLM2 / "config.json").exists():
            sys.exit(f"The long workload needs SmolLM2-135M-Instruct in {SMOLLM2}: run `make smollm2` first.")
        workloads += [("long", pr, args.long_steps, args.long_warmup) for pr in args.precision]
    if "long-prompt" in args.task:
        if not (SMOLLM2 / "config.json").exists():
            sys.exit(f"The long-prompt workload needs SmolLM2-135M-Instruct in {SMOLLM2}: run `make smollm2` first.")
        workloads += [("long-prompt", "fp32", args.prompt_steps, 1)]
    table = []
    for task, precision, steps, skip in workloads:
        runs = {"trl": [], "grpo": [], "budget": []}
        budget = args.long_budget if task == "long" else 0
        for r in range(args.rounds):
            order = ("trl", "grpo", "budget") if r % 2 == 0 else ("budget", "grpo", "trl")
            for who in [w for w in order if budget or w != "budget"]:  # every round runs TRL and grpo-cli
                runs[who].append(
                    spawn(
                        "grpo" if who == "budget" else who,
                        task,
                        precision,
                        steps,
                        args.threads,
                        root,
                        f"r{r}" + ("-budget" if who == "budget" else ""),
                        args.gradient_checkpointing,
                        budget if who == "budget" else 0,
                    )
                )
        table.append((task, precision, summarise(runs["trl"], skip), summarise(runs["grpo"], skip)))
        if budget:  # the same update in micro-batches of at most `budget` tokens: memory, not maths
            table.append(
                (f"{task} ({budget}-token micro-batches)", precision, table[-1][2], summarise(runs["budget"], skip))
            )
        if task == "long":
            print_lengths(runs, skip)
    print_tables(table, peak)
    if args.json:
        rows = [{"task": t, "precision": pr, "trl": a, "grpo": b} for t, pr, a, b in table]
        Path(args.json).write_text(json.dumps({"device": where, "trl": trl.__version__, "rows": rows}, indent=1))
    return 0


def cpu_name() -> str:
    try:
        return next(
            line.split(":", 1)[1].strip()
            for line in Path("/proc/cpuinfo").read_text().splitlines()
            if line.startswith("model name")
        )
    except (OSError, StopIteration):
        import platform

        return platform.processor() or "unknown CPU"


def print_lengths(runs: dict, skip: int) -> None:
    """The long workload's completion lengths (both trainers' per-step min / mean / max, grpo-cli's every
    completion) and grpo-cli's phases and padding share (the positions a padded batch would compute)."""
    import statistics

    for who, name in (("trl", "TRL"), ("grpo", "grpo-cli")):
        for r, run in enumerate(runs[who]):
            steps = ", ".join(
                f"{lo:.0f}/{mean:.0f}/{hi:.0f}"
                for lo, mean, hi in zip(run["min_len"], run["tokens"], run["max_len"])
                if lo is not None
            )
            print(f"{name} round {r}: completion length min/mean/max per step: {steps}", file=sys.stdout)
    for r, run in enumerate(runs["grpo"] + runs["budget"]):
        lengths = sorted(run["lengths"])
        if lengths:
            q = statistics.quantiles(lengths, n=10)
            print(
                f"grpo-cli round {r}: {len(lengths)} completions, tokens (re-tokenised text): min {lengths[0]}, "
                f"p10 {q[0]:.0f}, median {statistics.median(lengths):.0f}, p90 {q[-1]:.0f}, max {lengths[-1]}; "
                f"at the cap: {sum(n >= LONG_NEW_TOKENS - 1 for n in lengths)}",
                file=sys.stdout,
            )
        for i, ((g, s, u), pad) in enumerate(zip(run["phases"], run["padding_frac"])):
            print(
                f"grpo-cli round {r} step {i + 1}: generation {g:.1f} s, scoring {s:.1f} s, update {u:.1f} s; "
                f"a padded batch would be {pad:.0%} padding",
                file=sys.stdout,
            )


def flops_per_step(task: str) -> tuple[float, float] | None:
    """(generation, update) FLOPs of one qwen-shape step: 2 P per generated or prefilled token, and
    6 P per token of the update's forward + backward (prompt and completion), P = 494M parameters."""
    if task != "qwen-shape":
        return None
    P, n, G = 494e6, 2, 4
    gen = 2 * P * (n * QWEN_PROMPT_LEN + n * G * QWEN_NEW_TOKENS)
    update = 6 * P * n * G * (QWEN_PROMPT_LEN + QWEN_NEW_TOKENS)
    return gen, update


def print_tables(table, peak) -> None:
    fmt = lambda v, f="{:.2f}": "-" if v is None else f.format(v)  # noqa: E731
    print(
        "\n| workload | trainer | s/step | generation s | update s | peak RSS MiB | CPU s | steps to 0.9 | s to 0.9 | "
        "reward first -> last 20 |"
    )
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for task, precision, trl, grpo in table:
        for name, s in (("TRL", trl), ("grpo-cli", grpo)):
            print(
                f"| {task} {precision} | {name} | {fmt(s['step_s'])} | {fmt(s['gen_s'])} | {fmt(s['update_s'])} | "
                f"{fmt(s['peak_mib'], '{:,.0f}')} | {fmt(s['cpu_s'], '{:.0f}')} | {fmt(s['reach'], '{:.0f}')} | "
                f"{fmt(s['reach_s'], '{:.0f}')} | {s['first']:.3f} -> {s['last20']:.3f} |"
            )
    print("\nratios, grpo-cli / TRL (lower is better):\n")
    print("| workload | time per step | generation | update | peak RSS | CPU s | seconds to 0.9 |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for task, precision, trl, grpo in table:
        ratio = lambda k: fmt(grpo[k] / trl[k] if grpo[k] is not None and trl[k] else None, "{:.2f}x")  # noqa: E731
        print(
            f"| {task} {precision} | {ratio('step_s')} | {ratio('gen_s')} | {ratio('update_s')} | "
            f"{ratio('peak_mib')} | {ratio('cpu_s')} | {ratio('reach_s')} |"
        )
    shares = [(t, pr, tr, g) for t, pr, tr, g in table if flops_per_step(t)]
    if shares:
        print("\nshare of the measured matmul peak (qwen-shape FLOPs: 2P per generated token, 6P per updated token):\n")
        print("| workload | trainer | generation | update |")
        print("| --- | --- | --- | --- |")
        for task, precision, trl, grpo in shares:
            gen, update = flops_per_step(task)
            top = peak[precision] * 1e9
            for name, s in (("TRL", trl), ("grpo-cli", grpo)):
                print(
                    f"| {task} {precision} | {name} | {gen / s['gen_s'] / top:.0%} | "
                    f"{update / s['update_s'] / top:.0%} |"
                )


if __name__ == "__main__":
    sys.exit(main())
