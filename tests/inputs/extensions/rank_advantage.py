"""An advantage estimator of one's own: each completion's rank within its group, centred, in [-1, 1] (ties
share their mean rank; a completion with no score, and a group without two scores, get 0)."""

import torch

from grpo_cli.algo.advantages import register_advantage

SEEN: list[tuple[int, int]] = []  # the [n, G] shapes it was asked for


@register_advantage("rank")
def ranked(rewards: torch.Tensor, algo, all_sum=None) -> torch.Tensor:
    SEEN.append(tuple(rewards.shape))
    out = torch.zeros(rewards.shape, dtype=torch.float64)
    for g, row in enumerate(rewards.double()):
        scored = ~row.isnan()
        k = int(scored.sum())
        if k < 2:
            continue
        values = row[scored]
        below = (values[:, None] > values[None, :]).sum(1).double()
        ties = (values[:, None] == values[None, :]).sum(1).double()
        rank = below + (ties - 1) / 2  # 0 .. k - 1
        out[g, scored] = 2 * rank / (k - 1) - 1
    return out
