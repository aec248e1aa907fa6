"""A process of its own that removes a process's sandbox test directories once that process has ended, however
it ended: a trainer or worker killed with SIGKILL in the middle of a test cannot remove its own.

    python -I -m grpo_cli.sandbox.reaper PID      stdin: a pipe whose write end only PID (and its forks) hold

It reads its stdin until end of file, which comes when every holder of the write end has ended, removes the
directories named for PID (program.scratch_prefix), and exits. The next sandbox's start sweeps them too
(program.sweep_stale), for a reaper that was itself killed.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

_WATCHING: tuple[int, int] | None = None  # (the pid this process's reaper watches, the pipe's write end it holds)


def reap_when_gone() -> None:
    """Start this process's reaper, once: the pipe's write end stays open, unseen by exec'd children
    (non-inheritable), until the process ends."""
    global _WATCHING
    if _WATCHING is not None and _WATCHING[0] == os.getpid():
        return
    read, write = os.pipe()
    subprocess.Popen(
        [sys.executable, "-I", "-m", "grpo_cli.sandbox.reaper", str(os.getpid())],
        stdin=read,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,  # out of the trainer's process group: a Ctrl-C or a group kill leaves it be
    )
    os.close(read)
    _WATCHING = (os.getpid(), write)


def main(pid: int) -> None:
    while os.read(0, 4096):  # nothing is written: this returns b"" once the watched process has ended
        pass
    from grpo_cli.sandbox.program import remove_tree, scratch_prefix

    prefix = scratch_prefix(pid)
    with os.scandir(tempfile.gettempdir()) as entries:
        left = [e.path for e in entries if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False)]
    for path in left:
        remove_tree(path)


if __name__ == "__main__":
    main(int(sys.argv[1]))
