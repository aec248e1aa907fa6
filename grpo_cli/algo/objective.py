"""The GRPO objective as pure tensor functions: no model, no I/O, no config objects.

docs/math.md derives each function: group-relative advantages (DeepSeekMath), the clipped surrogate
with KL (PPO, DeepSeekMath), token / sequence / GSPO ratios, the k1/k2/k3 KL estimators (Schulman 2020)
and the aggregation choices (DeepSeekMath, DAPO, Dr. GRPO).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_cli.algo.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    RATIO_LEVELS,
    STD_KINDS,
    Normalisers,
    TokenTerms,
    loss_settings,
)
from grpo_cli.algo.losses import SCALES as ADVANTAGE_SCALES

__all__ = [
    "ADVANTAGE_SCALES",
    "AGGREGATIONS",
    "KL_ESTIMATORS",
    "LOG_RATIO_BOUND",
    "POLICY_LOSSES",
    "RATIO_LEVELS",
    "STD_KINDS",
    "flat_groups",
    "group_advantages",
    "policy_loss",
    "token_kl",
]

# A log-ratio is clamped to [-LOG_RATIO_BOUND, LOG_RATIO_BOUND] before exp (docs/math.md, "Numerics"):
# exp(20) ~ 4.9e8 is finite in float32, where a summed sequence log-ratio past ~88 nats overflows to inf.
# The clamp only bites on ratios no clipped update should ever see; it stops a NaN, it does not steer.
LOG_RATIO_BOUND = 20.0


def _check_choice(kind: str, value: str, allowed: tuple[str, ...]) -> None:
    if value not in allowed:
        raise ValueError(f"Unknown {kind} {value!r}; expected one of {', '.join(allowed)}.")


def _compute_dtype(t: Tensor) -> torch.dtype:
    # bf16/fp16 log-probs lose too much in exp() and in long sums; float64 is kept for tests.
    return torch.float64 if t.dtype == torch.float64 else torch.float32


def flat_groups(rewards: Tensor) -> Tensor:
    """[n] True for a group with no signal: fewer than two scores (NaN is no score), or all of them equal."""
    scored = ~torch.isnan(rewards)
    top = torch.where(scored, rewards, torch.full_like(rewards, -math.inf)).amax(dim=1)
    bottom = torch.where(scored, rewards, torch.full_like(rewards, math.inf)).amin(dim=1)
    return (top == bottom) | (scored.sum(dim=1) < 2)


def group_advantages(
    rewards: Tensor, *, scale: str = "group", std: str = "population", eps: float = 1e-6, all_sum=None
) -> Tensor:
    """Group-relative advantages A = (R - mean_group) / sigma (DeepSeekMath;
    docs/math.md, "Group-relative advantages").

    rewards: [n_prompts, group_size]. sigma = sqrt(var + eps**2), with var taken per
    group (``scale="group"``) or over the whole batch around the batch mean (``"batch"``); the
    mean subtracted is always the group's. ``scale="none"`` only centres (Dr. GRPO).
    ``std="population"`` divides the sum of squares by the count, ``"sample"`` by count - 1.
    ``all_sum`` sums a tensor over data-parallel ranks (default: none), so ``scale="batch"`` uses the
    statistics of the whole batch when each rank holds part of it. The result is detached: advantages
    are stop-gradient.

    A NaN reward is "no score" (a reward that returned None, or failed; TRL's convention): it is left
    out of every mean, sigma and count, and its advantage is 0. A group with fewer than two scores
    carries no signal and gets 0 throughout, as a group of equal rewards does.
    """
    _check_choice("advantage scale", scale, ADVANTAGE_SCALES)
    _check_choice("std kind", std, STD_KINDS)
    rewards = torch.as_tensor(rewards)
    if rewards.dim() != 2 or rewards.shape[1] == 0:
        raise ValueError(
            f"rewards must be a 2-D tensor [n_prompts, group_size] with group_size >= 1, "
            f"got shape {tuple(rewards.shape)}."
        )
    if eps < 0:
        raise ValueError(f"eps must be non-negative, got {eps}.")
    ddof = 1 if std == "sample" else 0
    if scale == "group" and rewards.shape[1] - ddof < 1:
        raise ValueError(
            f"std='sample' needs at least two rewards per group to estimate a spread, got {rewards.shape[1]}."
        )
    rewards = rewards.detach().to(_compute_dtype(rewards))  # [n, G]
    scored = ~torch.isnan(rewards)
    values = torch.where(scored, rewards, torch.zeros_like(rewards))  # no-score rewards add nothing to a sum
    count = scored.sum(dim=1, keepdim=True)  # [n, 1]
    # A float mean of identical values can miss them by an ulp, which sigma ~ eps would blow
    # up; a flat group (or one with under two scores) carries no signal: its advantages are exactly zero.
    flat = flat_groups(rewards)[:, None]  # [n, 1]
    centred = values - values.sum(dim=1, keepdim=True) / count.clamp(min=1)
    centred = torch.where(flat | ~scored, torch.zeros_like(centred), centred)
    if scale == "none":
        return centred

    if scale == "group":
        sum_sq = centred.pow(2).sum(dim=1, keepdim=True)  # [n, 1]
        sigma = torch.sqrt(sum_sq / (count - ddof).clamp(min=1) + eps**2)  # a group under two scores is flat
    else:
        all_sum = all_sum or (lambda t: t)
        total, n = all_sum(torch.stack([values.sum(), scored.sum().to(rewards.dtype)])).tolist()
        if n - ddof < 1:
            raise ValueError(f"std='sample' needs at least two rewards per batch to estimate a spread, got {n:g}.")
        sum_sq = all_sum(torch.where(scored, rewards - total / n, torch.zeros_like(rewards)).pow(2).sum())
        sigma = torch.sqrt(sum_sq / (n - ddof) + eps**2)
    # With eps = 0 a flat group would be 0 / 0.
    return torch.where(flat | ~scored, torch.zeros_like(centred), centred / sigma)


def token_kl(logp: Tensor, ref_logp: Tensor, estimator: str = "k3") -> Tensor:
    """Per-token estimate of KL(pi_theta || pi_ref) from tokens sampled from pi_theta.

    Elementwise. k1 = log(pi/pi_ref); k2 = 0.5 * log(pi/pi_ref)**2;
    k3 = pi_ref/pi - log(pi_ref/pi) - 1 (Schulman's k3, used by DeepSeekMath), which is unbiased and
    never negative; its log-ratio is clamped to +-LOG_RATIO_BOUND before exp.
    """
    _check_choice("KL estimator", estimator, KL_ESTIMATORS)
    log_ratio = logp - ref_logp  # log(pi / pi_ref)
    if estimator == "k1":
        return log_ratio
    if estimator == "k2":
        return 0.5 * log_ratio.pow(2)
    # expm1 keeps k3 >= 0 to the last bit: exp(-x) - 1 + x rounds to -1e-16 for tiny negative x. The
    # clamp keeps exp finite when the policy has drifted far from the reference on a token.
    log_ratio = log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.expm1(-log_ratio) + log_ratio


def sampler_correction_weight(old_logp: Tensor, sampler_logp: Tensor, cap: float) -> Tensor:
    """Truncated importance sampling (Yao et al. 2025, "Your efficient RL framework secretly brings you
    off-policy RL training"; docs/math.md, "Sampler mismatch"): the tokens came from the inference
    engine's pi_sampler, not from the trainer's pi_old, so each token's surrogate is weighted by
    min(pi_old / pi_sampler, C). Per token, a constant."""
    log_w = (old_logp.detach() - sampler_logp.detach()).clamp(max=math.log(cap))
    return torch.exp(log_w)


def segment_sum(values: Tensor, segments: Tensor, count: int) -> Tensor:
    """Each segment's sum of per-token `values`: [count] (differentiable)."""
    return values.new_zeros(count).index_add(0, segments, values)


def _ratios(log_ratio: Tensor, segments: Tensor, seq_tokens: Tensor, ratio_level: str) -> Tensor:
    """pi_theta / pi_old per token, or its sequence's (docs/math.md, "Sequence-level ratios") on each of its
    tokens, the log clamped to +-LOG_RATIO_BOUND before exp: [K]. `log_ratio` is 0 off the mask."""
    if ratio_level != "token":
        seq_log_ratio = segment_sum(log_ratio, segments, len(seq_tokens))  # [S], log of the sequence ratio
        if ratio_level == "sequence_mean":
            seq_log_ratio = seq_log_ratio / seq_tokens
        log_ratio = seq_log_ratio[segments]
    return torch.exp(log_ratio.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))


@dataclass(frozen=True)
class LossInputs:
    """What policy_loss reads: flat tokens, each with its sequence (`segments`), and the objective's settings
    (their meaning: policy_loss)."""

    logp: Tensor  # [K] pi_theta's log-prob of each token, with gradient
    old_logp: Tensor  # [K] pi_theta_old's (or the behaviour's), constant
    advantages: Tensor  # [K] each token's sequence's advantage, constant
    mask: Tensor  # [K] 1 on tokens that enter the loss (the model's own), 0 on the rest
    segments: Tensor  # [K] long: each token's sequence, in [0, num_segments)
    num_segments: int | None = None  # sequences the ids range over; default max(segments) + 1
    clip_eps: float = 0.2
    clip_eps_high: float | None = None
    beta: float = 0.0
    ref_logp: Tensor | None = None
    kl_estimator: str = "k3"
    kl_ratio: bool = False  # the KL term weighted by the (differentiable) ratio: TRL's use_bias_correction_kl
    aggregation: str = "seq_mean_token_mean"
    ratio_level: str = "token"
    max_completion_length: int | None = None
    num_sequences: float | None = None
    num_tokens: float | None = None
    sampler_weight: Tensor | None = None
    loss: str = "clip"
    loss_args: dict | None = None
    clip_ratio_c: float | None = None
    entropy: Tensor | None = None
    entropy_coef: float = 0.0


def _check_inputs(x: LossInputs) -> None:
    """policy_loss's arguments: shapes that match and settings it knows (programmer errors: the config's
    values were checked before anything loaded)."""
    _check_choice("aggregation", x.aggregation, tuple(AGGREGATIONS))
    _check_choice("policy loss", x.loss, tuple(POLICY_LOSSES))
    _check_choice("ratio level", x.ratio_level, RATIO_LEVELS)
    _check_choice("KL estimator", x.kl_estimator, KL_ESTIMATORS)
    if x.logp.dim() != 1:
        raise ValueError(f"logp must be 1-D [tokens], got shape {tuple(x.logp.shape)}.")
    named = {
        "old_logp": x.old_logp,
        "advantages": x.advantages,
        "mask": x.mask,
        "segments": x.segments,
        "ref_logp": x.ref_logp,
        "sampler_weight": x.sampler_weight,
        "entropy": x.entropy,
    }
    for name, t in named.items():
        if t is not None and t.shape != x.logp.shape:
            raise ValueError(f"{name} has shape {tuple(t.shape)} but logp has {tuple(x.logp.shape)}; they must match.")
    if x.beta != 0 and x.ref_logp is None:
        raise ValueError("beta != 0 needs ref_logp, the reference policy's log-probabilities.")
    if x.entropy_coef and x.entropy is None:
        raise ValueError("entropy_coef != 0 needs entropy, the policy's token entropies (with gradient).")
    if x.max_completion_length is not None and x.max_completion_length < 1:
        raise ValueError(f"max_completion_length must be >= 1, got {x.max_completion_length}.")
    if x.num_sequences is not None and x.num_sequences < 1:
        raise ValueError(f"num_sequences must be >= 1, got {x.num_sequences}.")


def policy_loss(x: LossInputs) -> tuple[Tensor, dict[str, Tensor]]:
    """The negated clipped GRPO surrogate (docs/math.md, "The clipped surrogate"), to minimise, on flat tokens.

    Per token: L = -min(r*A, clip(r, 1 - clip_eps, 1 + clip_eps_high) * A) + beta * KL, A its sequence's
    advantage and KL from `token_kl`. Tokens off the mask enter nothing; a sequence is its tokens' segment id, so
    sequence-level quantities are segment sums. ratio_level: "token" r_t = exp(logp_t - old_t) (DeepSeekMath,
    DAPO); "sequence" r = exp(sum of the sequence's log-ratios); "sequence_mean" r = exp(their mean) (GSPO).
    aggregation (losses.AGGREGATIONS): "seq_mean_token_mean" (DeepSeekMath), "token_mean" (DAPO),
    "seq_mean_token_sum", "constant_norm" over num_sequences * max_completion_length (Dr. GRPO; default the
    longest sequence). num_sequences, num_tokens: the whole step's counts when this call sees part of it, so the
    parts' losses add up to the full loss. sampler_weight: per-token constants on the surrogate only (TIS).
    loss, loss_args, clip_ratio_c: the per-token loss by name (losses.POLICY_LOSSES). entropy_coef: the loss less
    entropy_coef * (entropy summed over the mask / num_tokens). Every log-ratio is clamped before exp.

    Returns (loss, metrics): 0-d tensors, read once per step: kl, clip_frac_low/high, ratio_mean/min/max.
    """
    _check_inputs(x)
    clip_low = x.clip_eps
    clip_high = x.clip_eps if x.clip_eps_high is None else x.clip_eps_high
    dtype = _compute_dtype(x.logp)
    keep = x.mask.bool()  # [K]
    weight = keep.to(dtype)
    segments = x.segments.long()
    count = int(segments.max()) + 1 if x.num_segments is None and len(segments) else (x.num_segments or 0)
    # Tokens off the mask may hold anything (even -inf); zeroing them keeps exp() finite there, so no NaN can
    # reach the loss or, through 0 * inf, the gradient.
    logp = x.logp.to(dtype).masked_fill(~keep, 0.0)
    old_logp = x.old_logp.detach().to(dtype).masked_fill(~keep, 0.0)
    adv = x.advantages.detach().to(dtype)
    seq_tokens = segment_sum(weight, segments, count).clamp(min=1)  # [S]: an empty sequence divides 0 by one
    ratio = _ratios(logp - old_logp, segments, seq_tokens, x.ratio_level)  # [K]

    terms = TokenTerms(
        logp=logp,
        ratio=ratio,
        advantages=adv,
        clip_low=clip_low,
        clip_high=clip_high,
        clip_ratio_c=x.clip_ratio_c,
        args=loss_settings(x.loss, x.loss_args),
    )
    per_token, loss_metrics = POLICY_LOSSES[x.loss].fn(terms)
    if x.sampler_weight is not None:
        per_token = per_token * x.sampler_weight.detach().to(dtype).masked_fill(~keep, 0.0)
    kl = None
    if x.ref_logp is not None:
        kl = token_kl(logp, x.ref_logp.detach().to(dtype).masked_fill(~keep, 0.0), x.kl_estimator)
        if x.beta != 0:  # skipped at beta = 0 so an overflowing k3 cannot turn 0 * inf into NaN
            per_token = per_token + x.beta * (kl * ratio if x.kl_ratio else kl)

    seq_sums = segment_sum(per_token * weight, segments, count)  # [S]
    longest = x.max_completion_length or int(seq_tokens.max()) if count else 1
    normalisers = Normalisers(
        sequences=count if x.num_sequences is None else x.num_sequences,
        tokens=x.num_tokens,
        max_completion_length=longest,
    )
    total = AGGREGATIONS[x.aggregation](seq_sums, seq_tokens, weight, normalisers)
    if x.entropy_coef:
        assert x.entropy is not None, "an entropy bonus needs the entropy"
        token_count = weight.sum().clamp(min=1) if x.num_tokens is None else max(x.num_tokens, 1.0)
        total = total - x.entropy_coef * (x.entropy.to(dtype) * weight).sum() / token_count
    return total, _loss_metrics(ratio, keep, adv, kl, clip_low, clip_high, loss_metrics)


@torch.no_grad()
def _loss_metrics(
    ratio: Tensor, keep: Tensor, adv: Tensor, kl: Tensor | None, clip_low: float, clip_high: float, loss_metrics: dict
) -> dict:
    """policy_loss's metrics over completion tokens, as device tensors: the caller reads them once per
    step (one host sync)."""
    dtype = ratio.dtype
    weight = keep.to(dtype)
    n_tokens = weight.sum().clamp(min=1)

    def masked_mean(x: Tensor) -> Tensor:
        return (x.to(dtype) * weight).sum() / n_tokens

    # Min and max over completion tokens without boolean indexing (a data-dependent shape syncs).
    empty = ~keep.any()  # no completion tokens: report unchanged policies
    ratio_min = torch.where(keep, ratio, torch.inf).amin()
    ratio_max = torch.where(keep, ratio, -torch.inf).amax()
    one = ratio.new_ones(())
    metrics = {
        "kl": masked_mean(kl) if kl is not None else ratio.new_zeros(()),
        "clip_frac_low": masked_mean((ratio < 1 - clip_low) & (adv < 0)),
        "clip_frac_high": masked_mean((ratio > 1 + clip_high) & (adv > 0)),
        "ratio_mean": torch.where(empty, one, masked_mean(ratio)),
        "ratio_min": torch.where(empty, one, ratio_min),
        "ratio_max": torch.where(empty, one, ratio_max),
        **{k: masked_mean(v) for k, v in loss_metrics.items()},
    }
    return metrics
