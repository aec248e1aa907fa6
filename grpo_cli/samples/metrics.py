"""A step's metrics as device tensors, reduced over ranks and read to the host once.

Each metric is declared by how it combines across micro-batches and ranks: a mean (a sum and a count,
so a mean of means is never taken), a sum, a minimum or a maximum. `reduce` packs all of them into one
vector, exchanges it in a single collective (one host sync on one process), and returns floats.
"""

from __future__ import annotations

import time

import torch
from torch import Tensor

PHASES = ("grpo/generation", "grpo/scoring", "grpo/update")  # the step's phases, as timed (gen_s, score_s, update_s)


def clock(device: torch.device) -> float:
    """Wall time after the device's queued work: without the sync, CUDA phases bill each other."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter()


class StepMetrics:
    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self._means: dict[str, list[Tensor]] = {}  # name -> [sum, count]
        self._sums: dict[str, Tensor] = {}
        self._mins: dict[str, Tensor] = {}
        self._maxs: dict[str, Tensor] = {}

    def _t(self, value) -> Tensor:
        return torch.as_tensor(value, dtype=torch.float64, device=self.device).detach().reshape(())

    def mean(self, name: str, total, count) -> None:
        """Add `total` (a sum of values) over `count` items to the mean `name`."""
        s = self._means.setdefault(name, [self._t(0.0), self._t(0.0)])
        s[0] = s[0] + self._t(total)
        s[1] = s[1] + self._t(count)

    def sum(self, name: str, value) -> None:
        self._sums[name] = self._sums.get(name, self._t(0.0)) + self._t(value)

    def min(self, name: str, value) -> None:
        v = self._t(value)
        self._mins[name] = torch.minimum(self._mins[name], v) if name in self._mins else v

    def max(self, name: str, value) -> None:
        v = self._t(value)
        self._maxs[name] = torch.maximum(self._maxs[name], v) if name in self._maxs else v

    def state_dict(self) -> dict:
        """The metrics so far as CPU tensors, to cross a process or enter a checkpoint."""

        def cpu(d: dict) -> dict:
            return {k: [x.cpu() for x in v] if isinstance(v, list) else v.cpu() for k, v in d.items()}

        return {"means": cpu(self._means), "sums": cpu(self._sums), "mins": cpu(self._mins), "maxs": cpu(self._maxs)}

    @classmethod
    def from_state(cls, state: dict, device) -> "StepMetrics":
        out = cls(device)

        def to(d: dict) -> dict:
            return {k: [x.to(out.device) for x in v] if isinstance(v, list) else v.to(out.device) for k, v in d.items()}

        out._means, out._sums, out._mins, out._maxs = (to(state[k]) for k in ("means", "sums", "mins", "maxs"))
        return out

    def reduce(self, dist) -> dict[str, float]:
        """Every metric over all ranks: means as (sum of totals) / (sum of counts), 0 when nothing was
        counted; in one collective."""
        means = list(self._means)
        sums = [self._means[k][0] for k in means] + [self._means[k][1] for k in means] + list(self._sums.values())
        out = dist.reduce_metrics(
            sums=torch.stack(sums) if sums else self._t(0.0)[None][:0],
            mins=torch.stack(list(self._mins.values())) if self._mins else self._t(0.0)[None][:0],
            maxs=torch.stack(list(self._maxs.values())) if self._maxs else self._t(0.0)[None][:0],
        )
        n = len(means)
        totals, counts, plain = out["sums"][:n], out["sums"][n : 2 * n], out["sums"][2 * n :]
        result = {k: (t / c if c else 0.0) for k, t, c in zip(means, totals, counts)}
        result.update(zip(self._sums, plain))
        result.update(zip(self._mins, out["mins"]))
        result.update(zip(self._maxs, out["maxs"]))
        return result
