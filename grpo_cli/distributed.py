"""Who runs where, in one place: the loop asks this module for global sums and metric reductions and
never looks at ranks itself. One process is the world of size one, where every operation is the
identity."""

from __future__ import annotations

from contextlib import nullcontext

import torch


class Dist:
    """A single process: rank 0 of a world of one."""

    rank = 0
    local_rank = 0
    world_size = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over ranks."""
        return t

    def no_sync(self, model, last: bool):
        """A context in which a backward does not all-reduce gradients (every micro-batch but the last)."""
        return nullcontext()

    def reduce_metrics(self, sums: torch.Tensor, mins: torch.Tensor, maxs: torch.Tensor) -> dict[str, list[float]]:
        """Sums summed, minima and maxima taken over ranks, read to the host in one sync."""
        values = torch.cat([sums.float(), mins.float(), maxs.float()]).tolist()
        a, b = len(sums), len(sums) + len(mins)
        return {"sums": values[:a], "mins": values[a:b], "maxs": values[b:]}


SINGLE = Dist()

