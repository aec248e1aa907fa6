"""What the trainer's helper processes (reward workers, the generation worker) share: how one ended, in
words, and how a helper sets itself up to live and die with its trainer."""

from __future__ import annotations

import signal
import subprocess
import sys


def how_it_ended(process: subprocess.Popen) -> str:
    """"was killed by SIGKILL", "exited with code 7", or "closed its end of the pipe" (still running)."""
    try:
        code = process.wait(5)
    except subprocess.TimeoutExpired:
        return "closed its end of the pipe"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


def as_helper(memory_gib: float = 0.0) -> None:
    """In a helper process: die with the trainer (PR_SET_PDEATHSIG), leave Ctrl-C and SIGTERM to it (it
    finishes its step, saves, then closes its helpers), and keep to `memory_gib` of address space (0 = no
    limit; RLIMIT_AS)."""
    import resource

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if sys.platform == "linux":  # elsewhere the pipe's EOF still ends an idle helper
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG: a killed trainer takes its helpers along
    if memory_gib > 0:
        limit = int(memory_gib * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
