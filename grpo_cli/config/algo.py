"""The `algo` group: the objective (docs/math.md): clipping, KL, aggregation, advantages, who samples."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from grpo_cli.config.declare import Settings, rule, setting
from grpo_cli.registry import load


@dataclass
class AlgoConfig(Settings):
    name: str = setting("grpo", "preset label")
    clip_eps: float = setting(
        0.2,
        'epsilon of the clipped surrogate (docs/math.md, "The clipped surrogate")',
        low=0,
        above=True,
        high=1,
        below=True,
    )
    clip_eps_high: Optional[float] = setting(
        None, "upper clip (DAPO's clip-higher); null = clip_eps", low=0, above=True
    )
    loss: str = setting(
        "clip", 'per-token policy loss (docs/math.md, "Policy losses")', choices="grpo_cli.algo.losses:POLICY_LOSSES"
    )
    loss_args: Dict[str, Any] = setting(
        factory=dict, help="the loss's own settings (cispo: ratio_max; sapo: tau_pos, tau_neg); presets set them"
    )
    clip_ratio_c: Optional[float] = setting(
        None, "dual-clip (loss=clip): for A < 0 cap the loss at -c A, c > 1 (verl's 3.0); null = off", low=1, above=True
    )
    entropy_coef: float = setting(0.0, "entropy bonus: loss - coef * token-mean entropy of the policy (0 = off)", low=0)
    beta: float = setting(0.04, "KL weight to the reference policy (0 = no reference model loaded)", low=0)
    kl_estimator: str = setting(
        "k3", 'k1 | k2 | k3 (docs/math.md, "KL to the reference")', choices="grpo_cli.algo.losses:KL_ESTIMATORS"
    )
    kl_ratio: bool = setting(
        False, 'each token\'s KL times its ratio pi_theta / pi_old, with gradient (docs/math.md, "KL to the reference")'
    )
    num_iterations: int = setting(1, "mu: optimisation passes over each rollout batch", low=1)
    aggregation: str = setting(
        "seq_mean_token_mean",
        'how token losses add up (docs/math.md, "Aggregation")',
        choices="grpo_cli.algo.losses:AGGREGATIONS",
    )
    ratio_level: str = setting(
        "token",
        "token | sequence (one ratio per completion) | sequence_mean (GSPO)",
        choices="grpo_cli.algo.losses:RATIO_LEVELS",
    )
    advantage: str = setting(
        "grpo",
        "advantage estimator: grpo (group-whitened) | rloo (leave-one-out)",
        choices="grpo_cli.algo.advantages:ADVANTAGES",
    )
    scale: str = setting(
        "group", "advantage scale: group | batch | none (Dr. GRPO)", choices="grpo_cli.algo.losses:SCALES"
    )
    std: str = setting(
        "population", "population (divide by G) | sample (G - 1)", choices="grpo_cli.algo.losses:STD_KINDS"
    )
    eps: float = setting(1e-6, "epsilon inside sigma = sqrt(var + eps^2)", low=0)
    behaviour: str = setting(
        "current",
        'who samples (docs/math.md, "Policies"): current (on-policy) | frozen | lagged',
        choices=("current", "frozen", "lagged"),
    )
    behaviour_path: Optional[str] = setting(None, "frozen: model/checkpoint to sample from; null = the initial model")
    behaviour_refresh: int = setting(0, "lagged: copy the policy into the behaviour every N steps", low=0)
    ref_refresh: int = setting(0, "copy the policy into the reference every N steps (0 = never)", low=0)
    mask_truncated: bool = setting(False, "completions that hit max_new_tokens without EOS do not contribute")
    dynamic_sampling: bool = setting(False, "DAPO: drop groups whose rewards are all equal and refill the batch")
    max_refill_rounds: int = setting(
        4, "dynamic sampling: extra sampling rounds before training on what is there", low=0
    )
    sampler_correction: str = setting(
        "none",
        "tis: weight each token by min(pi_trainer / pi_sampler, cap) where the sampler is not the trainer's numerics",
        choices=("none", "tis"),
    )
    sampler_correction_cap: float = setting(2.0, "tis: the cap C of that truncated importance weight", low=1)


@rule("algo.loss", "algo.loss_args", "algo.clip_ratio_c")
def _loss_settings(p, c) -> None:
    a = c.algo
    spec = load("grpo_cli.algo.losses:POLICY_LOSSES").get(a.loss)
    for key, value in dict(a.loss_args or {}).items():
        if spec is not None and key not in spec.defaults:
            known = ", ".join(spec.defaults) or "none"
            p.append(f"algo.loss_args.{key} is not a setting of algo.loss={a.loss} (its settings: {known})")
        else:
            p.need(
                isinstance(value, (int, float)) and value == value and 0 < value < float("inf"),
                f"algo.loss_args.{key}={value} must be > 0",
            )
    if a.clip_ratio_c is not None:
        p.need(
            a.loss == "clip",
            f"algo.clip_ratio_c (dual-clip) bounds the clipped surrogate; it is not used by "
            f"algo.loss={a.loss}: set algo.clip_ratio_c=null or algo.loss=clip",
        )


@rule("algo.behaviour", "algo.behaviour_refresh", "algo.behaviour_path")
def _behaviour(p, c) -> None:
    a = c.algo
    p.need(
        a.behaviour != "lagged" or a.behaviour_refresh >= 1,
        "algo.behaviour=lagged needs algo.behaviour_refresh >= 1 (steps between copies)",
    )
    p.need(
        not a.behaviour_path or a.behaviour == "frozen", "algo.behaviour_path is only used with algo.behaviour=frozen"
    )


@rule("algo.ref_refresh", "model.lora.r")
def _reference_copies(p, c) -> None:
    p.need(
        not (c.model.lora.r and c.algo.ref_refresh),
        "algo.ref_refresh copies the policy into a second model, which a LoRA run does not keep (its reference is "
        "the base with the adapter off); set algo.ref_refresh=0 or train without model.lora",
    )


@rule("algo.std", "algo.scale", "sampler.group_size")
def _sample_std(p, c) -> None:
    a = c.algo
    p.need(
        not (a.std == "sample" and a.scale != "none" and c.sampler.group_size < 2),
        "algo.std=sample needs sampler.group_size >= 2",
    )
