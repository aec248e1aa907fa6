"""The sandbox's first code, run as `python -I -S sandbox_child.py SETTINGS` in a fresh temporary
directory (rewards/code.py): it confines its own process, then runs the model's program.

In this order, each before any of the program's code runs:
0. it dies with the trainer (PR_SET_PDEATHSIG, the first thing it does; it exits if the trainer is already
   gone);
1. resource limits: CPU seconds, address space, file size (stdout is a file, so a flood of output
   is a file growing past it), open files, no core dumps;
2. a network namespace and a PID namespace of its own where the OS allows them (root, or a user namespace
   mapping only its own user): no interface but a down loopback, and the program runs as the namespace's
   first process (this process waits for it and passes on how it ended), so when the program ends, the
   test's time is up or the trainer dies, every process it started dies with it, a `setsid` daemon too;
   the audit hook below refuses sockets either way; with them a mount namespace, made private, with a
   /proc of its own, so no other process (the trainer's secrets in its environment, its memory, its open
   files) is visible;
3. when started as root, and `nobody` can read the interpreter's standard library: the groups, group
   and user of `nobody`, so the process-count limit holds (it does not bind root) and the machine's files
   are not the program's to change (code.py decides; where the interpreter lives under a private
   directory such as /root, the process keeps its user, and the hook and the kill of its whole process
   group when it ends stand in);
4. a Python audit hook (PEP 578) refusing sockets, new processes (fork, exec, spawn, subprocess,
   os.system), native code (ctypes), and opening for writing, removing or renaming outside the
   directory. An audit hook cannot be removed from Python code, and the OS limits above hold
   even against what it does not see.
Then the program runs as `__main__`, with the test's input on stdin (stdin/stdout tests), or followed
by one assert statement, after which the harness prints the line it was given on stdin before the
program started (assert tests: a program that exits early never prints it). This confines, it does not
prove honesty: a program that read that line out of the harness's frames could forge a pass.
"""

import json
import os
import resource
import sys

CLONE_NEWNET = 0x40000000
CLONE_NEWPID = 0x20000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REC, MS_PRIVATE = 0x2, 0x4, 0x8, 0x4000, 0x40000
PR_SET_PDEATHSIG = 1
NOBODY = 65534
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


def limit(settings: dict) -> None:
    cpu, memory, size = settings["cpu_s"], settings["memory_bytes"], settings["file_bytes"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if settings["drop_user"]:
        os.setgroups([])
        os.setgid(NOBODY)
        os.setuid(NOBODY)
    resource.setrlimit(resource.RLIMIT_NPROC, (settings["processes"], settings["processes"]))


def die_with_parent(parent: int) -> None:
    """SIGKILL when the process that started this one ends; exit now if it already has."""
    if sys.platform == "linux":
        import ctypes

        ctypes.CDLL(None).prctl(PR_SET_PDEATHSIG, 9)
    if os.getppid() != parent:
        os._exit(1)


def own_namespaces() -> bool:
    """Network, PID and mount namespaces of its own (in a user namespace mapping only this user, when not
    root): whether they were made (the next child is the PID namespace's first process). Without them (no
    user namespaces here, or root without CAP_SYS_ADMIN), a network namespace alone where allowed, and the
    process group's kill stands in."""
    if sys.platform != "linux":
        return False
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    uid, gid = os.getuid(), os.getgid()
    # Root keeps to the machine's user namespace (it may still drop to nobody, which a namespace mapping only
    # root could not); root without CAP_SYS_ADMIN (a container) then gets no namespace, as before.
    if libc.unshare(CLONE_NEWNET | CLONE_NEWPID | CLONE_NEWNS | (CLONE_NEWUSER if uid else 0)) != 0:
        libc.unshare(CLONE_NEWNET)  # -1 without CAP_SYS_ADMIN: then the audit hook alone refuses sockets
        return False
    if uid:  # the user namespace maps this user alone, to itself: files it writes are still its own
        for name, value in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(value)
    return True


def own_proc() -> None:
    """A /proc of the namespace's own, in its own mount namespace made private first (so nothing mounted
    here reaches the machine's): the program sees its own processes only, and no other process's environ,
    cmdline, memory, working directory or open files (the trainer's included)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.mount(None, b"/", None, MS_REC | MS_PRIVATE, None) == 0:  # else mount nothing: it could reach the machine's
        libc.mount(b"proc", b"/proc", b"proc", MS_NOSUID | MS_NODEV | MS_NOEXEC, None)  # refused where /proc is
        # partly covered (some containers): the machine's /proc stays, as without namespaces


def first_process() -> None:
    """Fork the namespace's first process, which goes on to run the program; this one waits for it and
    ends as it did. When either ends, the kernel ends every process of the namespace."""
    pid = os.fork()
    if pid == 0:
        die_with_parent(0)  # its parent is outside the namespace: getppid() is 0
        own_proc()
        return
    status = os.waitpid(pid, 0)[1]
    code = os.waitstatus_to_exitcode(status)
    os._exit(code if code >= 0 else 128 - code)


def audit(home: str):
    """The hook: refuse what a test program has no business doing."""
    home = os.path.realpath(home)
    refused = ("socket.", "subprocess.", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn", "os.exec",
               "os.system", "os.kill", "os.killpg", "ctypes.", "pty.", "os.chmod", "os.chown", "os.link", "os.symlink")

    def inside(path) -> bool:
        if isinstance(path, int):  # an open descriptor: already checked when it was opened
            return True
        return os.path.realpath(os.fsdecode(path)).startswith(home + os.sep)

    def hook(event: str, args) -> None:
        if event.startswith(refused):
            raise PermissionError(f"the sandbox refuses {event}")
        if event == "open" and args[0] is not None:
            path, mode, flags = args[0], args[1] or "", args[2] or 0
            writing = any(c in str(mode) for c in "wax+") or flags & WRITE_FLAGS
            if writing and not inside(path):
                raise PermissionError(f"the sandbox refuses writing {path}")
        elif event in ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.truncate", "os.utime", "shutil.rmtree"):
            paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
            if not all(inside(p) for p in paths):
                raise PermissionError(f"the sandbox refuses {event} outside its directory")

    return hook


def main() -> None:
    settings = json.loads(sys.argv[1])
    die_with_parent(settings["parent"])
    token = sys.stdin.readline().strip() if settings["assertion"] is not None else None
    with open("program.py") as f:  # read before the user changes
        source = f.read()
    pid_namespace = own_namespaces()  # as whoever started it: root, or a user mapping itself
    limit(settings)
    if pid_namespace:
        first_process()
    sys.addaudithook(audit(os.getcwd()))
    code = compile(source, "program.py", "exec")
    check = compile(settings["assertion"], "test", "exec") if settings["assertion"] is not None else None
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    exec(code, namespace)
    if check is not None:
        exec(check, namespace)
        sys.stdout.write(token + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
