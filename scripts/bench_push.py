"""How long a weight push to the generation worker takes, by transport (transport.py: gloo, in buckets).

    python scripts/bench_push.py                 # Qwen2.5-0.5B's tensors (494M fp32), 3 rounds
    python scripts/bench_push.py --rounds 5 --scale 0.25

Two processes, one thread each, on this machine; the receiver writes into preallocated tensors, as the
worker does. Each round pushes every tensor once per transport, interleaved:
  gloo     one torch.distributed broadcast per tensor over a two-process ProcessGroupGloo (TCP on
           loopback here; the same code reaches another node): the push before transport.py
  buckets  the same group, small tensors flattened into buckets of --bucket-mb MiB, one broadcast each
           and copied out on the receiver; a tensor of a bucket's size or more goes alone, in place
           (transport.GlooTransport)
  socket   each tensor's bytes over a Unix socketpair (multiprocessing Connection.send_bytes /
           recv_bytes_into), a transport that stays on one machine
  memcpy   one copy of every tensor in this process: the floor any same-machine transport pays
Prints seconds per push and GiB/s, median over rounds.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import statistics
import sys
import time
from multiprocessing.connection import Connection


def shapes(scale: float) -> list[tuple[int, ...]]:
    """Qwen2.5-0.5B's parameter shapes (tied embeddings), each row count scaled by `scale`."""
    layer = [
        (896, 896),
        (896,),
        (128, 896),
        (128,),
        (128, 896),
        (128,),
        (896, 896),
        (4864, 896),
        (4864, 896),
        (896, 4864),
        (896,),
        (896,),
    ]
    out = [(151936, 896), *layer * 24, (896,)]
    return [(max(1, int(s[0] * scale)), *s[1:]) for s in out]


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--bucket-mb", type=float, default=1.0, help="the bucketed gloo path's bucket size (transport.py)")
    p.add_argument("--_rank1", nargs=2, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    import torch
    import torch.distributed as tdist
    from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

    from grpo_cli.procs.transport import buckets

    torch.set_num_threads(1)
    rank = 1 if a._rank1 else 0
    tensors = [torch.randn(s) if rank == 0 else torch.empty(s) for s in shapes(a.scale)]
    if rank == 0:
        store = tdist.TCPStore("127.0.0.1", 0, 2, True, datetime.timedelta(seconds=120), wait_for_workers=False)
        ours, theirs = socket.socketpair()
        import subprocess

        child = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--rounds",
                str(a.rounds),
                "--scale",
                str(a.scale),
                "--bucket-mb",
                str(a.bucket_mb),
                "--_rank1",
                str(store.port),
                str(theirs.fileno()),
            ],
            pass_fds=[theirs.fileno()],
        )
        theirs.close()
        conn = Connection(ours.detach())
    else:
        port, fd = int(a._rank1[0]), int(a._rank1[1])
        store = tdist.TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=120))
        conn = Connection(fd)
    group = tdist.ProcessGroupGloo(store, rank, 2, datetime.timedelta(seconds=120))
    opts = tdist.BroadcastOptions()
    opts.rootRank = 0
    size = sum(t.numel() * t.element_size() for t in tensors)
    times: dict[str, list[float]] = {"gloo": [], "buckets": [], "socket": [], "memcpy": []}
    layout = [(tuple(t.shape), t.dtype) for t in tensors]
    copies = [torch.empty_like(t) for t in tensors] if rank == 0 else None
    for _ in range(a.rounds):
        t0 = time.perf_counter()
        for t in tensors:
            group.broadcast([t], opts).wait()
        times["gloo"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for bucket in buckets(layout, a.bucket_mb):  # what transport.GlooTransport sends and receives
            parts = [tensors[i] for i in bucket]
            if len(parts) == 1:  # a tensor of a bucket's size goes alone, in place on both sides
                group.broadcast([parts[0]], opts).wait()
            elif rank == 0:
                group.broadcast([_flatten_dense_tensors(parts)], opts).wait()
            else:
                flat = torch.empty(sum(t.numel() for t in parts), dtype=parts[0].dtype)
                group.broadcast([flat], opts).wait()
                for t, v in zip(parts, _unflatten_dense_tensors(flat, parts)):
                    t.copy_(v)
        times["buckets"].append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        for t in tensors:
            if rank == 0:
                conn.send_bytes(t.numpy().data.cast("B"))
            else:
                conn.recv_bytes_into(t.numpy().data.cast("B"))
        if rank == 0:
            conn.recv_bytes()  # the receiver's "done": the push ends when the data is there
        else:
            conn.send_bytes(b"done")
        times["socket"].append(time.perf_counter() - t0)
        if rank == 0:
            t0 = time.perf_counter()
            for t, c in zip(tensors, copies):
                c.copy_(t)
            times["memcpy"].append(time.perf_counter() - t0)
    group.abort()
    if rank == 1:
        return
    child.wait()
    print(
        f"{sum(t.numel() for t in tensors) / 1e6:.0f}M fp32 parameters ({size / 2**30:.2f} GiB) in {len(tensors)} "
        f"tensors, {a.rounds} rounds, CPU {os.cpu_count()} cores"
    )
    for name, ts in times.items():
        m = statistics.median(ts)
        print(
            f"{name:7s} {m:6.2f} s per push  {size / 2**30 / m:6.2f} GiB/s   (rounds: "
            f"{', '.join(f'{t:.2f}' for t in ts)})"
        )


if __name__ == "__main__":
    main()
