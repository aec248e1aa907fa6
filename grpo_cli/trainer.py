"""The GRPO loop, read top to bottom as seed 000 §1.9 and seed 004's pseudocode:
collect groups -> rewards -> group advantages -> (old / reference log-probs) -> mu clipped updates
-> metrics -> checkpoint.
"""

from __future__ import annotations

import math
import random
import signal
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from transformers import get_scheduler

from grpo_cli.checkpoint import experiment_diff, load_state, resolve_resume, save_checkpoint, set_rng_state
from grpo_cli.console import Console, MetricsLog
from grpo_cli.data import PromptOrder, load_data
from grpo_cli.errors import GrpoError
from grpo_cli.evaluate import greedy_scores, sampled_accuracy
from grpo_cli.models import load_model, load_tokenizer
from grpo_cli.objective import (
    ADVANTAGE_SCALES, AGGREGATIONS, KL_ESTIMATORS, RATIO_LEVELS, STD_KINDS,
    group_advantages, micro_batch_weight, policy_loss, token_kl,
)
from grpo_cli.rewards import build_reward, score_batch
from grpo_cli.rewards.exact_match import exact_match_reward
from grpo_cli.rollout import Rollout, concat_rollouts, generate, token_logprobs
from grpo_cli.stopping import GracefulStop, Stopped


def set_seed(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def clock(device: torch.device) -> float:
    """Wall time after the device's queued work: without the sync, CUDA phases bill each other."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


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


def score(model, roll: Rollout, temperature: float, micro_batch_size: int):
    """Token log-probabilities of the rollout under `model`, without gradients: [B, T]."""
    with torch.no_grad():
        return torch.cat([
            token_logprobs(
                model, roll.input_ids[s : s + micro_batch_size], roll.attention_mask[s : s + micro_batch_size],
                roll.completion_len, temperature=temperature,
            )[0]
            for s in range(0, roll.input_ids.shape[0], micro_batch_size)
        ])


def loss_mask(roll: Rollout, mask_truncated: bool) -> torch.Tensor:
    """Completion tokens that enter the loss; with mask_truncated, none of a completion cut off
    by max_new_tokens (DAPO's overlong filtering): its reward judges an unfinished answer."""
    if not mask_truncated:
        return roll.completion_mask
    return roll.completion_mask * (~roll.truncated)[:, None]


def optimise(policy, optimizer, roll: Rollout, cfg, *, first_pass: bool = True) -> dict:
    """One optimiser step on the clipped surrogate (seed 000 eq. 6) over the whole rollout batch,
    accumulated over micro-batches weighted so the sum equals the full-batch loss."""
    algo, mb = cfg.algo, cfg.trainer.micro_batch_size
    full_mask = loss_mask(roll, algo.mask_truncated)
    B, T = full_mask.shape
    total_tokens = full_mask.sum()
    optimizer.zero_grad(set_to_none=True)
    totals = dict.fromkeys(("loss", "kl", "kl_behaviour", "clip_frac_low", "clip_frac_high", "ratio_mean", "entropy"), 0.0)
    ratio_min, ratio_max = math.inf, -math.inf
    for s in range(0, B, mb):
        rows = slice(s, s + mb)
        mask = full_mask[rows]
        logp, entropy = token_logprobs(
            policy, roll.input_ids[rows], roll.attention_mask[rows], T, temperature=cfg.sampler.temperature,
            with_entropy=first_pass,
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
        m["loss"] = float(loss.detach()) * w / max(share, 1e-12)
        # k3 of the sampled tokens against the behaviour estimates KL(pi_behaviour || pi_theta).
        m["kl_behaviour"] = float((token_kl(old, logp.detach(), "k3") * mask).sum() / mask.sum().clamp(min=1))
        m["entropy"] = float((entropy * mask).sum() / mask.sum().clamp(min=1)) if entropy is not None else 0.0
        for k in totals:
            totals[k] += m[k] * share
        ratio_min, ratio_max = min(ratio_min, m["ratio_min"]), max(ratio_max, m["ratio_max"])
    params = [p for p in policy.parameters() if p.grad is not None]
    max_norm = cfg.optimizer.max_grad_norm if cfg.optimizer.max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0
    optimizer.step()
    if not first_pass:
        del totals["entropy"]
    return {**totals, "ratio_min": ratio_min, "ratio_max": ratio_max, "grad_norm": grad_norm}


def collect(sampler_model, tokenizer, prompts, answers, reward_fn, cfg, refill=None, columns=None):
    """Sample G completions per prompt and score them: (rollout to train on, its answers, stats).

    The stats describe everything sampled this step (all refill rounds), not only the groups kept
    for training: under dynamic sampling the kept groups are mixed by construction, and their mean
    reward says nothing about how good the policy is.

    The rewards see each completion's token count and `columns` (dataset columns by name, one entry
    per prompt) when given; each term's values go to roll.extra["reward_terms"] for logging.
    With algo.dynamic_sampling (DAPO), groups whose rewards are all equal carry no signal and are
    dropped; `refill(round)` supplies more prompts (and answers, and optionally columns) until the
    batch is full again or algo.max_refill_rounds is spent, and the step trains on the groups it has.
    """
    s, G, n = cfg.sampler, cfg.sampler.group_size, len(prompts)
    kept, kept_answers, kept_rewards, kept_terms, rounds = [], [], [], [], 0
    seen_rewards, seen_terms, seen_correct = [], [], []
    check = exact_match_reward(cfg.reward.extract, cfg.reward.pattern)  # accuracy, whatever the reward

    def per_completion(values):
        return [v for v in values for _ in range(G)]

    def stats() -> dict:
        r = torch.cat(seen_rewards)  # [groups sampled, G]
        flat = (r.amax(1) == r.amin(1)).float().mean()
        return {
            "reward_mean": float(r.mean()), "reward_std": float(r.std(unbiased=False)),
            "accuracy": sum(seen_correct) / len(seen_correct), "zero_var_frac": float(flat),
            "dropped_frac": 1.0 - sum(len(k.prompts) for k in kept) / r.shape[0] if cfg.algo.dynamic_sampling else 0.0,
            **{f"reward/{k}": float(torch.cat([t[k] for t in seen_terms]).mean()) for k in seen_terms[0]},
        }

    while True:
        roll = generate(
            sampler_model, tokenizer, prompts, G, max_new_tokens=s.max_new_tokens,
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
        )
        total, terms = score_batch(
            reward_fn, per_completion(prompts), roll.completions, per_completion(answers),
            completion_tokens=roll.completion_mask.sum(1).tolist(),
            columns={k: per_completion(v) for k, v in (columns or {}).items()},
        )
        rewards = torch.tensor(total).view(len(prompts), G)
        terms = {k: torch.tensor(v).view(len(prompts), G) for k, v in terms.items()}  # [n, G] each
        seen_rewards.append(rewards)
        seen_terms.append(terms)
        seen_correct += check(None, roll.completions, per_completion(answers))
        if not cfg.algo.dynamic_sampling:
            roll.rewards, roll.extra["reward_terms"] = rewards, terms
            return roll, list(answers), stats()
        groups = (rewards.amax(1) != rewards.amin(1)).nonzero().flatten().tolist()[: n - sum(len(r.prompts) for r in kept)]
        if groups:
            kept.append(roll.select_groups(groups))
            kept_answers += [answers[g] for g in groups]
            kept_rewards.append(rewards[groups])
            kept_terms.append({k: v[groups] for k, v in terms.items()})
        if sum(len(r.prompts) for r in kept) >= n or refill is None or rounds >= cfg.algo.max_refill_rounds:
            break
        rounds += 1
        prompts, answers, *more = refill(rounds)
        columns = more[0] if more else None
    if not kept:  # every group was flat: train on the last batch (its loss is zero apart from KL)
        roll.rewards, roll.extra["reward_terms"] = rewards, terms
        return roll, list(answers), {**stats(), "dropped_frac": 1.0}
    roll = concat_rollouts(kept)
    roll.rewards = torch.cat(kept_rewards)
    roll.extra["reward_terms"] = {k: torch.cat([t[k] for t in kept_terms]) for k in terms}
    return roll, kept_answers, stats()


def grpo_step(policy, reference, tokenizer, optimizer, prompts, answers, reward_fn, cfg, *,
              behaviour=None, refill=None, columns=None) -> dict:
    """Collect groups, whiten within groups, and run mu updates (seed 000 §1.9).

    `behaviour` is pi_phi when it is not the current policy (seed 000 §1.2, §1.6): it samples, and
    its log-probabilities, recomputed here in the training precision, are the denominator of every
    ratio. On-policy they come from pi_theta_old, computed once per batch when mu > 1.
    """
    device = next(policy.parameters()).device
    t0 = clock(device)
    sampler_model = behaviour if behaviour is not None else policy
    roll, answers, sampled = collect(sampler_model, tokenizer, prompts, answers, reward_fn, cfg, refill, columns)
    t_gen = clock(device)

    algo, mb, temp = cfg.algo, cfg.trainer.micro_batch_size, cfg.sampler.temperature
    roll.advantages = group_advantages(roll.rewards, scale=algo.scale, std=algo.std, eps=algo.eps).flatten().to(
        roll.input_ids.device
    )
    # Only the log-probabilities this config needs (DESIGN.md: none when beta = 0 and mu = 1).
    if behaviour is not None:
        roll.old_logp = score(behaviour, roll, temp, mb)
    elif algo.num_iterations > 1:
        roll.old_logp = score(policy, roll, temp, mb)
    if reference is not None:
        roll.ref_logp = score(reference, roll, temp, mb)
    t_score = clock(device)

    passes = [optimise(policy, optimizer, roll, cfg, first_pass=i == 0) for i in range(algo.num_iterations)]
    stats = {**passes[0], **passes[-1]}  # entropy from the first pass (the sampled policy), the rest from the last
    t_end = clock(device)

    lengths = roll.completion_mask.sum(1).float()
    return {
        **sampled,  # reward, accuracy and flat groups over everything sampled this step
        **stats,
        "completion_len": float(lengths.mean()),
        "completion_tokens": int(lengths.sum()),
        "truncated_frac": float(roll.truncated.float().mean()),
        "gen_s": t_gen - t0,
        "score_s": t_score - t_gen,
        "update_s": t_end - t_score,
        "seconds": t_end - t0,
        "tokens_per_s": float(lengths.sum()) / max(t_end - t0, 1e-9),
    }


def load_policies(cfg, policy) -> dict:
    """The reference and behaviour policies of seed 000 §1.2, each loaded only when it differs
    from the current policy: the reference when beta != 0, the behaviour when off-policy."""
    m, algo = cfg.model, cfg.algo

    def frozen_copy(path: str):
        model = load_model(path, m.dtype, m.device, m.trust_remote_code)
        return model.requires_grad_(False)

    reference = frozen_copy(m.path) if algo.beta != 0 else None
    behaviour = None
    if algo.behaviour == "frozen":
        behaviour = frozen_copy(algo.behaviour_path or m.path)
    elif algo.behaviour == "lagged":
        behaviour = frozen_copy(m.path)
    return {"reference": reference, "behaviour": behaviour}


def refresh(policy, reference, behaviour, step: int, algo) -> None:
    """Seed 000 §1.9 step 5 and seed 003 step 5: copy the policy into the lagged behaviour and,
    every ref_refresh steps, into the reference (DeepSeekMath's iterative RL)."""
    if reference is not None and algo.ref_refresh and step % algo.ref_refresh == 0:
        reference.load_state_dict(policy.state_dict())
    if behaviour is not None and algo.behaviour == "lagged" and step % algo.behaviour_refresh == 0:
        behaviour.load_state_dict(policy.state_dict())


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

    weights = str(resume_from) if resume_from else cfg.model.path
    tokenizer = load_tokenizer(weights, cfg.model.trust_remote_code)
    policy = load_model(weights, cfg.model.dtype, cfg.model.device, cfg.model.trust_remote_code)
    policies = load_policies(cfg, policy)
    reference, behaviour = policies["reference"], policies["behaviour"]
    for name, model in policies.items():  # a refreshed reference or lagged behaviour is not on disk
        if model is not None and name in state:
            model.load_state_dict(state[name])
    data = load_data(cfg.data, tokenizer, log=console.warn)
    train_rows, test_rows = data["train"], data["test"]
    reward_fn = build_reward(cfg.reward)
    optimizer, scheduler = build_optimizer(policy, cfg.optimizer, t.steps)
    if state:
        optimizer.load_state_dict(state["optimizer"])
        scheduler.load_state_dict(state["scheduler"])
    order = PromptOrder(len(train_rows), t.prompts_per_step, t.seed)
    metrics = MetricsLog(run_dir / "metrics.jsonl")
    metrics.truncate(state.get("step", 0))  # rows past the checkpoint are redone, not duplicated
    held_out = test_rows.select(range(min(t.eval_prompts, len(test_rows))))

    def held_out_scores() -> dict:
        """Greedy accuracy, and the accuracy of completions sampled as in training (4 per prompt)."""
        prompts, answers, s = held_out[cfg.data.prompt_field], held_out[cfg.data.answer_field], cfg.sampler
        check = exact_match_reward(cfg.reward.extract, cfg.reward.pattern)
        scores = greedy_scores(policy, tokenizer, prompts, answers, reward_fn, max_new_tokens=s.max_new_tokens,
                               columns=held_out.to_dict(), check=check)
        scores["sampled_accuracy"] = sampled_accuracy(
            policy, tokenizer, prompts, answers, samples=4, max_new_tokens=s.max_new_tokens,
            temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, check=check,
        )
        return scores

    before = state.get("held_out_before") or (held_out_scores() if t.eval_before_after else None)
    if before:
        console.print(
            f"held-out accuracy on {len(held_out)} prompts before training: "
            f"greedy {before['accuracy']:.3f}, sampled {before['sampled_accuracy']:.3f}"
        )

    def refill(step: int):
        """More prompts for dynamic sampling, drawn by a generator seeded by (seed, step, round)."""
        def draw(round_: int):
            g = torch.Generator().manual_seed(t.seed * 1_000_003 + step * 1_009 + round_)
            rows = train_rows[torch.randint(len(train_rows), (t.prompts_per_step,), generator=g).tolist()]
            return rows[cfg.data.prompt_field], rows[cfg.data.answer_field], rows
        return draw

    def save(step: int) -> None:
        extra = {"reference": reference.state_dict()} if reference is not None and cfg.algo.ref_refresh else {}
        if behaviour is not None and cfg.algo.behaviour == "lagged":
            extra["behaviour"] = behaviour.state_dict()
        save_checkpoint(run_dir, step, policy, tokenizer, {
            "optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "config": asdict(cfg),
            "data_position": step * t.prompts_per_step, "held_out_before": before, "metrics": metrics.read(),
            **extra,
        }, keep_last=t.keep_last)

    if state:
        set_rng_state(state["rng"])  # last, after every setup step that draws random numbers
    first_step = state.get("step", 0) + 1
    zero_var_streak, start = 0, time.perf_counter()

    def announce(signum: int) -> None:
        console.warn(f"{signal.Signals(signum).name}: finishing this step and saving a checkpoint "
                     "(press Ctrl-C again to stop at once)")

    with console.training(t.steps, start=first_step - 1), GracefulStop(announce) as stop:
        for step in range(first_step, t.steps + 1):
            rows = train_rows[order.indices(step - 1)]
            policy.train()
            row = grpo_step(
                policy, reference, tokenizer, optimizer,
                rows[cfg.data.prompt_field], rows[cfg.data.answer_field], reward_fn, cfg,
                behaviour=behaviour, refill=refill(step), columns=rows,
            )
            lr = scheduler.get_last_lr()[0]
            scheduler.step()
            refresh(policy, reference, behaviour, step, cfg.algo)
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
            if step % t.save_every == 0 or step == t.steps or stop.signum:
                save(step)
            if stop.signum:
                raise Stopped(stop.signum, step)

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
        summary.update(
            greedy_accuracy_before=before["accuracy"], greedy_accuracy_after=after["accuracy"],
            sampled_accuracy_before=before["sampled_accuracy"], sampled_accuracy_after=after["sampled_accuracy"],
        )
        console.print(
            f"held-out accuracy on {len(held_out)} prompts: greedy {before['accuracy']:.3f} -> "
            f"{after['accuracy']:.3f}, sampled {before['sampled_accuracy']:.3f} -> {after['sampled_accuracy']:.3f}"
        )
    return summary
