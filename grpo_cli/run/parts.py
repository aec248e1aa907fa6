"""The run's stateful parts as a checkpoint keeps them: each saves and loads itself through `state_dict()` and
`load_state_dict()` (state.Run.parts names them): the RNGs of every library that draws, a part kept per rank,
and the optimizer (under FSDP its shards, written beside the model by checkpoint.py)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Protocol

import numpy as np
import torch

from grpo_cli.models.distributed import Dist, is_sharded
from grpo_cli.run.checkpoint import load_sharded

# --- RNG states as tensors and plain types --------------------------------------------------------


def rng_state() -> dict:
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state = {
        "python": random.getstate(),
        "torch": torch.get_rng_state(),
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(np.asarray(keys).astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(_as_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state(
        (n["kind"], n["keys"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["cached_gaussian"])
    )
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(x):
    """random.setstate wants tuples; a state that went through a serialiser may hold lists."""
    return tuple(_as_tuples(v) for v in x) if isinstance(x, (list, tuple)) else x


# --- the parts of a trainer state -------------------------------------------------------------------


class Stateful(Protocol):
    """A stateful part of a run: what it saves, and how it takes that back (torch's own shape)."""

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...


class Rng:
    """This process's random generators: Python's, NumPy's, torch's (CPU and CUDA)."""

    def state_dict(self) -> dict:
        return rng_state()

    def load_state_dict(self, state: dict) -> None:
        set_rng_state(state)


class PerRank:
    """A part each rank holds its own of (its RNG, its rollouts sampled ahead): saved as every rank's, loaded
    as this rank's; a checkpoint of another world size gives each rank `fallback(every rank's)`."""

    def __init__(self, part: Stateful, dist: Dist, fallback):
        self.part, self.dist, self.fallback = part, dist, fallback

    def state_dict(self) -> dict:
        return {"per_rank": self.dist.gather_objects(self.part.state_dict())}

    def load_state_dict(self, state: dict) -> None:
        ranks = state["per_rank"]
        self.part.load_state_dict(ranks[self.dist.rank] if len(ranks) == self.dist.world_size else self.fallback(ranks))


class OptimizerState:
    """The optimizer's state; under FSDP it says only `sharded`, its shards being written beside the model
    (save_checkpoint) and read back from `checkpoint`, resharded to this world size (one process too)."""

    def __init__(self, optimizer, policy, checkpoint: Path | None):
        self.optimizer, self.policy, self.checkpoint = optimizer, policy, checkpoint

    def state_dict(self) -> dict:
        return {"sharded": True} if is_sharded(self.policy) else self.optimizer.state_dict()

    def load_state_dict(self, state: dict) -> None:
        if state.get("sharded"):
            assert self.checkpoint is not None, "a sharded optimizer state is read from its checkpoint"
            load_sharded(self.checkpoint, self.policy, self.optimizer)
        else:
            self.optimizer.load_state_dict(state)
