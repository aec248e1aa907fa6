"""How every helper process starts (`python -m grpo_cli.procs.launch TRAINER_PID MODULE ARGS...`): it asks to
die with the trainer (PR_SET_PDEATHSIG) before anything slow is imported, exits at once if the trainer is
already gone (it died before the request took effect), then runs MODULE as `__main__`. A trainer killed while
a generation worker is still importing torch takes the worker along instead of leaving it running."""

import os
import runpy
import signal
import sys

if __name__ == "__main__":
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != int(sys.argv[1]):  # reparented: the trainer ended before the line above
        sys.exit(0)
    module = sys.argv[2]
    sys.argv = [module, *sys.argv[3:]]
    runpy.run_module(module, run_name="__main__", alter_sys=True)
