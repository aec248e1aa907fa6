"""`env.sandbox=os`: an environment worker (episodes/worker.py) confined by the kernel before it imports the
environment, for tools and environments that act on what the model writes (run its code, its shell
commands, its queries). The same confinement as the code reward's (sandbox/namespaces.py; docs/sandbox.md):

- user (when not root), mount, PID, network, IPC and UTS namespaces of its own; the worker runs as its PID
  namespace's first process, so whatever it starts ends with it;
- a root filesystem holding, read-only, the Python runtime and what the environment imports (the Python
  path's directories but the one grpo runs in, and the directory of each module env.tools and env.factory
  name, never your whole home), and a private tmpfs of SCRATCH_MIB as its working directory, HOME and
  TMPDIR, the one place it can write; nothing else of the machine is reachable;
- as root, a user id of its own (namespaces.own_uid) with a process-count limit; no capabilities; no_new_privs;
  the system call filter (no ptrace, no signals or limits to processes outside, no mounts, no sockets but Unix);
- the trainer reads its messages as plain data only, and its output goes nowhere (procs/subprocesses.py).
How it works in detail: docs/internals.md, grpo_cli/sandbox/env.py.
"""

from __future__ import annotations

import importlib.util
import os
import resource
import sys
import tempfile

from grpo_cli.errors import GrpoError
from grpo_cli.registry import is_file_spec, split_spec
from grpo_cli.sandbox import namespaces
from grpo_cli.sandbox.scratch import reap_when_gone, scratch_prefix  # as the code reward's: one sweep finds both

SCRATCH_MIB = 256
PROCESSES = 256  # the worker's threads count: one per call in flight, and the calls a timeout abandoned


def readable(cfg: dict) -> list[str]:
    """The directories the worker sees, read-only: the Python installation and environment, the directories on
    the path (but the one grpo runs in), grpo_cli's own, and the directory of each module or file env.tools
    and env.factory name (so it can import what lies beside it); each once (one inside another goes with it).
    One sentence where that would be the whole filesystem or your home directory."""
    package = os.path.dirname(
        os.path.dirname(os.path.realpath(__file__))
    )  # grpo_cli: an editable install's is off the path
    here = os.path.realpath(os.getcwd())
    paths = {os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix), package}
    paths |= {os.path.realpath(p) for p in sys.path if p and os.path.exists(p) and os.path.realpath(p) != here}
    factory = cfg.get("factory")
    specs = [*cfg.get("tools", []), *(factory.values() if isinstance(factory, dict) else [factory] if factory else [])]
    specs += [cfg[key] for key in ("agent", "verifiers") if cfg.get(key) and ":" in str(cfg[key])]
    for spec in specs:
        paths |= where(str(spec), cfg.get("fn_dir"))
    for path in paths:
        if path in ("/", os.path.realpath(os.path.expanduser("~"))):
            raise GrpoError(
                f"env.sandbox=os would show the environment worker all of {path} (the directory of a "
                "module env.tools or env.factory names, or one on the Python path); move the environment's "
                "files into a directory of their own."
            )
    out: list[str] = []
    for path in sorted(paths, key=len):
        if not any(path == kept or path.startswith(kept.rstrip("/") + "/") for kept in out):
            out.append(path)
    return out


def where(spec: str, fn_dir: str | None) -> set[str]:
    """The directory holding the file or top-level module `spec` names (a package's own directory), found
    without importing it; none where it cannot be found (the worker's import then says so)."""
    module, _ = split_spec(spec)
    base = os.path.abspath(fn_dir or os.getcwd())
    if is_file_spec(spec):
        return {os.path.dirname(os.path.realpath(os.path.join(base, os.path.expanduser(module))))}
    top = module.split(".")[0]
    added = base not in sys.path
    if added:
        sys.path.append(base)  # as load_function finds a module beside the user's files
    try:
        found = importlib.util.find_spec(top)
    except (ImportError, ValueError):
        found = None
    finally:
        if added:
            sys.path.remove(base)
    if found is None:
        return set()
    if found.submodule_search_locations:  # a package (a namespace package may have several)
        return {os.path.realpath(p) for p in found.submodule_search_locations}
    return {os.path.dirname(os.path.realpath(found.origin))} if found.origin and os.path.isfile(found.origin) else set()


def confine(cfg: dict, keep_fd: int, shown: tuple[str, ...] = (), loopback: bool = False) -> None:
    """Confine this process (single-threaded, with nothing of the environment imported yet); it goes on
    as the PID namespace's first process, the process the trainer started waiting for it outside. `shown`:
    directories shown too (read-only); `loopback`: its network namespace's loopback is up, and TCP sockets are
    allowed (nothing but loopback exists there: an agent worker's way to the endpoint). One sentence where the
    kernel refuses."""
    runtime = readable(cfg) + [os.path.realpath(p) for p in shown]
    sys.path[:] = [
        os.path.realpath(p or ".") for p in sys.path
    ]  # as the view shows them; '' is the trainer's directory
    reap_when_gone()  # the worker's directory goes once it has ended, SIGKILL included (sandbox/scratch.py)
    home = tempfile.mkdtemp(prefix=scratch_prefix(os.getpid()))
    root, work = os.path.join(home, "root"), os.path.join(home, "work")
    os.mkdir(root)
    uid = namespaces.own_uid() if os.getuid() == 0 else None  # as root: a user of its own, with a process limit
    try:
        namespaces.namespaces(namespaces.CLONE_NEWPID)  # this process keeps the machine's mounts, to clean up
    except OSError as e:
        os.rmdir(root)
        os.rmdir(home)
        raise refusal(e) from None

    def remove_directories() -> None:
        os.rmdir(root)
        os.rmdir(home)

    namespaces.first_process(close=(keep_fd,), then=remove_directories)
    try:
        namespaces.namespaces(namespaces.NAMESPACES & ~namespaces.CLONE_NEWPID, user=False)
        namespaces.view(root, work, runtime, os.getuid() if uid is None else uid, SCRATCH_MIB * 2**20)
        if loopback:
            namespaces.loopback_up()
        if uid is not None:
            namespaces.become(uid)
            resource.setrlimit(resource.RLIMIT_NPROC, (PROCESSES, PROCESSES))
        namespaces.die_with_parent(0)  # a change of user cleared it
        namespaces.drop_capabilities()
        namespaces.seccomp(inet=loopback)
    except OSError as e:
        raise refusal(e) from None
    os.environ.update(HOME=work, TMPDIR=work)
    tempfile.tempdir = None


def refusal(e: OSError) -> GrpoError:
    return GrpoError(
        f"env.sandbox=os cannot confine the environment workers here ({e}); run where the kernel "
        "allows user namespaces (sysctl kernel.unprivileged_userns_clone=1, or a container with "
        "--privileged or seccomp=unconfined), or set env.sandbox=none to run them unconfined."
    )
