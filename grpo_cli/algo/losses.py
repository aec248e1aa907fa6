"""Per-token policy losses and loss aggregations, each a small function found by name
(docs/math.md, "Policy losses" and "Aggregation"), as verl's `core_algos` picks them.

A new loss is one function registered here (or from any module, `register_loss`), its preset under
`conf/algo/` and a paragraph in docs/math.md; its own settings are declared with their defaults at
registration and read from `algo.loss_args`, so neither the schema nor the checks change.

This module imports no torch (the functions use tensor methods only), so the config's check reads the
registries before torch loads.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Mapping


@dataclass(frozen=True)
class TokenTerms:
    """What a policy loss sees, one value per token ([K]): constants except `logp`."""

    logp: Any  # log pi_theta of each completion token (with gradient); 0 off the mask
    ratio: Any  # pi_theta / pi_old at algo.ratio_level, its log clamped before exp (has gradient)
    advantages: Any  # each token's sequence's advantage
    clip_low: float  # algo.clip_eps
    clip_high: float  # algo.clip_eps_high, or clip_eps
    clip_ratio_c: float | None = None  # algo.clip_ratio_c: dual-clip's bound for A < 0 (None = off)
    args: Mapping[str, float] = field(default_factory=dict)  # the loss's own settings (algo.loss_args)


# A loss returns the per-token loss (negated objective, [K]) and its own metrics (boolean or float [K]
# tensors, averaged over the masked tokens and logged under their names).
PolicyLoss = Callable[[TokenTerms], "tuple[Any, dict[str, Any]]"]


@dataclass(frozen=True)
class LossSpec:
    name: str
    fn: PolicyLoss
    defaults: dict[str, float]  # the settings it reads from algo.loss_args, with their defaults
    metrics: tuple[str, ...] = ()  # the names of the extra metrics it returns


POLICY_LOSSES: dict[str, LossSpec] = {}
KL_ESTIMATORS = ("k1", "k2", "k3")  # objective.token_kl (Schulman's estimators)
RATIO_LEVELS = ("token", "sequence", "sequence_mean")  # objective._ratios (docs/math.md, "Sequence-level ratios")
SCALES = ("group", "batch", "none")  # algo.scale: objective.group_advantages
STD_KINDS = ("population", "sample")  # algo.std


def register_loss(name: str, *, metrics: tuple[str, ...] = (), **defaults: float):
    """Register `fn(terms: TokenTerms) -> (per_token_loss, metrics)` as `algo.loss=name`; each keyword is
    a setting of its own (`algo.loss_args.KEY`) with its default."""

    def add(fn: PolicyLoss) -> PolicyLoss:
        POLICY_LOSSES[name] = LossSpec(name, fn, dict(defaults), tuple(metrics))
        return fn

    return add


def loss_settings(name: str, given: Mapping[str, Any] | None) -> dict[str, float]:
    """The loss's settings: its defaults, overridden by `given` (keys already checked)."""
    return {**POLICY_LOSSES[name].defaults, **dict(given or {})}


@register_loss("clip", metrics=("dual_clip_frac",))
def clipped_surrogate(t: TokenTerms):
    """PPO's clipped surrogate (DeepSeekMath, DAPO's clip-higher): -min(r A, clip(r, 1-eps_low, 1+eps_high) A).
    With `clip_ratio_c` = c, dual-clip (Ye et al. 2020, as verl): for A < 0 the loss is also capped at
    -c A, so a ratio far above 1 cannot push an unlikely token down without bound."""
    adv, ratio = t.advantages, t.ratio
    per_token = -(ratio * adv).minimum(ratio.clamp(1 - t.clip_low, 1 + t.clip_high) * adv)
    metrics = {}
    if t.clip_ratio_c is not None:
        capped = per_token.minimum(-t.clip_ratio_c * adv)
        negative = adv < 0
        metrics["dual_clip_frac"] = negative & (per_token > -t.clip_ratio_c * adv)
        per_token = capped.where(negative, per_token)
    return per_token, metrics


@register_loss("cispo", metrics=("cispo_capped_frac",), ratio_max=5.0)
def cispo(t: TokenTerms):
    """CISPO (MiniMax-M1, 2025): REINFORCE with a clipped, stop-gradient importance weight,
    -sg(min(r, ratio_max)) A log pi. Unlike the clipped surrogate no token's gradient is dropped; only
    its weight is bounded. `ratio_max` is the absolute bound on r (ScaleRL's eps_max; TRL's
    `epsilon_high` under loss_type="cispo"; 5.0 recommended there)."""
    cap = t.args["ratio_max"]
    weight = t.ratio.clamp(max=cap).detach()
    return -weight * t.advantages * t.logp, {"cispo_capped_frac": t.ratio > cap}


@register_loss("sapo", tau_pos=1.0, tau_neg=1.05)
def sapo(t: TokenTerms):
    """SAPO (Gao et al. 2025, "Soft Adaptive Policy Optimization"): the hard clip replaced by a smooth
    gate, -(4 / tau) sigmoid(tau (r - 1)) A, tau = tau_pos where A > 0 else tau_neg. Its gradient is
    4 s (1 - s) A grad r (s the sigmoid): exactly the surrogate's at r = 1, fading smoothly as r leaves
    1, faster for negative advantages (tau_neg > tau_pos)."""
    adv = t.advantages
    tau = adv.new_full(adv.shape, t.args["tau_pos"]).where(adv > 0, adv.new_full(adv.shape, t.args["tau_neg"]))
    gate = (tau * (t.ratio - 1)).sigmoid() * 4 / tau
    return -gate * t.advantages, {}


@dataclass(frozen=True)
class Normalisers:
    """The whole step's counts (summed over micro-batches and ranks), for a part of it."""

    sequences: float  # B
    tokens: float | None  # completion tokens; None = this part's own
    max_completion_length: int  # L of constant_norm


Aggregation = Callable[[Any, Any, Any, Normalisers], Any]  # (seq_sums [S], seq_tokens [S], weight [K], n)
AGGREGATIONS: dict[str, Aggregation] = {}


def register_aggregation(name: str):
    """Register `fn(seq_sums, seq_tokens, weight, normalisers) -> loss` as `algo.aggregation=name`."""

    def add(fn: Aggregation) -> Aggregation:
        AGGREGATIONS[name] = fn
        return fn

    return add


@register_aggregation("seq_mean_token_mean")
def seq_mean_token_mean(seq_sums, seq_tokens, weight, n: Normalisers):
    """Mean over sequences of each one's token mean (DeepSeekMath)."""
    return (seq_sums / seq_tokens).sum() / n.sequences


@register_aggregation("token_mean")
def token_mean(seq_sums, seq_tokens, weight, n: Normalisers):
    """Mean over every completion token of the step (DAPO)."""
    return seq_sums.sum() / (weight.sum().clamp(min=1) if n.tokens is None else max(n.tokens, 1.0))


@register_aggregation("seq_mean_token_sum")
def seq_mean_token_sum(seq_sums, seq_tokens, weight, n: Normalisers):
    """Mean over sequences of each one's token sum: the exact sequence-level gradient."""
    return seq_sums.sum() / n.sequences


@register_aggregation("constant_norm")
def constant_norm(seq_sums, seq_tokens, weight, n: Normalisers):
    """Token sum over B * L, L fixed (Dr. GRPO): the step's scale does not follow its lengths."""
    return seq_sums.sum() / (n.sequences * n.max_completion_length)
