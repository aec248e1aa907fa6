"""Advantage estimators by name (`algo.advantage`; docs/math.md, "Group-relative advantages"), each a
small function found by name, as the policy losses are (losses.py). An estimator maps a batch's
rewards [n_prompts, group_size] (NaN = no score) to one advantage per completion, stop-gradient, with
a no-score completion and a group without signal (flat, or under two scores) at exactly 0:

- `grpo`: the group-whitened (R - mean) / sigma of DeepSeekMath, with `algo.scale`, `algo.std` and
  `algo.eps` (objective.group_advantages);
- `rloo`: the leave-one-out baseline R_i - mean_{j != i} R_j over the group's scores (Kool et al.
  2019; Ahmadian et al. 2024), which is k / (k - 1) * (R_i - mean) for k scores; no scaling.

A new estimator is one function registered here (or from any module, `register_advantage`) and its
test. This module imports no torch, so the config's check reads the names before torch loads.
"""

from __future__ import annotations

from typing import Callable

# name -> fn(rewards [n, G], algo settings, all_sum) -> advantages [n, G]
ADVANTAGES: dict[str, Callable] = {}


def register_advantage(name: str):
    """`algo.advantage=name` computes advantages with the decorated function."""

    def add(fn: Callable) -> Callable:
        ADVANTAGES[name] = fn
        return fn

    return add


@register_advantage("grpo")
def whitened(rewards, algo, all_sum=None):
    from grpo_cli.algo.objective import group_advantages

    return group_advantages(rewards, scale=algo.scale, std=algo.std, eps=algo.eps, all_sum=all_sum)


@register_advantage("rloo")
def leave_one_out(rewards, algo, all_sum=None):
    from grpo_cli.algo.objective import group_advantages

    centred = group_advantages(rewards, scale="none")  # R - mean over the scores; 0 where no signal
    k = (rewards == rewards).sum(dim=1, keepdim=True)  # scores per group (NaN != NaN)
    return centred * k / (k - 1).clamp(min=1)
