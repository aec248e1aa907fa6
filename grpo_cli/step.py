"""One GRPO step (seed 000 §1.9): collect groups from the sampling policy, score them, whiten the
rewards within each group, compute only the log-probabilities the config needs, and run mu clipped
updates. `trainer.train` calls it once per step; benchmarks call it alone.
"""

from __future__ import annotations

import math
import time

import torch

from grpo_cli.objective import group_advantages, micro_batch_weight, policy_loss, token_kl
from grpo_cli.rewards import score_batch
from grpo_cli.rewards.exact_match import exact_match_reward
from grpo_cli.rollout import Rollout, concat_rollouts, generate, token_logprobs


def clock(device: torch.device) -> float:
    """Wall time after the device's queued work: without the sync, CUDA phases bill each other."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


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
              behaviour=None, refill=None, columns=None, return_rollout: bool = False):
    """Collect groups, whiten within groups, and run mu updates (seed 000 §1.9): the metrics row,
    or (row, rollout) with return_rollout (the rollout's extra["answers"] holds its groups' answers).

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
    row = {
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
    if not return_rollout:
        return row
    roll.extra["answers"] = answers
    return row, roll


def completion_rows(step: int, roll: Rollout, groups: int) -> list[dict]:
    """Every completion of the first `groups` groups with its reward and advantage, for completions.jsonl."""
    G, answers = roll.group_size, roll.extra["answers"]
    return [
        {"step": step, "prompt": roll.prompts[g], "completion": roll.completions[g * G + j], "answer": str(answers[g]),
         "reward": float(roll.rewards[g, j]), "advantage": float(roll.advantages[g * G + j])}
        for g in range(min(groups, len(roll.prompts))) for j in range(G)
    ]


def shown_group(rows: list[dict], group_size: int) -> list[dict]:
    """The first logged group whose rewards differ (the ones that teach), else the first."""
    groups = [rows[s : s + group_size] for s in range(0, len(rows), group_size)]
    return next((g for g in groups if len({r["reward"] for r in g}) > 1), groups[0])
