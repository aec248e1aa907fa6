"""The GRPO loop, read top to bottom as seed 000 §1.9 and seed 004's pseudocode:
collect groups -> rewards -> group advantages -> (old / reference log-probs) -> mu clipped updates
-> metrics -> checkpoint.
"""

from __future__ import annotations

import random
import signal
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from transformers import get_scheduler

from grpo_cli.checkpoint import experiment_diff, load_state, resolve_resume, save_checkpoint, set_rng_state
from grpo_cli.choices import (ADVANTAGE_SCALES, AGGREGATIONS, KL_ESTIMATORS, LORA_QUANTIZE, PRECISIONS,
                              RATIO_LEVELS, STD_KINDS)
from grpo_cli.console import Console, MetricsLog, TensorBoard, tensorboard_writer
from grpo_cli.data import PromptOrder, load_data
from grpo_cli.runtime import prepare_process
from grpo_cli.errors import GrpoError
from grpo_cli.evaluate import greedy_scores, sampled_scores
from grpo_cli.generation import HFGenerator, group_seed
from grpo_cli.lora import merged_copy
from grpo_cli.models import load_tokenizer, resolve_device
from grpo_cli.policies import RunPolicies, load_policy
from grpo_cli.precision import check_pure_bf16_lr, training_precision
from grpo_cli.rewards import build_reward
from grpo_cli.rewards.exact_match import exact_match_reward
from grpo_cli.step import PromptBatch, completion_rows, grpo_step, shown_group
from grpo_cli.stopping import GracefulStop, Stopped


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def check_config(cfg) -> None:
    """Values the schema's types cannot rule out, caught before anything is loaded."""
    problems = []
    if cfg.sampler.group_size < 2:
        problems.append("sampler.group_size must be at least 2: a group of one has no relative advantage")
    if cfg.sampler.max_new_tokens < 1:
        problems.append("sampler.max_new_tokens must be at least 1")
    if cfg.sampler.temperature <= 0:
        problems.append("sampler.temperature must be positive (greedy sampling gives every group zero variance)")
    if cfg.trainer.micro_batch_size < 1 or cfg.trainer.prompts_per_step < 1 or cfg.trainer.steps < 0:
        problems.append("trainer.micro_batch_size, trainer.prompts_per_step must be >= 1 and trainer.steps >= 0")
    if min(cfg.trainer.eval_every, cfg.trainer.log_completions_every, cfg.trainer.log_completions_groups) < 0:
        problems.append("trainer.eval_every, trainer.log_completions_every and trainer.log_completions_groups must be >= 0")
    if cfg.algo.num_iterations < 1:
        problems.append("algo.num_iterations (mu) must be at least 1")
    if cfg.algo.beta < 0 or not 0 < cfg.algo.clip_eps < 1:
        problems.append("algo.beta must be >= 0 and algo.clip_eps in (0, 1)")
    for key, value, allowed in (
        ("algo.aggregation", cfg.algo.aggregation, AGGREGATIONS),
        ("algo.ratio_level", cfg.algo.ratio_level, RATIO_LEVELS),
        ("algo.kl_estimator", cfg.algo.kl_estimator, KL_ESTIMATORS),
        ("algo.scale", cfg.algo.scale, ADVANTAGE_SCALES),
        ("algo.std", cfg.algo.std, STD_KINDS),
    ):
        if value not in allowed:
            problems.append(f"{key}={value!r} must be one of {', '.join(allowed)}")
    if cfg.algo.behaviour not in ("current", "frozen", "lagged"):
        problems.append(f"algo.behaviour={cfg.algo.behaviour!r} must be current, frozen or lagged")
    if cfg.algo.behaviour == "lagged" and cfg.algo.behaviour_refresh < 1:
        problems.append("algo.behaviour=lagged needs algo.behaviour_refresh >= 1 (steps between copies)")
    if cfg.algo.behaviour_path and cfg.algo.behaviour != "frozen":
        problems.append("algo.behaviour_path is only used with algo.behaviour=frozen")
    if cfg.algo.ref_refresh < 0 or cfg.algo.behaviour_refresh < 0:
        problems.append("algo.ref_refresh and algo.behaviour_refresh must be >= 0")
    if cfg.trainer.precision not in PRECISIONS:
        problems.append(f"trainer.precision={cfg.trainer.precision!r} must be one of {', '.join(PRECISIONS)} "
                        "(fp16 training is not offered: bf16-mixed keeps float32 master weights without a loss scaler)")
    if cfg.trainer.threads < 0 or cfg.trainer.nonfinite_patience < 1:
        problems.append("trainer.threads must be >= 0 (0 = automatic) and trainer.nonfinite_patience >= 1")
    lora = cfg.model.lora
    if lora.r < 0 or (lora.r and (lora.alpha <= 0 or not 0 <= lora.dropout < 1)):
        problems.append("model.lora.r must be >= 0 (0 = off), model.lora.alpha > 0 and model.lora.dropout in [0, 1)")
    if lora.quantize is not None and lora.quantize not in LORA_QUANTIZE:
        problems.append(f"model.lora.quantize={lora.quantize!r} must be null or one of {', '.join(LORA_QUANTIZE)}")
    if lora.quantize and not lora.r:
        problems.append("model.lora.quantize=4bit quantizes the frozen base of a LoRA run; set model.lora.r too")
    if lora.r and cfg.algo.ref_refresh:
        problems.append("algo.ref_refresh copies the policy into a second model, which a LoRA run does not keep (its "
                        "reference is the base with the adapter off); set algo.ref_refresh=0 or train without model.lora")
    if problems:
        raise GrpoError("; ".join(problems) + ".")


def build_optimizer(model, cfg, total_steps: int):
    if cfg.name != "adamw":
        raise GrpoError(f"Unknown optimizer.name={cfg.name!r}; choose optimizer=adamw.")
    params = [p for p in model.parameters() if p.requires_grad]
    # Fused: one pass over each tensor instead of one per arithmetic op (1.37 s -> 0.31 s for 494M
    # float32 parameters on this CPU); torch has it for CPU and CUDA floating-point parameters.
    fused = all(p.device.type in ("cpu", "cuda") and p.dtype.is_floating_point for p in params)
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, eps=cfg.eps,
                            fused=fused or None)
    try:
        sched = get_scheduler(cfg.scheduler, opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=max(total_steps, 1))
    except ValueError as e:
        raise GrpoError(f"optimizer.scheduler={cfg.scheduler!r} is not a transformers schedule ({e}).") from None
    return opt, sched


def train(cfg, run_dir: Path, console: Console) -> dict:
    """`grpo train`: the whole run. Returns the summary printed at the end."""
    check_config(cfg)
    t = cfg.trainer
    if t.tensorboard:
        tensorboard_writer()  # a missing extra is reported before anything is loaded
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ".write_test").write_text("")
        (run_dir / ".write_test").unlink()
    except OSError as e:
        raise GrpoError(f"Cannot write to the run directory {run_dir} ({e.strerror}); choose another with output_dir=DIR.") from None
    prepare_process(t.threads, resolve_device(cfg.model.device))
    set_seed(t.seed)
    resume_from = resolve_resume(cfg.resume, run_dir)
    state = load_state(resume_from) if resume_from else {}
    if resume_from:
        if not cfg.output_dir and str(cfg.resume).lower() != "auto":
            run_dir = resume_from.parent.parent  # resume=PATH continues in that checkpoint's run
        changed = experiment_diff(state.get("config", {}), asdict(cfg))
        if changed:
            raise GrpoError(
                f"Refusing to resume from {resume_from}: these settings differ from the run being resumed "
                f"({'; '.join(changed)}); drop those overrides, or start a new run with resume=false."
            )
        console.print(f"resuming from {resume_from} (step {state['step']})")

    precision = training_precision(t.precision, resolve_device(cfg.model.device))
    tokenizer = load_tokenizer(str(resume_from) if resume_from else cfg.model.path, cfg.model.trust_remote_code)
    policy = load_policy(cfg, precision, resume_from)
    if precision.name == "bf16" and not cfg.model.lora.r:  # a LoRA adapter is float32 whatever the base
        check_pure_bf16_lr(policy, cfg.optimizer.lr)
    policies = RunPolicies(cfg, precision, policy)
    policies.load_state_dict(state)  # a refreshed reference or lagged behaviour is not on disk
    roles = policies.roles()
    generator = HFGenerator(tokenizer, chat_template=cfg.data.chat_template, precision=precision)
    data = load_data(cfg.data, tokenizer, log=console.warn)
    train_rows, test_rows = data["train"], data["test"]
    reward_fn = build_reward(cfg.reward)
    optimizer, scheduler = build_optimizer(policy, cfg.optimizer, t.steps)
    if state:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    order = PromptOrder(len(train_rows), t.prompts_per_step, t.seed)
    resumed_at = state.get("step", 0)
    metrics = MetricsLog(run_dir / "metrics.jsonl",
                         TensorBoard(run_dir, purge_step=resumed_at + 1 if state else None) if t.tensorboard else None)
    samples_log = MetricsLog(run_dir / "completions.jsonl")
    for log in (metrics, samples_log):
        log.truncate(resumed_at)  # rows past the checkpoint are redone, not duplicated
    held_out = test_rows.select(range(min(t.eval_prompts, len(test_rows))))

    def held_out_scores() -> dict:
        """Greedy accuracy, and the accuracy of completions sampled as in training (4 per prompt, the
        same sampling noise at every evaluation: each prompt's seed depends on the run seed alone)."""
        prompts, answers, s = held_out[cfg.data.prompt_field], held_out[cfg.data.answer_field], cfg.sampler
        check = exact_match_reward(cfg.reward.extract, cfg.reward.pattern)
        scores = greedy_scores(generator, policy, prompts, answers, reward_fn, max_new_tokens=s.max_new_tokens,
                               columns=held_out.to_dict(), check=check)
        scores.update(sampled_scores(generator, policy, prompts, answers, samples=4, ks=[], sampler=s,
                                     extract=cfg.reward.extract, pattern=cfg.reward.pattern, seed=t.seed))
        return scores

    def eval_row(step: int, scores: dict) -> dict:
        """Held-out scores as a metrics row: `eval/` keys and no `reward_mean`, so readers of the
        training rows (which filter on it) pass them by."""
        return {"step": step, "kind": "eval", **{f"eval/{k}": v for k, v in scores.items() if k != "num_prompts"}}

    def evaluate_now(step: int) -> None:
        """trainer.eval_every: held-out scores (seeded per prompt, so training's random numbers are untouched)."""
        scores = held_out_scores()
        metrics.write(eval_row(step, scores))
        console.print(f"step {step} held-out: greedy accuracy {scores['accuracy']:.3f}, "
                      f"sampled {scores['sampled_accuracy']:.3f}, reward {scores['reward_mean']:.3f}")

    before = state.get("held_out_before") or (held_out_scores() if t.eval_before_after else None)
    if before:
        console.print(
            f"held-out accuracy on {len(held_out)} prompts before training: "
            f"greedy {before['accuracy']:.3f}, sampled {before['sampled_accuracy']:.3f}"
        )
        if t.eval_every and not state:
            metrics.write(eval_row(0, before))  # where the held-out curve starts

    def prompt_batch(rows, step: int, round_: int = 0) -> PromptBatch:
        """A sampling round's prompts, each group's noise seeded by (run seed, step, position, round)."""
        seeds = [group_seed(t.seed, step, i, round_) for i in range(len(rows[cfg.data.prompt_field]))]
        return PromptBatch(rows[cfg.data.prompt_field], rows[cfg.data.answer_field], seeds, rows)

    def refill(step: int):
        """More prompts for dynamic sampling, drawn by a generator seeded by (seed, step, round)."""
        def draw(round_: int) -> PromptBatch:
            g = torch.Generator().manual_seed(t.seed * 1_000_003 + step * 1_009 + round_)
            rows = train_rows[torch.randint(len(train_rows), (t.prompts_per_step,), generator=g).tolist()]
            return prompt_batch(rows, step, round_)
        return draw

    def save(step: int) -> None:
        extra = policies.state_dict()
        # No data position: PromptOrder makes the prompts of every step a function of (seed, step).
        save_checkpoint(run_dir, step, policy, tokenizer, {
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "config": asdict(cfg),
            "held_out_before": before, **extra,
        }, keep_last=t.keep_last)

    if state:
        set_rng_state(state["rng"])  # last, after every setup step that draws random numbers
    first_step = state.get("step", 0) + 1
    zero_var_streak, skipped_streak, start = 0, 0, time.perf_counter()

    def announce(signum: int) -> None:
        console.warn(f"{signal.Signals(signum).name}: finishing this step and saving a checkpoint "
                     "(press Ctrl-C again to stop at once)")

    with console.training(t.steps, start=first_step - 1), GracefulStop(announce) as stop:
        for step in range(first_step, t.steps + 1):
            policy.train()
            row, roll = grpo_step(roles, generator, optimizer, prompt_batch(train_rows[order.indices(step - 1)], step),
                                  reward_fn, cfg, precision=precision, refill=refill(step))
            skipped_streak = skipped_streak + 1 if row["skipped"] else 0
            if row["skipped"]:
                console.warn(f"step {step}: the loss or gradient was not finite, so this update was skipped "
                             f"({skipped_streak} in a row; the run stops at trainer.nonfinite_patience={t.nonfinite_patience}).")
            if skipped_streak >= t.nonfinite_patience:
                raise GrpoError(
                    f"{skipped_streak} updates in a row had a non-finite loss or gradient (step {step}), so training "
                    "stopped with the weights of the last finite update; lower optimizer.lr, check that the reward "
                    "is bounded, or resume from the last checkpoint with resume=auto."
                )
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            policies.refresh(step)
            row = {"step": step, **row, "lr": lr}
            if step % t.log_every == 0 or step == t.steps:
                metrics.write(row)
            console.step(row)
            if t.log_completions_every and t.log_completions_groups and step % t.log_completions_every == 0:
                sample = completion_rows(step, roll, t.log_completions_groups)
                for r in sample:
                    samples_log.write(r)
                show = shown_group(sample, roll.group_size)
                console.completions(show, f"step {step}: completions of {show[0]['prompt']!r} (answer "
                                    f"{show[0]['answer']}); {len(sample)} in completions.jsonl")
            if t.eval_every and step % t.eval_every == 0:
                evaluate_now(step)

            zero_var_streak = zero_var_streak + 1 if row["zero_var_frac"] == 1.0 else 0
            if zero_var_streak == t.zero_variance_warn_steps:
                console.warn(
                    f"every group has had zero reward variance for {zero_var_streak} steps, so the advantages "
                    "and the loss are zero and nothing learns; raise sampler.temperature or group_size, or use "
                    "an easier task or a denser reward."
                )
            if step % t.save_every == 0 or step == t.steps or stop.signum:
                save(step)
            if stop.signum:
                raise Stopped(stop.signum, step)

    policy.eval()
    final_dir = run_dir / "final"
    if cfg.model.lora.r:  # the adapter alone, and the merged model that AutoModelForCausalLM loads
        policy.save_pretrained(final_dir / "adapter")
        tokenizer.save_pretrained(final_dir / "adapter")
        merged_copy(cfg.model.path, policy).save_pretrained(final_dir)
    else:
        policy.save_pretrained(final_dir)
    tokenizer.save_pretrained(final_dir)
    if metrics.tensorboard is not None:
        metrics.tensorboard.close()
    rows = [r for r in metrics.read() if "reward_mean" in r]  # training rows, not eval/ ones
    last = rows[-20:]
    summary = {
        "steps": t.steps,
        "reward_first": rows[0]["reward_mean"] if rows else None,
        "reward_last20": sum(r["reward_mean"] for r in last) / len(last) if last else None,
        "seconds": time.perf_counter() - start,
        "run_dir": str(run_dir),
    }
    if before:
        after = held_out_scores()  # drawn like every periodic evaluation: the last one agrees
        summary.update(
            greedy_accuracy_before=before["accuracy"], greedy_accuracy_after=after["accuracy"],
            sampled_accuracy_before=before["sampled_accuracy"], sampled_accuracy_after=after["sampled_accuracy"],
        )
        console.print(
            f"held-out accuracy on {len(held_out)} prompts: greedy {before['accuracy']:.3f} -> "
            f"{after['accuracy']:.3f}, sampled {before['sampled_accuracy']:.3f} -> {after['sampled_accuracy']:.3f}"
        )
    return summary
