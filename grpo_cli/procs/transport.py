"""How weights travel from the trainer to a sampling process (docs/math.md, "Stale sampling"): a
`WeightTransport` sends a list of tensors from the trainer and receives them, in the same order, into
the sampler's parameters. Versioning is the rollout source's (ahead.WorkerSource), not the transport's.

`GlooTransport` is the CPU path: a two-process gloo group of its own on a TCP store the trainer opens,
so it never touches a torchrun job's group, and the same code reaches another node (the store's address
is the one change). Small tensors go in buckets: consecutive ones of one dtype are flattened into
buffers of at most `bucket_mb` (1 MiB), one broadcast each; a tensor of that size or more goes alone,
in place on both sides (larger buckets cost more in copies than they save in messages: docs/benchmarks.md,
"Figures behind the code"). On CUDA the tensors are staged through host memory. A transport for NCCL or CUDA IPC, or for
an adapter alone, is one more class with these three methods.
"""

from __future__ import annotations

import datetime
from typing import Any, Protocol

import torch
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

START_TIMEOUT_S = 900.0  # the sampler imports torch and loads a model copy before it joins


class WeightTransport(Protocol):
    address: object  # what the other end needs to connect (picklable)

    def send(self, tensors: list[torch.Tensor]) -> None: ...

    def receive(self, params: list[torch.Tensor], layout: list[tuple[tuple, torch.dtype]]) -> None: ...

    def close(self) -> None: ...


def buckets(layout: list[tuple[tuple, torch.dtype]], bucket_mb: float) -> list[list[int]]:
    """The tensors' indices grouped into buckets: consecutive tensors of one dtype, each bucket at most
    `bucket_mb` MiB (a larger tensor goes alone)."""
    out: list[list[int]] = []
    size, limit = 0, bucket_mb * 2**20
    for i, (shape, dtype) in enumerate(layout):
        nbytes = torch.Size(shape).numel() * torch.empty((), dtype=dtype).element_size()
        if not out or layout[out[-1][-1]][1] != dtype or size + nbytes > limit:
            out.append([])
            size = 0
        out[-1].append(i)
        size += nbytes
    return out


class GlooTransport:
    """Broadcasts over a two-process gloo group: rank 0 the trainer, rank 1 the sampler."""

    def __init__(self, timeout_s: float, *, address: tuple[str, int] | None = None, bucket_mb: float = 1.0):
        import torch.distributed as tdist

        self.timeout_s, self.bucket_mb, self.rank = timeout_s, bucket_mb, 0 if address is None else 1
        host, port = address or ("127.0.0.1", 0)
        self.store = tdist.TCPStore(
            host, port, 2, self.rank == 0, datetime.timedelta(seconds=START_TIMEOUT_S), wait_for_workers=False
        )
        self.address = (host, self.store.port)
        self.group: Any = (
            None  # a gloo process group, joined at the first push: the sampler may still be loading its model
        )

    def _broadcast(self, tensor: torch.Tensor) -> None:
        import torch.distributed as tdist

        if self.group is None:  # joining waits as long as a start may take; then each push gets timeout_s
            start = datetime.timedelta(seconds=max(START_TIMEOUT_S, self.timeout_s))
            self.group = tdist.ProcessGroupGloo(self.store, self.rank, 2, start)
            self.group.set_timeout(datetime.timedelta(seconds=self.timeout_s))
        opts = tdist.BroadcastOptions()
        opts.rootRank = 0
        self.group.broadcast([tensor], opts).wait()

    def send(self, tensors: list[torch.Tensor]) -> None:
        layout = [(tuple(t.shape), t.dtype) for t in tensors]
        for bucket in buckets(layout, self.bucket_mb):
            parts = [tensors[i].detach().to("cpu") for i in bucket]
            self._broadcast(_flatten_dense_tensors(parts) if len(parts) > 1 else parts[0].contiguous())

    def receive(self, params: list[torch.Tensor], layout: list[tuple[tuple, torch.dtype]]) -> None:
        """Into `params` (cast to their dtype and device when the sender's differ)."""
        for bucket in buckets(layout, self.bucket_mb):
            first = params[bucket[0]].data
            if (
                len(bucket) == 1
                and first.device.type == "cpu"
                and first.is_contiguous()
                and first.dtype == layout[bucket[0]][1]
            ):
                self._broadcast(first)  # a large tensor lands in place: no copy
                continue
            shells = [torch.empty(layout[i][0], dtype=layout[i][1]) for i in bucket]
            flat = torch.empty(sum(s.numel() for s in shells), dtype=layout[bucket[0]][1])
            self._broadcast(flat)
            for i, value in zip(bucket, _unflatten_dense_tensors(flat, shells)):
                params[i].data.copy_(value)

    def close(self) -> None:
        if self.group is not None:
            self.group.abort()  # the peer may be gone: without this, gloo's teardown at exit aborts the process
            self.group = None
