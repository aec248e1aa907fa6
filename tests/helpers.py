"""What the tests share: one way to run the CLI (in this process, or in a fresh one as a user would),
the short-run overrides, and readers of a run's files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_cli.generate.hf import HFGenerator
from grpo_cli.sample.rollout import Sampling

# A run small enough for a test: 4 prompts x G = 4 per step, no held-out scoring, plain log lines.
SMALL = ["trainer.prompts_per_step=4", "sampler.group_size=4", "trainer.eval_before_after=false",
         "trainer.progress=false"]
SMALL_DATA = ["data.max_operand=9", "data.num_test=20"]  # the arithmetic task at 100 problems
FAST = ["trainer.steps=2", *SMALL, *SMALL_DATA]


class _Timing(frozenset):
    """The metrics that differ between identical runs or machines: these names, and every efficiency/<phase>."""

    def __contains__(self, key) -> bool:
        return super().__contains__(key) or str(key).startswith("efficiency/")


TIMING = _Timing({"seconds", "gen_s", "score_s", "update_s", "tokens_per_s", "env/seconds", "peak_memory_gib",
                  "memory_gib", "health/memory_growth", "push_s", "wait_s", "env_s", "worker/gen_s",
                  "worker/score_s", "gen_floor_s"})
ONE_THREAD = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}


def grpo(*args, hydra_dir: Path | None = None) -> int:
    """`grpo ARGS` in this process (Hydra and all); its exit code. `hydra_dir`: where Hydra's run
    directory goes when no output_dir is given."""
    from grpo_cli.cli import main

    extra = [f"hydra.run.dir={hydra_dir}"] if hydra_dir else []
    with pytest.raises(SystemExit) as e:
        main([*map(str, args), *extra])
        raise SystemExit(0)
    return e.value.code or 0


def grpo_process(*args, cwd=None, env: dict | None = None, timeout: int = 600,
                 check_rc: int | None = None) -> subprocess.CompletedProcess:
    """`grpo ARGS` in a fresh process, one torch thread, as a user would run it; `check_rc` asserts the
    exit code (showing the output when it differs)."""
    out = subprocess.run([sys.executable, "-m", "grpo_cli.cli", *map(str, args)], capture_output=True, text=True,
                         timeout=timeout, cwd=cwd, env={**os.environ, **ONE_THREAD, **(env or {})})
    if check_rc is not None:
        assert out.returncode == check_rc, out.stdout[-3000:] + out.stderr[-3000:]
    return out


REPO = Path(__file__).resolve().parent.parent


def docs_text() -> str:
    """The README and every page of docs/, in one text: what a user reads, where the tests find the commands
    and code they show."""
    pages = [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]
    return "\n\n".join(p.read_text() for p in pages)


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in Path(path).read_text().splitlines()]


def metric_rows(run: Path, *, training: bool = False, timing: bool = True) -> list[dict]:
    """metrics.jsonl of a run: every row, or the training rows only (held-out rows have no reward_mean);
    without `timing`, the keys that differ between identical runs left out."""
    rows = read_jsonl(Path(run) / "metrics.jsonl")
    rows = [r for r in rows if "reward_mean" in r] if training else rows
    return rows if timing else [{k: v for k, v in r.items() if k not in TIMING} for r in rows]


def generate(model, tokenizer, prompts, group_size=1, *, max_new_tokens, temperature=1.0, top_p=1.0, top_k=0,
             greedy=False, seeds=None, chat_template=False, with_logprobs=False):
    """A Rollout of `group_size` completions per prompt, through the trainer's own generator."""
    sampling = Sampling(max_new_tokens, temperature, top_p, top_k, greedy)
    return HFGenerator(tokenizer, chat_template=chat_template).generate(
        model, list(prompts), group_size, sampling, seeds, with_logprobs=with_logprobs)


def floats(metrics: dict) -> dict:
    """policy_loss's metrics (0-d tensors) as Python floats."""
    return {k: float(v) for k, v in metrics.items()}


def wait_for(predicate, timeout: float = 120.0, poll: float = 0.0005) -> bool:
    """Whether `predicate()` came true within `timeout` seconds (polled every `poll`)."""
    import time

    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(poll)
    return False


def with_batch_sizes(model, fn):
    """(fn(), the batch size of every forward of `model` while it ran): to see a decode batch shrink. Seen at
    the input embedding, which every forward calls once, the model's own and a direct decode step's."""
    seen = []
    hook = model.get_input_embeddings().register_forward_pre_hook(lambda m, args: seen.append(args[0].shape[0]))
    try:
        return fn(), seen
    finally:
        hook.remove()
