"""The scratch directories sandboxed code writes in: their names (each carries its maker's PID namespace and pid),
their removal whatever the code did to them, and their sweeping once their maker has ended. A process killed
with SIGKILL mid-test cannot remove its own: its reaper, a process of its own, does.

    python -I -m grpo_cli.sandbox.scratch PID      stdin: a pipe whose write end only PID (and its forks) hold

The reaper reads its stdin until end of file, which comes when every holder of the write end has ended,
removes the directories named for PID, and exits. The next sandbox's start sweeps them too (sweep_stale), for
a reaper that was itself killed.
"""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

SCRATCH = "grpo-sandbox-"  # a test's directory: grpo-sandbox-<its maker's PID namespace>-<its maker's pid>-<random>
FS_IOC_SETFLAGS = 0x40086602  # clears chattr's immutable and append-only flags (as root)


def remove_tree(path: str) -> None:
    """Remove a test's directory whatever the program did to it: modes taken away, files made immutable or
    append-only (chattr, as root), which block removal until the flags are cleared, or directories nested
    deeper than Python's recursion limit (rm removes those)."""
    try:
        shutil.rmtree(path, ignore_errors=True)
    except RecursionError:
        subprocess.run(["rm", "-rf", "--one-file-system", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if not os.path.lexists(path):
        return
    import fcntl
    import struct

    def free(name: str) -> None:  # a regular file or directory only: opening a device or FIFO could act
        try:
            if stat.S_ISREG(os.lstat(name).st_mode) or stat.S_ISDIR(os.lstat(name).st_mode):
                fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW)
                try:
                    fcntl.ioctl(fd, FS_IOC_SETFLAGS, struct.pack("i", 0))
                finally:
                    os.close(fd)
                os.chmod(name, 0o700)
        except OSError:  # a flag the filesystem does not have, or a file gone meanwhile
            pass

    free(path)  # first, so a directory whose modes were taken away can be listed
    try:
        for root, dirs, files in os.walk(path):  # top down: each directory is freed before it is listed
            for name in dirs + files:
                free(os.path.join(root, name))
    except RecursionError:  # deeper than Python's limit: what is freed by then is removed below
        pass
    subprocess.run(["rm", "-rf", "--one-file-system", path], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def scratch_prefix(pid: int | str) -> str:
    """The name a test directory of process `pid` (of this PID namespace) starts with. The namespace is part
    of it: a /tmp shared with another container holds pids that mean other processes there."""
    try:
        namespace = os.stat("/proc/self/ns/pid").st_ino
    except OSError:  # no /proc (not Linux)
        namespace = 0
    return f"{SCRATCH}{namespace}-{pid}-"


def sweep_stale() -> None:
    """Remove the test directories of processes that have ended (a trainer or reward worker killed mid-test
    could not remove its own): each directory's name carries the PID namespace and pid of its maker."""
    pattern = re.compile(re.escape(scratch_prefix("PID")).replace("PID", r"(\d+)"))
    with os.scandir(tempfile.gettempdir()) as entries:
        for entry in entries:
            match = pattern.match(entry.name)
            if match and entry.is_dir(follow_symlinks=False) and not _alive(int(match.group(1))):
                remove_tree(entry.path)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


_WATCHING: tuple[int, int] | None = None  # (the pid this process's reaper watches, the pipe's write end it holds)


def reap_when_gone() -> None:
    """Start this process's reaper, once: the pipe's write end stays open, unseen by exec'd children
    (non-inheritable), until the process ends."""
    global _WATCHING
    if _WATCHING is not None and _WATCHING[0] == os.getpid():
        return
    read, write = os.pipe()
    subprocess.Popen(
        [sys.executable, "-I", "-m", "grpo_cli.sandbox.scratch", str(os.getpid())],
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
    prefix = scratch_prefix(pid)
    with os.scandir(tempfile.gettempdir()) as entries:
        left = [e.path for e in entries if e.name.startswith(prefix) and e.is_dir(follow_symlinks=False)]
    for path in left:
        remove_tree(path)


if __name__ == "__main__":
    main(int(sys.argv[1]))
