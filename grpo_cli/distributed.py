"""Who runs where, in one place: the loop asks this module for global sums and metric reductions and
never looks at ranks itself. One process is the world of size one, where every operation is the
identity."""

from __future__ import annotations

import os
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


def set_threads(threads: int, local_processes: int = 1) -> int:
    """torch's CPU threads: `threads` when > 0; else OMP_NUM_THREADS when set (torch already obeys it);
    else the cores this process may use, shared among the processes on this machine, so N ranks on
    one node do not each start a thread per core."""
    if threads > 0:
        torch.set_num_threads(threads)
    elif not os.environ.get("OMP_NUM_THREADS"):
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
        torch.set_num_threads(max(1, cores // max(local_processes, 1)))
    return torch.get_num_threads()
