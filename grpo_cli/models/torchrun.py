"""A rank of a torch.distributed process group, imported only under torchrun.

`from_environment` reads torchrun's variables (RANK, WORLD_SIZE, LOCAL_RANK, MASTER_*), joins the
process group (gloo on CPU, nccl on CUDA, one device per local rank) and returns a `TorchDist`.
`trainer.strategy` then wraps the policy: `ddp` (DistributedDataParallel, gradients all-reduced) or
`fsdp` (FSDP2 `fully_shard` per decoder layer and the root; parameters, gradients and optimizer state
sharded).
"""

from __future__ import annotations

import datetime
import os
from contextlib import contextmanager, nullcontext

import torch

from grpo_cli.errors import GrpoError
from grpo_cli.models.distributed import SINGLE, Dist, is_sharded, launched, unwrap


class TorchDist(Dist):
    """A rank of a torch.distributed process group."""

    def __init__(self):
        import torch.distributed as dist

        self._dist = dist
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.local_rank = int(os.environ.get("LOCAL_RANK", 0))
        self.local_world_size = int(os.environ.get("LOCAL_WORLD_SIZE", self.world_size))
        self.device = torch.device("cuda", self.local_rank) if dist.get_backend() == "nccl" else torch.device("cpu")

    def all_sum(self, t):
        t = t.detach().clone().to(self.device)
        self._dist.all_reduce(t)
        return t

    def all_max(self, value: float) -> float:
        t = torch.tensor([float(value)], device=self.device)
        self._dist.all_reduce(t, op=self._dist.ReduceOp.MAX)
        return float(t)

    def no_sync(self, model, last: bool):
        if last:
            return nullcontext()
        if hasattr(model, "no_sync"):  # DDP
            return model.no_sync()
        if is_sharded(model):  # FSDP2: no reduce-scatter until the last micro-batch
            return _fsdp_no_sync(model)
        return nullcontext()

    def reduce_metrics(self, sums, mins, maxs):
        packed = torch.cat([sums.double(), mins.double(), maxs.double()]).to(self.device)
        gathered = [torch.empty_like(packed) for _ in range(self.world_size)]
        self._dist.all_gather(gathered, packed)  # the step's one collective for its metrics
        every = torch.stack(gathered)  # [world, n]
        a, b = len(sums), len(sums) + len(mins)
        return {
            "sums": every[:, :a].sum(0).tolist(),
            "mins": every[:, a:b].amin(0).tolist(),
            "maxs": every[:, b:].amax(0).tolist(),
        }

    def gather_objects(self, obj) -> list:
        out = [None] * self.world_size
        self._dist.all_gather_object(out, obj)
        return out

    def broadcast_object(self, obj):
        box = [obj]
        self._dist.broadcast_object_list(box, src=0)
        return box[0]

    def barrier(self) -> None:
        self._dist.barrier()

    def wrap(self, model: torch.nn.Module, strategy: str) -> torch.nn.Module:
        if strategy == "ddp":
            from torch.nn.parallel import DistributedDataParallel

            ids = [self.local_rank] if self.device.type == "cuda" else None
            return DistributedDataParallel(model, device_ids=ids)
        if strategy == "fsdp":
            shard(model)
            return model
        return model

    @contextmanager
    def full_model(self, model):
        if not is_sharded(model):  # DDP or plain: every rank holds every parameter
            yield unwrap(model)
            return
        # FSDP2: gather the parameters once and keep them until the rollout ends, so no forward issues a
        # collective (ranks stop decoding at different tokens).
        modules = [m for m in model.modules() if hasattr(m, "set_reshard_after_forward")]
        for m in modules:
            m.set_reshard_after_forward(False, recurse=False)
        model.unshard()
        try:
            yield model
        finally:
            for m in modules:
                m.set_reshard_after_forward(True, recurse=False)
            model.reshard()

    def close(self) -> None:
        if self._dist.is_initialized():
            self._dist.destroy_process_group()


@contextmanager
def _fsdp_no_sync(model):
    model.set_requires_gradient_sync(False)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def decoder_layers(model) -> list[torch.nn.Module]:
    """The model's repeated blocks, by the class names transformers keeps in `_no_split_modules`."""
    names = set(getattr(model, "_no_split_modules", None) or [])
    inner = getattr(model, "get_base_model", lambda: model)()
    names |= set(getattr(inner, "_no_split_modules", None) or [])
    return [m for m in model.modules() if type(m).__name__ in names]


def shard(model) -> None:
    """FSDP2: one unit per decoder layer, then the root (embeddings, final norm, head: tied weights stay
    together in it)."""
    from torch.distributed.fsdp import fully_shard

    layers = decoder_layers(model)
    if not layers:
        raise GrpoError(
            f"trainer.strategy=fsdp found no decoder layers in {type(model).__name__} (its "
            "_no_split_modules is empty); use trainer.strategy=ddp."
        )
    for layer in layers:
        fully_shard(layer)
    fully_shard(model)


def from_environment(timeout_s: float | None = None) -> Dist:
    """The process group torchrun describes, joined; SINGLE when this process was not launched by it."""
    if not launched():
        return SINGLE
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s or float(os.environ.get("GRPO_DIST_TIMEOUT", 600)))
    if torch.cuda.is_available():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
        dist.init_process_group(
            "nccl", timeout=timeout, device_id=torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0)))
        )
    else:
        dist.init_process_group("gloo", timeout=timeout)
    return TorchDist()


def peer_failure(e: BaseException) -> bool:
    """Whether a collective failed because another rank went away (a closed connection, a timeout)."""
    import torch.distributed as dist

    if isinstance(e, getattr(dist, "DistError", ())):
        return True
    text = str(e).lower()
    return isinstance(e, RuntimeError) and any(w in text for w in ("gloo", "nccl", "connection", "timed out", "peer"))
