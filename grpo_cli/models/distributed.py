"""Who runs where, in one place: the loop asks this module for global sums, metric reductions and the
models to run, and never looks at ranks itself.

One process is a world of size one, where every operation is the identity (`SINGLE`). Under
`torchrun`, torchrun.py joins the process group and returns a `TorchDist` with the same methods; it
is imported only then.
"""

from __future__ import annotations

import os
from contextlib import contextmanager, nullcontext

import torch


class Dist:
    """A single process: rank 0 of a world of one."""

    rank = 0
    local_rank = 0
    world_size = 1
    local_world_size = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def all_sum(self, t: torch.Tensor) -> torch.Tensor:
        """`t` summed over ranks."""
        return t

    def all_max(self, value: float) -> float:
        """The largest of each rank's `value`."""
        return value

    def no_sync(self, model, last: bool):
        """A context in which a backward does not all-reduce gradients (every micro-batch but the last)."""
        return nullcontext()

    def reduce_metrics(self, sums: torch.Tensor, mins: torch.Tensor, maxs: torch.Tensor) -> dict[str, list[float]]:
        """Sums summed, minima and maxima taken over ranks, read to the host in one sync."""
        values = torch.cat([sums.double(), mins.double(), maxs.double()]).tolist()
        a, b = len(sums), len(sums) + len(mins)
        return {"sums": values[:a], "mins": values[a:b], "maxs": values[b:]}

    def gather_objects(self, obj) -> list:
        """Every rank's `obj`, in rank order."""
        return [obj]

    def broadcast_object(self, obj):
        """Rank 0's `obj` on every rank."""
        return obj

    def barrier(self) -> None:
        """Wait until every rank reaches this point."""

    def wrap(self, model: torch.nn.Module, strategy: str) -> torch.nn.Module:
        """The model as this strategy trains it."""
        return model

    @contextmanager
    def full_model(self, model):
        """The model with all of its parameters at hand on this rank, unwrapped: for generation, where
        ranks decode different numbers of tokens and so must run no collectives."""
        yield unwrap(model)

    def close(self) -> None:
        """Leave the process group."""


SINGLE = Dist()


def unwrap(model):
    """The module inside a DDP wrapper (FSDP2 wraps in place, PEFT's wrapper is the model)."""
    return getattr(model, "module", model) if type(model).__name__ == "DistributedDataParallel" else model


def launched() -> bool:
    """Whether this process was started by torchrun (or another launcher setting its variables)."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def is_sharded(model) -> bool:
    """Whether FSDP2's `fully_shard` sharded this module: the one test of "is this FSDP?" (its parameters
    are then DTensor shards, and a full view needs a gather)."""
    return hasattr(model, "unshard") and hasattr(model, "reshard") and hasattr(model, "set_requires_gradient_sync")
