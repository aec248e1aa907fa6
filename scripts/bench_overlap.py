"""Steps per hour with generation overlapped in a worker process against the synchronous loop.

    python scripts/bench_overlap.py                               # qwen0.5b-shape, 16 and 64 new tokens
    python scripts/bench_overlap.py --max-new-tokens 64 --steps 6 --rounds 2
    python scripts/bench_overlap.py --model tiny                  # the built-in model: a quick check

Both sides run `grpo train` on the same model, prompts and settings, set explicitly:
  sync     trainer.max_staleness=0, generation then update in one process with --sync-threads threads
           (default 2: both cores of a 2-core machine)
  overlap  trainer.max_staleness=1, the trainer with --threads threads (default 1) and the generation
           worker with as many, so each has a core: while the trainer updates on step t's rollouts, the
           worker samples step t+1's with the weights one update old, then takes the new ones (a push)
The model (qwen0.5b-shape): Qwen2.5-0.5B's architecture with random weights (scripts/bench.py) and a
byte-level tokenizer, saved to a temporary directory; prompts of --prompt-len random letters; a
seeded random 0/1 reward; every completion runs to max_new_tokens (a random model almost never samples
EOS). fp32, algo.beta=0 (no reference), one update per step, AdamW.

Time per step is wall clock between the console's step lines, after --warmup steps (start-up, the
first step, which no overlap can hide, and AdamW's first allocation are left out); the pushes are
inside it. Runs alternate sync / overlap for --rounds rounds; the table shows each run and the ratio of
the medians.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

REWARD = """import random

_rng = random.Random(0)


def coin(completions, **_):
    return [float(_rng.random() < 0.5) for _ in completions]
"""


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown CPU"


def byte_tokenizer(vocab_size: int, pad_id: int, eos_id: int):
    """A byte-level BPE tokenizer without merges: ids 0-255 are the bytes, the rest "<tN>". Saved beside a
    Qwen2 config, transformers rebuilds a Qwen2Tokenizer from its vocabulary, which this survives (the
    id-per-token tokenizer of scripts/bench.py does not)."""
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocab = {ch: b for b, ch in bytes_to_unicode().items()}
    vocab.update({f"<t{i}>": i for i in range(256, vocab_size)})
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token=f"<t{pad_id}>", eos_token=f"<t{eos_id}>", padding_side="left"
    )


def build_qwen_shape(out: Path, prompts: int, prompt_len: int) -> list[str]:
    """The random Qwen2.5-0.5B-shape model and its tokenizer saved to `out`; prompts of `prompt_len` random
    letters (one token each) and the reward file beside it."""
    import json
    import random

    import torch
    import transformers
    from bench import QWEN_EOS_ID, QWEN_PAD_ID, QWEN_SHAPE

    torch.manual_seed(0)
    config = transformers.Qwen2Config(
        **QWEN_SHAPE, pad_token_id=QWEN_PAD_ID, eos_token_id=QWEN_EOS_ID, bos_token_id=QWEN_PAD_ID
    )
    model = transformers.Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id, model.generation_config.pad_token_id = QWEN_EOS_ID, QWEN_PAD_ID
    model.save_pretrained(out / "model")
    byte_tokenizer(config.vocab_size, QWEN_PAD_ID, QWEN_EOS_ID).save_pretrained(out / "model")
    rng = random.Random(0)
    rows = ["".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(prompt_len)) for _ in range(prompts)]
    (out / "prompts.jsonl").write_text("".join(json.dumps({"prompt": p, "answer": ""}) + "\n" for p in rows))
    (out / "coin.py").write_text(REWARD)
    from grpo_cli.models.loading import load_tokenizer

    assert len(load_tokenizer(str(out / "model"))(rows[0]).input_ids) == prompt_len, (
        "the prompts must keep their length"
    )
    return [
        f"model.path={out / 'model'}",
        "data=files",
        f"data.train_file={out / 'prompts.jsonl'}",
        "data.test_size=2",
        "reward=python",
        f"reward.fn={out / 'coin.py'}:coin",
        "optimizer.lr=1e-6",
        "model.gradient_checkpointing=false",
    ]


def run(args: list[str], warmup: int, log) -> list[float]:
    """`grpo train ARGS`; the seconds between consecutive step lines after `warmup` steps."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    env.pop("OMP_NUM_THREADS", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_cli.cli", "train", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    stamps, tail = {}, []
    for line in proc.stdout:
        tail = (tail + [line])[-40:]
        m = re.match(r"\s*step (\d+): reward", line)
        if m:
            stamps[int(m.group(1))] = time.perf_counter()
            log(f"    step {m.group(1)}: {line.strip()}")
    if proc.wait() != 0:
        raise SystemExit("".join(tail))
    steps = sorted(stamps)
    return [stamps[s] - stamps[s - 1] for s in steps if s > warmup and s - 1 in stamps]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="qwen0.5b-shape", choices=["qwen0.5b-shape", "tiny"])
    p.add_argument("--max-new-tokens", default="16,64", help="comma-separated; each is benchmarked")
    p.add_argument("--prompts", type=int, default=2)
    p.add_argument("--group-size", type=int, default=4)
    p.add_argument("--prompt-len", type=int, default=16)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="the trainer's and the worker's threads when overlapped")
    p.add_argument("--sync-threads", type=int, default=2)
    a = p.parse_args(argv)
    log = lambda msg: print(msg, file=sys.stderr, flush=True)  # noqa: E731
    import torch

    print(
        f"CPU: {cpu_name()}, {os.cpu_count()} cores, torch {torch.__version__} "
        f"({torch.backends.cpu.get_cpu_capability()}), fp32",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if a.model == "tiny":
            model_args = ["trainer.micro_batch_size=64"]
        else:
            log("saving the qwen0.5b-shape model ...")
            model_args = build_qwen_shape(tmp, 64, a.prompt_len)
        results = []
        for tokens in [int(t) for t in a.max_new_tokens.split(",")]:
            common = [
                *model_args,
                f"trainer.steps={a.steps}",
                f"trainer.prompts_per_step={a.prompts}",
                f"sampler.group_size={a.group_size}",
                f"sampler.max_new_tokens={tokens}",
                "algo.beta=0",
                "trainer.eval_before_after=false",
                "trainer.eval_every=0",
                "trainer.log_completions_every=0",
                "trainer.progress=false",
                "trainer.health=off",
                f"trainer.save_every={a.steps + 1}",
            ]
            if a.model != "tiny":
                common.append(f"trainer.micro_batch_size={a.group_size * a.prompts}")
            sides = {
                "sync": ["trainer.max_staleness=0", f"trainer.threads={a.sync_threads}"],
                "overlap": [
                    "trainer.max_staleness=1",
                    f"trainer.threads={a.threads}",
                    f"generator.threads={a.threads}",
                ],
            }
            times: dict[str, list[float]] = {k: [] for k in sides}
            for r in range(a.rounds):
                for name, extra in sides.items():
                    log(f"  {tokens} new tokens, round {r + 1}: {name}")
                    out = tmp / f"run-{tokens}-{name}-{r}"
                    secs = run([*common, *extra, f"output_dir={out}"], a.warmup, log)
                    shutil.rmtree(out)  # a 0.5B run writes 4 GiB (its last checkpoint and final/)
                    times[name].append(statistics.median(secs))
                    print(
                        f"{a.model}, {a.prompts} x {a.group_size}, {tokens} new tokens, round {r + 1}, {name:7s}: "
                        f"{statistics.median(secs):6.2f} s/step (steps {a.warmup + 1}-{a.steps}: "
                        f"{', '.join(f'{s:.2f}' for s in secs)})",
                        flush=True,
                    )
            sync, over = statistics.median(times["sync"]), statistics.median(times["overlap"])
            results.append((tokens, sync, over))
        print(
            f"\n{'new tokens':>10} | {'sync s/step':>11} | {'overlap s/step':>14} | {'sync steps/h':>12} | "
            f"{'overlap steps/h':>15} | speed-up"
        )
        for tokens, sync, over in results:
            print(
                f"{tokens:>10} | {sync:>11.2f} | {over:>14.2f} | {3600 / sync:>12.0f} | {3600 / over:>15.0f} | "
                f"{sync / over:.2f}x"
            )


if __name__ == "__main__":
    main()
