"""Run a function on N gloo ranks in fresh processes, with a hard timeout: no distributed test can
hang the suite."""

from __future__ import annotations

import os
import pickle
import socket

import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _entry(rank: int, fn, world: int, port: int, out_dir: str, args: tuple) -> None:
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(world),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world),
    )
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        result = fn(rank, world, *args)
    finally:
        dist.destroy_process_group()
    with open(os.path.join(out_dir, f"rank{rank}.pkl"), "wb") as f:
        pickle.dump(result, f)


def run_ranks(fn, world: int, tmp_path, *args, timeout: float = 120.0) -> list:
    """fn(rank, world, *args) on `world` processes joined in a gloo group; its return values by rank.
    Raises if any rank fails or the whole does not finish within `timeout` seconds (then all are killed)."""
    ctx = mp.start_processes(
        _entry, args=(fn, world, free_port(), str(tmp_path), args), nprocs=world, join=False, start_method="spawn"
    )
    import time

    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{world} ranks did not finish within {timeout:.0f} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    results = []
    for rank in range(world):
        with open(os.path.join(str(tmp_path), f"rank{rank}.pkl"), "rb") as f:
            results.append(pickle.load(f))
    return results


def rank_env(rank: int, world: int, port: int, **extra) -> dict:
    """The variables torchrun gives a worker, for a rank started by hand (so a test knows its pid)."""
    return {
        **os.environ,
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank),
        "LOCAL_WORLD_SIZE": str(world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
        "PYTHONUNBUFFERED": "1",
        "GRPO_DIST_TIMEOUT": "60",
        **extra,
    }


def start_ranks(args: list[str], world: int = 2, log_dir=None):
    """`python -m grpo_cli train ARGS` on `world` ranks started by hand: (processes, log paths)."""
    import subprocess
    import sys

    port, procs, logs = free_port(), [], []
    for rank in range(world):
        log = os.path.join(str(log_dir), f"rank{rank}.log")
        logs.append(log)
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "grpo_cli", "train", *args],
                env=rank_env(rank, world, port),
                stdout=open(log, "w"),
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        )
    return procs, logs


def torchrun(args: list[str], nproc: int = 2, timeout: float = 240):
    """`torchrun --nproc-per-node N -m grpo_cli train ARGS`, the real launcher; the completed process."""
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "GRPO_DIST_TIMEOUT": "60"}
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc-per-node",
        str(nproc),
        "--master-addr",
        "127.0.0.1",
        "--master-port",
        str(free_port()),
        "-m",
        "grpo_cli",
        "train",
        *args,
    ]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
