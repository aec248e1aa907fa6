"""Process settings that make CPU runs fast: torch's thread count, and glibc's allocator told to keep
freed memory for reuse.

How it works in detail: docs/internals.md, grpo_cli/models/runtime.py.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import sys
from contextlib import contextmanager

import torch

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4  # glibc's mallopt parameter numbers (malloc.h)
DEFAULT_MMAP_MAX = 65536  # glibc's own M_MMAP_MAX
_mallopt = None  # glibc's mallopt, once reuse_freed_memory has applied it


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


def reuse_freed_memory() -> bool:
    """Keep freed memory in the process for reuse (see the module docstring); True when applied.
    Only glibc has mallopt; elsewhere, or with GRPO_MALLOC=system, nothing changes."""
    if os.environ.get("GRPO_MALLOC", "").lower() == "system":
        return False
    global _mallopt
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):  # not glibc: musl, macOS, Windows
        return False
    applied = bool(mallopt(M_MMAP_MAX, 0)) and bool(mallopt(M_TRIM_THRESHOLD, ctypes.c_int(-1)))  # -1: never trim
    _mallopt = mallopt if applied else None
    return applied


@contextmanager
def returned_when_freed():
    """Within it, large blocks are mmap'ed again, so those freed go back to the kernel instead of staying
    in the kept heap: for one-off buffers (the machine probe's 64 MiB), which would otherwise stay in the
    process's RSS for the whole run."""
    if _mallopt is None:
        yield
        return
    _mallopt(M_MMAP_MAX, DEFAULT_MMAP_MAX)
    try:
        yield
    finally:
        _mallopt(M_MMAP_MAX, 0)


def prepare_process(threads: int, device: torch.device, local_processes: int = 1, deterministic: bool = False) -> int:
    """Threads for this process and, on CPU, the allocator setting; returns the thread count. `deterministic`
    (trainer.deterministic): kernels that give the same bits every run, as far as torch has them (an op
    without one warns), and cuBLAS's fixed workspace, which must be set before cuBLAS starts. On CUDA,
    attention runs on SDPA's math kernels: the fused ones' backward (memory-efficient and cuDNN, which
    padded or packed rows' masks select) adds gradients with atomics, in a different order every run."""
    if device.type == "cpu":
        reuse_freed_memory()
    if deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        if device.type == "cuda":
            torch.backends.cuda.enable_flash_sdp(False)
            torch.backends.cuda.enable_mem_efficient_sdp(False)
            torch.backends.cuda.enable_cudnn_sdp(False)
    return set_threads(threads, local_processes)


def _linear_sum_assignment(*args, **kwargs):
    """scipy's, imported on the first call (defer_scipy)."""
    from scipy.optimize import linear_sum_assignment

    return linear_sum_assignment(*args, **kwargs)


def defer_scipy() -> bool:
    """Import transformers' losses without scipy; True when this call kept scipy out.

    `transformers.modeling_utils` imports every loss of its registry, and the object-detection losses import
    `scipy.optimize` at import time for their matcher's `linear_sum_assignment`: 36 MiB of resident memory
    (torch 2.13, transformers 5.24, scipy 1.17) that a language model never uses. Here the losses are imported
    while transformers' scipy check answers False; then the check is restored, and each loss module it guarded
    gets a `linear_sum_assignment` that imports scipy's on its first call, so a detection model still trains.
    Called before anything imports a transformers model (cli's job, the generation worker); later, without
    scipy installed, or with a transformers that has no loss registry, it does nothing."""
    if "transformers.loss.loss_utils" in sys.modules or importlib.util.find_spec("transformers.loss") is None:
        return False
    import transformers.utils as hf_utils

    check = hf_utils.is_scipy_available
    if not check():
        return False
    answer_no = hf_utils.is_scipy_available = lambda: False
    try:
        import transformers.loss.loss_utils  # noqa: F401 - the registry imports every loss module
    finally:
        hf_utils.is_scipy_available = check
    for name, module in list(sys.modules.items()):
        if name.startswith("transformers.loss.") and getattr(module, "is_scipy_available", None) is answer_no:
            module.__dict__["is_scipy_available"] = check
            if not hasattr(module, "linear_sum_assignment"):
                module.__dict__["linear_sum_assignment"] = _linear_sum_assignment
    return "scipy" not in sys.modules


def prepare_libraries() -> None:
    """transformers as a job (cli) and the generation worker want it, before any model class is imported: quiet
    (the trainer's console is the one that shows what the run does; transformers' per-load bars and warnings are
    noise here), and its losses imported without scipy (defer_scipy)."""
    from transformers.utils import logging as hf_logging

    defer_scipy()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
