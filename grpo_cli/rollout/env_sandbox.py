"""`env.sandbox=os`: an environment worker (env_worker.py) confined by the kernel before it imports the
environment, for tools and environments that act on what the model writes (run its code, its shell
commands, its queries). The same confinement as the code reward's (rewards/sandbox_os.py; docs/sandbox.md):

- user (when not root), mount, PID, network, IPC and UTS namespaces of its own; the worker runs as its PID
  namespace's first process, so whatever it starts ends with it;
- a root filesystem holding, read-only, the Python runtime and what the environment imports (every
  directory on the trainer's Python path, env.fn_dir), and a private tmpfs of SCRATCH_MIB as its working
  directory, HOME and TMPDIR, the one place it can write; nothing else of the machine is reachable;
- as root, a user id of its own (sandbox_os.own_uid) with a process-count limit; no capabilities; no_new_privs; the system call
  filter (no ptrace, no signals or limits to processes outside, no mounts, no sockets but Unix ones);
- the trainer reads its messages as plain data only, and its output goes nowhere (procs/subprocesses.py).

The environment's module is the user's code: the trainer imports it too, for the tools' schemas. What is
confined is what its calls do with the model's text.
"""

from __future__ import annotations

import os
import resource
import sys
import tempfile

from grpo_cli.errors import GrpoError
from grpo_cli.rewards import sandbox_os
from grpo_cli.rewards.code import scratch_prefix  # the code reward's test directories' names: one sweep finds both

SCRATCH_MIB = 256
PROCESSES = 256  # the worker's threads count: one per call in flight, and the calls a timeout abandoned


def readable(fn_dir: str | None) -> list[str]:
    """The directories the worker sees, read-only: the Python installation and environment, every
    directory on the path, grpo_cli's own, env.fn_dir; each once (one inside another goes with it)."""
    package = os.path.dirname(os.path.dirname(os.path.realpath(__file__)))  # grpo_cli: an editable install's is off the path
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), package}
    paths |= {os.path.realpath(p or ".") for p in [*sys.path, fn_dir or "."] if os.path.exists(p or ".")}
    if "/" in paths:
        raise GrpoError("env.sandbox=os would show the worker the machine's whole filesystem, since '/' is on the "
                        "Python path or is env.fn_dir; run grpo train from the project's directory instead.")
    out: list[str] = []
    for path in sorted(paths, key=len):
        if not any(path == kept or path.startswith(kept + "/") for kept in out):
            out.append(path)
    return out


def confine(fn_dir: str | None, keep_fd: int) -> None:
    """Confine this process (single-threaded, with nothing of the environment imported yet); it goes on
    as the PID namespace's first process, the process the trainer started waiting for it outside. One
    sentence where the kernel refuses."""
    runtime = readable(fn_dir)
    sys.path[:] = [os.path.realpath(p or ".") for p in sys.path]  # as the view shows them; '' is the trainer's directory
    home = tempfile.mkdtemp(prefix=scratch_prefix(os.getpid()))  # swept at the next start if left behind
    root, work = os.path.join(home, "root"), os.path.join(home, "work")
    os.mkdir(root)
    uid = sandbox_os.own_uid() if os.getuid() == 0 else None  # as root: a user of its own, with a process limit
    try:
        sandbox_os.namespaces(sandbox_os.CLONE_NEWPID)  # this process keeps the machine's mounts, to clean up
    except OSError as e:
        os.rmdir(root)
        os.rmdir(home)
        raise refusal(e) from None
    sandbox_os.first_process(close=(keep_fd,), then=lambda: (os.rmdir(root), os.rmdir(home)))
    try:
        sandbox_os.namespaces(sandbox_os.NAMESPACES & ~sandbox_os.CLONE_NEWPID, user=False)
        sandbox_os.view(root, work, runtime, os.getuid() if uid is None else uid, SCRATCH_MIB * 2**20)
        if uid is not None:
            sandbox_os.become(uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (PROCESSES, PROCESSES))
        sandbox_os.die_with_parent(0)  # a change of user cleared it
        sandbox_os.drop_capabilities()
        sandbox_os.seccomp()
    except OSError as e:
        raise refusal(e) from None
    os.environ.update(HOME=work, TMPDIR=work)
    tempfile.tempdir = None


def refusal(e: OSError) -> GrpoError:
    return GrpoError(f"env.sandbox=os cannot confine the environment workers here ({e}); run where the kernel "
                     "allows user namespaces (sysctl kernel.unprivileged_userns_clone=1, or a container with "
                     "--privileged or seccomp=unconfined), or set env.sandbox=none to run them unconfined.")

