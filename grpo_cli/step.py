"""One GRPO step (docs/math.md, "The algorithm"): collect groups from the sampling policy, score them,
whiten the rewards within each group, compute only the log-probabilities the config needs, and run
mu clipped updates. `trainer.train` calls it once per step; benchmarks call it alone.

Every normaliser is global: under data parallelism (distributed.py) token and sequence counts are
summed over ranks, so the loss, its gradient and the logged metrics are those of the whole batch,
whatever the world size. Metrics stay device tensors until each update pass ends, then are read in
one host sync.
"""

from __future__ import annotations

import math
import time
from contextlib import nullcontext
from dataclasses import dataclass, field

import torch

from grpo_cli.distributed import SINGLE, Dist
from grpo_cli.generation import Sampling
from grpo_cli.logprobs import token_logprobs
from grpo_cli.objective import group_advantages, micro_batch_weight, policy_loss, token_kl
from grpo_cli.precision import Precision
from grpo_cli.rewards import score_batch
from grpo_cli.rewards.exact_match import exact_match_reward
from grpo_cli.rollout import Rollout, concat_rollouts


@dataclass
class Policies:
    """The policies by role (docs/math.md, "Policies"): the one being trained, the KL reference (None
    when beta = 0) and the behaviour policy that samples (None on-policy, where the policy samples).
    `reference_scope()` yields the model that scores as the reference: the reference model, or, under
    LoRA, the policy itself with its adapter switched off."""

    policy: torch.nn.Module
    reference: torch.nn.Module | None = None
    behaviour: torch.nn.Module | None = None
    reference_scope: object = None  # a context-manager factory yielding the reference scorer, when not `reference`

    @property
    def has_reference(self) -> bool:
        return self.reference is not None or self.reference_scope is not None


@dataclass
class PromptBatch:
    """The prompts of one sampling round, with what rewards need and each group's sampling seed."""

    prompts: list[str]
    answers: list[str]
    seeds: list[int]
    columns: dict[str, list] = field(default_factory=dict)  # dataset columns, one entry per prompt


def clock(device: torch.device) -> float:
    """Wall time after the device's queued work: without the sync, CUDA phases bill each other."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


def sampling_of(cfg) -> Sampling:
    s = cfg.sampler
    return Sampling(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p, top_k=s.top_k)


def score(model, roll: Rollout, temperature: float, micro_batch_size: int, precision: Precision):
    """Token log-probabilities of the rollout under `model`, without gradients: [B, T]."""
    with torch.no_grad(), precision.autocast():
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


# Metrics of an update pass: token-weighted sums over the batch (divided by its tokens at the end),
# and the ratio's extremes.
TOKEN_MEANS = ("kl", "kl_behaviour", "clip_frac_low", "clip_frac_high", "ratio_mean", "entropy")


def optimise(policy, optimizer, roll: Rollout, cfg, precision: Precision, *, first_pass: bool = True,
             dist: Dist = SINGLE) -> dict:
    """One optimiser step on the clipped surrogate over the whole (global) rollout batch, accumulated
    over micro-batches weighted so the sum equals the full-batch loss (docs/math.md, "Aggregation").

    A non-finite loss or gradient norm skips the step (the weights stay as they were) and is reported
    as `skipped = 1.0`; the caller counts and stops on a streak.
    """
    algo, mb = cfg.algo, cfg.trainer.micro_batch_size
    full_mask = loss_mask(roll, algo.mask_truncated)
    B, T = full_mask.shape
    starts = list(range(0, B, mb))
    # Every micro-batch's tokens, and the batch's normalisers summed over ranks (so the loss is
    # world-size invariant), in one sync before any work is queued.
    counts = torch.stack([full_mask[s : s + mb].sum() for s in starts]).float()
    totals = dist.all_sum(torch.stack([full_mask.sum().float(), torch.tensor(float(B), device=full_mask.device)]))
    *micro_tokens, total_tokens, total_seqs = torch.cat([counts, totals]).tolist()
    optimizer.zero_grad(set_to_none=True)
    device = full_mask.device
    sums = {k: torch.zeros((), device=device) for k in ("loss", *TOKEN_MEANS)}
    ratio_min, ratio_max = torch.full((), math.inf, device=device), torch.full((), -math.inf, device=device)
    for i, s in enumerate(starts):
        rows = slice(s, s + mb)
        mask = full_mask[rows]
        # DDP averages gradients over ranks; scaling by the world size makes that average a global sum.
        w = micro_batch_weight(algo.aggregation, micro_tokens[i], mask.shape[0], total_tokens, int(total_seqs))
        w *= dist.world_size
        with dist.no_sync(policy, last=i == len(starts) - 1):  # gradients are all-reduced once, after the last
            with precision.autocast():
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
                max_completion_length=cfg.sampler.max_new_tokens,
            )
            (loss * w).backward()
        tokens = micro_tokens[i]
        sums["loss"] += loss.detach() * (w / dist.world_size)
        m["kl_behaviour"] = (token_kl(old, logp.detach(), "k3") * mask).sum() / max(tokens, 1.0)
        m["entropy"] = (entropy * mask).sum() / max(tokens, 1.0) if entropy is not None else torch.zeros((), device=device)
        for k in TOKEN_MEANS:
            sums[k] += m[k] * tokens
        ratio_min, ratio_max = torch.minimum(ratio_min, m["ratio_min"]), torch.maximum(ratio_max, m["ratio_max"])
    params = [p for p in policy.parameters() if p.grad is not None]
    max_norm = cfg.optimizer.max_grad_norm if cfg.optimizer.max_grad_norm > 0 else math.inf
    grad_norm = torch.nn.utils.clip_grad_norm_(params, max_norm) if params else torch.zeros((), device=device)
    # The one host sync of this pass: every metric, reduced over ranks.
    values = dist.reduce_metrics(
        sums=torch.stack([sums[k] for k in ("loss", *TOKEN_MEANS)]), mins=ratio_min[None], maxs=ratio_max[None])
    loss_sum, *token_sums = values["sums"]
    finite = math.isfinite(loss_sum) and math.isfinite(float(grad_norm))
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # a skipped step's gradients are thrown away
    out = {"loss": loss_sum, **{k: v / max(total_tokens, 1.0) for k, v in zip(TOKEN_MEANS, token_sums)},
           "ratio_min": values["mins"][0], "ratio_max": values["maxs"][0], "grad_norm": float(grad_norm),
           "skipped": 0.0 if finite else 1.0}
    if not first_pass:
        del out["entropy"]
    return out


def collect(generator, sampler_model, batch: PromptBatch, reward_fn, cfg, refill=None):
    """Sample G completions per prompt and score them: (rollout to train on, its answers, stats).

    The stats describe everything sampled this step (all refill rounds), not only the groups kept
    for training: under dynamic sampling the kept groups are mixed by construction, and their mean
    reward says nothing about how good the policy is.

    The rewards see each completion's token count and the batch's columns (dataset columns by name,
    one entry per prompt); each term's values go to roll.extra["reward_terms"] for logging.
    With algo.dynamic_sampling (DAPO), groups whose rewards are all equal carry no signal and are
    dropped; `refill(round)` supplies another PromptBatch until the batch is full again or
    algo.max_refill_rounds is spent, and the step trains on the groups it has.
    """
    G, n, sampling = cfg.sampler.group_size, len(batch.prompts), sampling_of(cfg)
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
        roll = generator.generate(sampler_model, batch.prompts, G, sampling, batch.seeds)
        total, terms = score_batch(
            reward_fn, per_completion(batch.prompts), roll.completions, per_completion(batch.answers),
            completion_tokens=roll.completion_mask.sum(1).tolist(),
            columns={k: per_completion(v) for k, v in batch.columns.items()},
        )
        rewards = torch.tensor(total).view(len(batch.prompts), G)
        terms = {k: torch.tensor(v).view(rewards.shape) for k, v in terms.items()}  # [n, G] each
        seen_rewards.append(rewards)
        seen_terms.append(terms)
        seen_correct += check(None, roll.completions, per_completion(batch.answers))
        if not cfg.algo.dynamic_sampling:
            roll.rewards, roll.extra["reward_terms"] = rewards, terms
            return roll, list(batch.answers), stats()
        groups = (rewards.amax(1) != rewards.amin(1)).nonzero().flatten().tolist()[: n - sum(len(r.prompts) for r in kept)]
        if groups:
            kept.append(roll.select_groups(groups))
            kept_answers += [batch.answers[g] for g in groups]
            kept_rewards.append(rewards[groups])
            kept_terms.append({k: v[groups] for k, v in terms.items()})
        if sum(len(r.prompts) for r in kept) >= n or refill is None or rounds >= cfg.algo.max_refill_rounds:
            break
        rounds += 1
        batch = refill(rounds)
    if not kept:  # every group was flat: train on the last batch (its loss is zero apart from KL)
        roll.rewards, roll.extra["reward_terms"] = rewards, terms
        return roll, list(batch.answers), {**stats(), "dropped_frac": 1.0}
    roll = concat_rollouts(kept)
    roll.rewards = torch.cat(kept_rewards)
    roll.extra["reward_terms"] = {k: torch.cat([t[k] for t in kept_terms]) for k in terms}
    return roll, kept_answers, stats()


def grpo_step(policies: Policies, generator, optimizer, batch: PromptBatch, reward_fn, cfg, *,
              precision: Precision | None = None, refill=None, dist: Dist = SINGLE):
    """Collect groups, whiten within groups, and run mu updates (docs/math.md, "The algorithm"):
    (metrics row, rollout); the rollout's extra["answers"] holds its groups' answers.

    The behaviour policy, when there is one, samples, and its log-probabilities, recomputed here in
    the training precision, are the denominator of every ratio. On-policy they come from
    pi_theta_old, computed once per batch when mu > 1.
    """
    precision = precision or Precision("fp32")
    policy = policies.policy
    device = next(policy.parameters()).device
    t0 = clock(device)
    sampler_model = policies.behaviour if policies.behaviour is not None else policy
    roll, answers, sampled = collect(generator, sampler_model, batch, reward_fn, cfg, refill)
    t_gen = clock(device)

    algo, mb, temp = cfg.algo, cfg.trainer.micro_batch_size, cfg.sampler.temperature
    roll.advantages = group_advantages(roll.rewards, scale=algo.scale, std=algo.std, eps=algo.eps).flatten().to(
        roll.input_ids.device
    )
    # Only the log-probabilities this config needs: none when beta = 0 and mu = 1.
    if policies.behaviour is not None:
        roll.old_logp = score(policies.behaviour, roll, temp, mb, precision)
    elif algo.num_iterations > 1:
        roll.old_logp = score(policy, roll, temp, mb, precision)
    if policies.has_reference:
        with (policies.reference_scope() if policies.reference_scope else nullcontext(policies.reference)) as ref:
            roll.ref_logp = score(ref, roll, temp, mb, precision)
    t_score = clock(device)

    passes = [optimise(policy, optimizer, roll, cfg, precision, first_pass=i == 0, dist=dist)
              for i in range(algo.num_iterations)]
    stats = {**passes[0], **passes[-1], "skipped": sum(p["skipped"] for p in passes)}  # entropy from the first pass
    generator.update(policy)
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
