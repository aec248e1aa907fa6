"""The `trainer` and `hub` groups: the loop's length and batch, logging, checkpoints, precision and processes."""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional

from grpo_cli.config.declare import Settings, rule, setting

PRECISIONS = ("auto", "fp32", "bf16-mixed", "bf16")  # training: models/precision.py (auto picks one of the others)


def _precision(value) -> str | None:
    return (
        None
        if value in PRECISIONS
        else (
            f"trainer.precision={value!r} must be one of {', '.join(PRECISIONS)} (fp16 training is not offered: "
            "bf16-mixed "
            "keeps float32 master weights without a loss scaler; auto picks it where bf16 is fast)"
        )
    )


def _evaluating(c) -> bool:
    return c.trainer.eval_before_after or bool(c.trainer.eval_every)


@dataclass
class TrainerConfig(Settings):
    steps: int = setting(300, "GRPO steps (one rollout batch each)", low=0)
    prompts_per_step: int = setting(32, "n: prompts per step; the batch holds n * G completions", low=1)
    micro_batch_size: int = setting(
        64, "completions per forward/backward; gradients accumulate over micro-batches", low=1
    )
    packing: bool = setting(
        True, "rows packed end to end with position ids, no pad token in any forward (where the attention supports it)"
    )
    shared_prompts: bool = setting(
        True, "with packing: a group's prompt computed once per micro-batch for its G samples, where that saves work"
    )
    max_tokens_per_micro_batch: int = setting(
        0,
        "micro-batches by token count instead of rows (0 = off): at most "
        "this many positions each, padding or filler included",
        low=0,
    )
    memory_gib: float = setting(
        0.0,
        "plan for this much memory: picks max_tokens_per_micro_batch, refuses a config that cannot fit (0 = off)",
        low=0,
    )
    seed: int = setting(0, "one seed for data order, sampling and init: same seed + config = same run on CPU", low=0)
    log_every: int = setting(1, "steps between metrics rows", low=1)
    save_every: int = setting(100, "steps between checkpoints (one is always written at the end)", low=1)
    eval_before_after: bool = setting(True, "greedy held-out accuracy before and after training")
    eval_before_at: str = setting(
        "start",
        "when the scores before training are measured: start | end (the initial "
        "weights loaded again after the last step)",
        choices=("start", "end"),
    )
    eval_prompts: int = setting(200, "held-out prompts used for that evaluation")
    zero_variance_warn_steps: int = setting(
        5, "health rule zero_variance: every group's rewards equal this many steps running", low=1
    )
    health: str = setting(
        "warn",
        "health checks (docs/how-to/troubleshooting.md): warn (one line per rule, once) | "
        "stop (checkpoint, then stop) | off",
        choices="grpo_cli.run.health:HEALTH_MODES",
    )
    progress: bool = setting(True, "rich progress bar (off: plain log lines)")
    keep_last: int = setting(0, "keep only the newest K checkpoints (0 = keep all)", low=0)
    eval_every: int = setting(50, "steps between held-out evaluations, eval/* rows of metrics.jsonl (0 = off)", low=0)
    log_completions_every: int = setting(
        50, "steps between samples of completions written to completions.jsonl and shown (0 = off)", low=0
    )
    log_completions_groups: int = setting(2, "prompt groups (all G completions each) in each such sample", low=0)
    trackers: List[str] = setting(
        factory=list,
        help="more places every metrics row goes: tensorboard, wandb, mlflow, trackio",
        choices="grpo_cli.run.trackers:TRACKERS",
    )
    tracker_project: str = setting("grpo-cli", "the project (wandb, trackio) or experiment (MLflow) of the run")
    precision: str = setting(
        "fp32",
        "fp32 | bf16-mixed (fp32 master weights, bf16 compute) | bf16 | auto (bf16-mixed "
        "where bf16 is fast, else fp32)",
        check=_precision,
    )
    threads: int = setting(
        0, "torch CPU threads; 0 = OMP_NUM_THREADS if set, else the cores available / local processes", low=0
    )
    nonfinite_patience: int = setting(
        3, "an update with a non-finite loss or gradient is skipped; this many in a row stop the run", low=1
    )
    strategy: str = setting(
        "auto",
        "single | ddp | fsdp (FSDP2) under torchrun; auto = ddp under torchrun",
        choices=("auto", "single", "ddp", "fsdp"),
    )
    max_staleness: int = setting(
        0,
        "updates the sampling weights may lag the policy: > 0 generates in a worker process while the trainer updates",
        low=0,
    )
    deterministic: bool = setting(
        False, "CUDA: deterministic kernels, so a resumed run matches bitwise on the same GPU; slower"
    )


@rule("trainer.eval_prompts", "trainer.eval_before_after", "trainer.eval_every")
def _eval_prompts(p, c) -> None:
    t = c.trainer
    if _evaluating(c):  # the sentence names how to have no evaluation, which 0 seems to ask
        p.need(
            t.eval_prompts >= 1,
            f"trainer.eval_prompts={t.eval_prompts} must be >= 1 (for no held-out evaluation: "
            "trainer.eval_before_after=false trainer.eval_every=0)",
        )


@dataclass
class HubConfig(Settings):
    push: bool = setting(
        False, "true: upload final/ (weights, tokenizer, model card, config.yaml) at the end of the run"
    )
    repo_id: Optional[str] = setting(None, "the hub repository, e.g. me/my-grpo-model (created if missing)")
    private: bool = setting(True, "a repository created here is private")
