"""This machine's peaks, measured: memory bandwidth and matmul FLOP/s, what floors.py divides by.

Imported only when floors.cached_peaks finds no cached figure for this machine, device, dtype, thread count
and torch. On a CPU the bandwidth is a read of a buffer twice the last-level cache (so it comes from memory,
as the weights' reads do); on a GPU a copy. The FLOP/s are a square matmul in the compute dtype.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _best(fn, device: torch.device, repeats: int = 3) -> float:
    fn()
    times = []
    for _ in range(repeats):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        times.append(time.perf_counter() - t0)
    return min(times)


def last_level_cache(caches: Path = Path("/sys/devices/system/cpu/cpu0/cache")) -> int:
    """The CPU's largest cache in bytes, as Linux reports it (32 MiB where it does not)."""
    sizes = []
    for f in caches.glob("index*/size"):
        try:
            text = f.read_text().strip()
        except OSError:
            continue
        if text[:-1].isdigit() and text[-1] in "KM":
            sizes.append(int(text[:-1]) << (10 if text[-1] == "K" else 20))
    return max(sizes, default=32 << 20)


def probe_bytes(device: torch.device) -> int:
    """The bandwidth probe's buffer: on a CPU, twice its last-level cache (64-256 MiB), so the reads come from
    memory, as the weights' do."""
    if device.type == "cuda":
        return 256 << 20
    return min(max(2 * last_level_cache(), 64 << 20), 256 << 20)


def machine_peaks(device: torch.device, dtype: torch.dtype) -> tuple[float, float]:
    """(bandwidth in bytes/s; matmul FLOP/s in `dtype`). On a CPU the bandwidth is a read (a sum) of a buffer
    written first and twice the last-level cache's size: what reading the weights once per decode step costs.
    (A copy out of a buffer never written read the kernel's zero page, one page always in cache, and a 32 MiB
    one fit a 32 MiB cache: on a 2-core AMD EPYC it measured 33.5 GB/s where reading 512 MiB runs at 20-28.)
    On a GPU, a copy, counting bytes read and written."""
    m = 4096 if device.type == "cuda" else 512
    own = torch.Generator(device=device).manual_seed(0)  # not the run's: a run is the same, probed or cached
    x = torch.randn(m, m, generator=own, device=device).to(dtype)
    return bandwidth(device), 2 * m**3 / _best(lambda: x @ x, device)


def bandwidth(device: torch.device) -> float:
    """Bytes/s: on a CPU a read of `probe_bytes`, on a GPU a copy (bytes read and written); the buffers are
    freed on return."""
    n = probe_bytes(device)
    if device.type == "cuda":
        a = torch.empty(n, dtype=torch.uint8, device=device)
        b = torch.empty_like(a)
        return 2 * n / _best(lambda: b.copy_(a), device)
    a = torch.ones(n // 4, device=device)
    return n / _best(a.sum, device, repeats=5)
