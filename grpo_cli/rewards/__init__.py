"""Rewards: each a function (prompts, completions, answers) -> one float per completion."""

from __future__ import annotations

import math
from typing import Callable, Sequence

from grpo_cli.errors import GrpoError
from grpo_cli.rewards.exact_match import exact_match_reward

RewardFn = Callable[[Sequence[str], Sequence[str], Sequence[str]], list[float]]


def build_reward(cfg) -> RewardFn:
    """The reward named by the reward group, wrapped so a bad value is a clear error, not a NaN loss."""
    if cfg.name == "exact_match":
        fn = exact_match_reward(cfg.extract, cfg.pattern)
    else:
        raise GrpoError(f"Unknown reward.name={cfg.name!r}; choose reward=exact_match.")
    return checked(cfg.name, fn)


def checked(name: str, fn: RewardFn) -> RewardFn:
    def call(prompts, completions, answers):
        try:
            values = list(fn(prompts, completions, answers))
        except GrpoError:
            raise
        except Exception as e:  # the user's reward code failed: name it, keep the run's checkpoints
            raise GrpoError(f"Reward {name!r} raised {type(e).__name__}: {e}; fix the reward function.") from e
        if len(values) != len(completions):
            raise GrpoError(
                f"Reward {name!r} returned {len(values)} values for {len(completions)} completions; "
                "it must return one float per completion."
            )
        for i, v in enumerate(values):
            if not isinstance(v, (int, float)) or not math.isfinite(v):
                raise GrpoError(
                    f"Reward {name!r} returned {v!r} for completion {i} ({completions[i]!r}); "
                    "rewards must be finite floats."
                )
        return [float(v) for v in values]

    return call
