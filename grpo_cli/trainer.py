"""The GRPO loop, read top to bottom as seed 000 §1.9 and seed 004's pseudocode:
collect groups -> rewards -> group advantages -> (old / reference log-probs) -> mu clipped updates
-> metrics -> checkpoint.
"""

from __future__ import annotations

import math
import random
import time
from pathlib import Path

import numpy as np
import torch
from transformers import get_scheduler

from grpo_cli.checkpoint import save_checkpoint
from grpo_cli.console import Console, MetricsLog
from grpo_cli.data import PromptOrder, load_data
from grpo_cli.errors import GrpoError
from grpo_cli.evaluate import greedy_scores
from grpo_cli.models import load_model, load_tokenizer
from grpo_cli.objective import group_advantages, micro_batch_weight, policy_loss
from grpo_cli.rewards import build_reward
from grpo_cli.rewards.exact_match import is_correct
from grpo_cli.rollout import Rollout, generate, token_logprobs


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
    if cfg.algo.num_iterations < 1:
        problems.append("algo.num_iterations (mu) must be at least 1")
    if cfg.algo.beta < 0 or not 0 < cfg.algo.clip_eps < 1:
        problems.append("algo.beta must be >= 0 and algo.clip_eps in (0, 1)")
    if problems:
        raise GrpoError("; ".join(problems) + ".")


def build_optimizer(model, cfg, total_steps: int):
    if cfg.name != "adamw":
        raise GrpoError(f"Unknown optimizer.name={cfg.name!r}; choose optimizer=adamw.")
    opt = torch.optim.AdamW(
        [p for p in model.parameters() if p.requires_grad],
        lr=cfg.lr, betas=tuple(cfg.betas), weight_decay=cfg.weight_decay, eps=cfg.eps,
    )
    try:
        sched = get_scheduler(cfg.scheduler, opt, num_warmup_steps=cfg.warmup_steps, num_training_steps=max(total_steps, 1))
    except ValueError as e:
        raise GrpoError(f"optimizer.scheduler={cfg.scheduler!r} is not a transformers schedule ({e}).") from None
    return opt, sched


def score(model, roll: Rollout, temperature: float, micro_batch_size: int, with_entropy: bool = False):
    """Token log-probabilities of the rollout under `model`, without gradients: [B, T]."""
    logps, ents = [], []
    with torch.no_grad():
        for s in range(0, roll.input_ids.shape[0], micro_batch_size):
            lp, ent = token_logprobs(
                model, roll.input_ids[s : s + micro_batch_size], roll.attention_mask[s : s + micro_batch_size],
                roll.completion_len, temperature=temperature, with_entropy=with_entropy,
            )
            logps.append(lp)
            ents.append(ent)
    return torch.cat(logps), (torch.cat(ents) if with_entropy else None)


def optimise(policy, optimizer, roll: Rollout, cfg) -> dict:
    """One optimiser step on the clipped surrogate (seed 000 eq. 6) over the whole rollout batch,
    accumulated over micro-batches weighted so the sum equals the full-batch loss."""
    algo, mb = cfg.algo, cfg.trainer.micro_batch_size
    B, T = roll.completion_mask.shape
    total_tokens = roll.completion_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    totals = {"loss": 0.0, "kl": 0.0, "clip_frac_low": 0.0, "clip_frac_high": 0.0, "ratio_mean": 0.0}
    ratio_min, ratio_max = math.inf, -math.inf
    for s in range(0, B, mb):
        rows = slice(s, s + mb)
        mask = roll.completion_mask[rows]
        logp, _ = token_logprobs(
            policy, roll.input_ids[rows], roll.attention_mask[rows], T, temperature=cfg.sampler.temperature
        )
        # On-policy with mu = 1, pi_theta_old is the current policy: ratio 1, gradient A * grad log pi.
        old = roll.old_logp[rows] if roll.old_logp is not None else logp.detach()
        loss, m = policy_loss(
            logp, old, roll.advantages[rows], mask,
            clip_eps=algo.clip_eps, clip_eps_high=algo.clip_eps_high, beta=algo.beta,
            ref_logp=roll.ref_logp[rows] if roll.ref_logp is not None else None,
            kl_estimator=algo.kl_estimator, aggregation=algo.aggregation, ratio_level=algo.ratio_level,
            max_completion_length=T,
        )
        w = micro_batch_weight(algo.aggregation, mask, total_tokens, B)
        (loss * w).backward()
        share = float(mask.sum()) / max(float(total_tokens), 1.0)  # metrics are token means
        totals["loss"] += float(loss.detach()) * w
        for k in ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean"):
            totals[k] += m[k] * share
        ratio_min, ratio_max = min(ratio_min, m["ratio_min"]), max(ratio_max, m["ratio_max"])
    params = [p for p in policy.parameters() if p.grad is not None]
    max_norm = cfg.optimizer.max_grad_norm if cfg.optimizer.max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
    optimizer.step()
    return {**totals, "ratio_min": ratio_min, "ratio_max": ratio_max, "grad_norm": grad_norm}


def grpo_step(policy, reference, tokenizer, optimizer, prompts, answers, reward_fn, cfg) -> dict:
    """Collect groups, score them, whiten within groups, and run mu updates (seed 000 §1.9)."""
    t0 = time.perf_counter()
    G, sampler = cfg.sampler.group_size, cfg.sampler
    roll = generate(
        policy, tokenizer, prompts, G, max_new_tokens=sampler.max_new_tokens,
        temperature=sampler.temperature, top_p=sampler.top_p, top_k=sampler.top_k,
    )
    t_gen = time.perf_counter()

    rep_prompts = [p for p in prompts for _ in range(G)]
    rep_answers = [a for a in answers for _ in range(G)]
    rewards = torch.tensor(reward_fn(rep_prompts, roll.completions, rep_answers)).view(len(prompts), G)
    roll.rewards = rewards
    roll.advantages = group_advantages(rewards, scale=cfg.algo.scale, std=cfg.algo.std, eps=cfg.algo.eps).flatten().to(
        roll.input_ids.device
    )
    # Only the log-probabilities this config needs (DESIGN.md: none when beta = 0 and mu = 1).
    mb, temp = cfg.trainer.micro_batch_size, sampler.temperature
    if cfg.algo.num_iterations > 1:
        roll.old_logp, _ = score(policy, roll, temp, mb)
    if reference is not None:
        roll.ref_logp, _ = score(reference, roll, temp, mb)
    t_score = time.perf_counter()

    for _ in range(cfg.algo.num_iterations):
        stats = optimise(policy, optimizer, roll, cfg)
    t_end = time.perf_counter()

    lengths = roll.completion_mask.sum(1).float()
    correct = [is_correct(c, a) for c, a in zip(roll.completions, rep_answers)]
    return {
        "reward_mean": float(rewards.mean()),
        "reward_std": float(rewards.std(unbiased=False)),
        "accuracy": sum(correct) / len(correct),
        "zero_var_frac": float((rewards.amax(1) == rewards.amin(1)).float().mean()),
        **stats,
        "completion_len": float(lengths.mean()),
        "truncated_frac": float(roll.truncated.float().mean()),
        "gen_s": t_gen - t0,
        "score_s": t_score - t_gen,
        "update_s": t_end - t_score,
        "seconds": t_end - t0,
        "tokens_per_s": float(lengths.sum()) / max(t_end - t0, 1e-9),
    }


def train(cfg, run_dir: Path, console: Console) -> dict:
    """`grpo train`: the whole run. Returns the summary printed at the end."""
    check_config(cfg)
    t = cfg.trainer
    run_dir = Path(run_dir)
    try:
        run_dir.mkdir(parents=True, exist_ok=True)
        (run_dir / ".write_test").write_text("")
        (run_dir / ".write_test").unlink()
    except OSError as e:
        raise GrpoError(f"Cannot write to the run directory {run_dir} ({e.strerror}); choose another with output_dir=DIR.") from None
    set_seed(t.seed)

    tokenizer = load_tokenizer(cfg.model.path, cfg.model.trust_remote_code)
    policy = load_model(cfg.model.path, cfg.model.dtype, cfg.model.device, cfg.model.trust_remote_code)
    reference = None
    if cfg.algo.beta != 0:  # the KL anchor is loaded only when it is used
        reference = load_model(cfg.model.path, cfg.model.dtype, cfg.model.device, cfg.model.trust_remote_code)
        reference.requires_grad_(False)
    data = load_data(cfg.data)
    train_rows, test_rows = data["train"], data["test"]
    reward_fn = build_reward(cfg.reward)
    optimizer, scheduler = build_optimizer(policy, cfg.optimizer, t.steps)
    order = PromptOrder(len(train_rows), t.prompts_per_step, t.seed)
    metrics = MetricsLog(run_dir / "metrics.jsonl")
    held_out = test_rows.select(range(min(t.eval_prompts, len(test_rows))))

    def held_out_scores() -> dict:
        return greedy_scores(
            policy, tokenizer, held_out[cfg.data.prompt_field], held_out[cfg.data.answer_field],
            reward_fn, max_new_tokens=cfg.sampler.max_new_tokens,
        )

    before = held_out_scores() if t.eval_before_after else None
    if before:
        console.print(f"held-out greedy accuracy before training: {before['accuracy']:.3f}")

    zero_var_streak, start = 0, time.perf_counter()
    with console.training(t.steps):
        for step in range(1, t.steps + 1):
            rows = train_rows[order.indices(step - 1)]
            policy.train()
            row = grpo_step(
                policy, reference, tokenizer, optimizer,
                rows[cfg.data.prompt_field], rows[cfg.data.answer_field], reward_fn, cfg,
            )
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            row = {"step": step, **row, "lr": lr}
            if step % t.log_every == 0 or step == t.steps:
                metrics.write(row)
            console.step(row)

            zero_var_streak = zero_var_streak + 1 if row["zero_var_frac"] == 1.0 else 0
            if zero_var_streak == t.zero_variance_warn_steps:
                console.warn(
                    f"every group has had zero reward variance for {zero_var_streak} steps, so the advantages "
                    "and the loss are zero and nothing learns; raise sampler.temperature or group_size, or use "
                    "an easier task or a denser reward."
                )
            if step % t.save_every == 0 or step == t.steps:
                save_checkpoint(
                    run_dir, step, policy, tokenizer,
                    {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()},
                )

    policy.eval()
    final_dir = run_dir / "final"
    policy.save_pretrained(final_dir)
    tokenizer.save_pretrained(final_dir)
    rows = metrics.read()
    last = rows[-20:]
    summary = {
        "steps": t.steps,
        "reward_first": rows[0]["reward_mean"] if rows else None,
        "reward_last20": sum(r["reward_mean"] for r in last) / len(last) if last else None,
        "seconds": time.perf_counter() - start,
        "run_dir": str(run_dir),
    }
    if before:
        after = held_out_scores()
        summary.update(accuracy_before=before["accuracy"], accuracy_after=after["accuracy"])
        console.print(
            f"held-out greedy accuracy: before {before['accuracy']:.3f} -> after {after['accuracy']:.3f} "
            f"({len(held_out)} test prompts)"
        )
    return summary
