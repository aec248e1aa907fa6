"""The sandbox's confinement by the kernel (Linux), used by sandbox/child.py before a program runs.
Standard library and ctypes only: it runs in `python -I -S`, imported before the filesystem view hides it.

- `namespaces()`: user (when not root), mount, PID, network and IPC namespaces of the process's own.
- `view(work, runtime)`: a root filesystem holding only what a program needs, read-only: the machine's
  /usr, /bin, /lib*, the interpreter's installation, a few files of /etc; /dev/null and its kin; a /proc
  of its own PID namespace; and a small tmpfs at its scratch directory's path, the one place it can write. The
  machine's root is
  detached (pivot_root), so no other file is reachable by any path, /proc/<pid>/root included.
- `drop_capabilities()`: none left, so nothing above can be undone.
- `seccomp()`: no_new_privs, then a filter refusing (EPERM) the system calls a scored program never needs.
- `first_process()`, `die_with_parent()`, `own_uid()`, `become()`: the PID namespace's first process, its tie
  to the process that started it, and (as root) the switch to a user id of its own.
How it works in detail: docs/internals.md, grpo_cli/sandbox/namespaces.py.
"""

import ctypes
import os
import struct
import sys

CLONE_NEWNS, CLONE_NEWIPC, CLONE_NEWUSER = 0x00020000, 0x08000000, 0x10000000
CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWUTS = 0x20000000, 0x40000000, 0x04000000
CLONE_NEW_ANY = 0x7E020080  # every CLONE_NEW* flag, CLONE_NEWTIME and CLONE_NEWCGROUP included
MS_RDONLY, MS_NOSUID, MS_NODEV, MS_NOEXEC, MS_REMOUNT, MS_BIND = 0x1, 0x2, 0x4, 0x8, 0x20, 0x1000
MS_REC, MS_PRIVATE, MS_NOATIME, MS_NODIRATIME, MS_RELATIME = 0x4000, 0x40000, 0x400, 0x800, 0x200000
MNT_DETACH = 2
NOBODY = 65534
OWN_IDS = 0x70000000  # as root, a confined process runs as this plus its pid (pids stay below 2**22)
PR_SET_PDEATHSIG = 1
PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
EPERM, ENOSYS = 1, 38

# System calls a scored program never needs, by number on each architecture: tracing and reading other
# processes, loading code into the kernel, mounts and namespaces, keys, BPF, perf, io_uring, handles that
# reach files by inode, device nodes and FIFOs, the clock and host names, extended attributes.
REFUSED = (
    "ptrace process_vm_readv process_vm_writev kexec_load kexec_file_load mount umount2 pivot_root "
    "chroot pidfd_send_signal pidfd_open pidfd_getfd keyctl add_key request_key bpf perf_event_open "
    "unshare setns init_module finit_module delete_module reboot swapon swapoff acct userfaultfd "
    "io_uring_setup io_uring_enter io_uring_register open_by_handle_at name_to_handle_at mknod mknodat "
    "syslog settimeofday clock_settime adjtimex clock_adjtime sethostname setdomainname quotactl vhangup "
    "fanotify_init iopl ioperm kcmp move_mount open_tree fsopen fsconfig fsmount fspick mount_setattr "
    "personality setxattr lsetxattr fsetxattr removexattr lremovexattr fremovexattr setxattrat "
    "removexattrat process_madvise migrate_pages move_pages"
).split()
# from the kernel's unistd headers: asm/unistd_64.h (x86_64), asm-generic/unistd.h (aarch64)
NUMBERS: dict[str, tuple[int, dict, dict]] = {
    "x86_64": (
        0xC000003E,
        dict(
            zip(
                REFUSED,
                (
                    101,
                    310,
                    311,
                    246,
                    320,
                    165,
                    166,
                    155,
                    161,
                    424,
                    434,
                    438,
                    250,
                    248,
                    249,
                    321,
                    298,
                    272,
                    308,
                    175,
                    313,
                    176,
                    169,
                    167,
                    168,
                    163,
                    323,
                    425,
                    426,
                    427,
                    304,
                    303,
                    133,
                    259,
                    103,
                    164,
                    227,
                    159,
                    305,
                    170,
                    171,
                    179,
                    153,
                    300,
                    172,
                    173,
                    312,
                    429,
                    428,
                    430,
                    431,
                    432,
                    433,
                    442,
                    135,
                    188,
                    189,
                    190,
                    197,
                    198,
                    199,
                    463,
                    466,
                    440,
                    256,
                    279,
                ),
            )
        ),
        {"prlimit64": 302, "clone": 56, "clone3": 435, "socket": 41},
    ),
    "aarch64": (
        0xC00000B7,
        dict(
            zip(
                REFUSED,
                (
                    117,
                    270,
                    271,
                    104,
                    294,
                    40,
                    39,
                    41,
                    51,
                    424,
                    434,
                    438,
                    219,
                    217,
                    218,
                    280,
                    241,
                    97,
                    268,
                    105,
                    273,
                    106,
                    142,
                    224,
                    225,
                    89,
                    282,
                    425,
                    426,
                    427,
                    265,
                    264,
                    None,
                    33,
                    116,
                    170,
                    112,
                    171,
                    266,
                    161,
                    162,
                    60,
                    58,
                    262,
                    None,
                    None,
                    272,
                    429,
                    428,
                    430,
                    431,
                    432,
                    433,
                    442,
                    92,
                    5,
                    6,
                    7,
                    14,
                    15,
                    16,
                    463,
                    466,
                    440,
                    238,
                    239,
                ),
            )
        ),
        {"prlimit64": 261, "clone": 220, "clone3": 435, "socket": 198},
    ),
}
AF_UNIX, AF_INET = 1, 2
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1

_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> None:
    if result != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{what}: {os.strerror(err)}")


NAMESPACES = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS


def namespaces(flags: int = NAMESPACES, user: bool = True) -> None:
    """Mount, PID, network, IPC and UTS namespaces of its own (`flags`), in a user namespace mapping only this
    user to itself when not root and `user` (root keeps the machine's, so that it can become another user);
    OSError where the kernel refuses. After a new PID namespace, the next child this process forks is its
    first process."""
    if sys.platform != "linux":
        raise OSError(f"namespaces are Linux's, and this is {sys.platform}")
    uid, gid = os.getuid(), os.getgid()
    user = user and uid != 0
    _check(_libc.unshare(flags | (CLONE_NEWUSER if user else 0)), "unshare")
    if user:  # files it writes are still its own user's
        for name, value in (("setgroups", "deny"), ("uid_map", f"{uid} {uid} 1"), ("gid_map", f"{gid} {gid} 1")):
            with open(f"/proc/self/{name}", "w") as f:
                f.write(value)


def die_with_parent(parent: int) -> None:
    """SIGKILL when the process that started this one ends; exit now if it already has (`parent` is the
    pid expected, 0 in a PID namespace's first process)."""
    if sys.platform == "linux":
        _libc.prctl(PR_SET_PDEATHSIG, 9)
    if os.getppid() != parent:
        os._exit(1)


def first_process(close: tuple[int, ...] = (), then=None) -> None:
    """Fork the PID namespace's first process, which returns and goes on; this one closes `close` (its
    copies of descriptors the first process keeps), waits for it, calls `then()` and ends as it did. When
    either ends, the kernel ends every process of the namespace."""
    pid = os.fork()
    if pid == 0:
        die_with_parent(0)  # its parent is outside the namespace: getppid() is 0
        return
    for fd in close:
        os.close(fd)
    status = os.waitpid(pid, 0)[1]
    code = os.waitstatus_to_exitcode(status)
    try:
        if then is not None:
            then()
    finally:  # this process never goes on to run what the first process runs, whatever `then` raised
        os._exit(code if code >= 0 else 128 - code)


def own_uid() -> int:
    """A user (and group) id of this process's own, for root to become: OWN_IDS + its pid, which no other
    running process of this PID namespace shares, so a process-count limit counts this process's children
    alone, and no file or process of the machine belongs to it. `nobody` where that id is not mapped in this
    user namespace (a rootless container maps a range)."""
    uid = OWN_IDS + os.getpid()
    try:
        maps = []
        for name in ("uid_map", "gid_map"):
            with open(f"/proc/self/{name}") as f:
                maps.append([tuple(map(int, line.split())) for line in f if line.strip()])
    except OSError:
        return NOBODY
    mapped = all(any(first <= uid < first + count for first, _, count in ranges) for ranges in maps)
    return uid if mapped else NOBODY


def become(uid: int) -> None:
    """Root's groups and user become `uid`'s (a process-count limit then binds, which it does not for
    root). Clears the death signal: call die_with_parent again after."""
    os.setgroups([])
    os.setgid(uid)
    os.setuid(uid)


def _mount(source, target, fstype, flags, data=None) -> None:
    enc = lambda s: None if s is None else os.fsencode(s)  # noqa: E731
    _check(_libc.mount(enc(source), enc(target), enc(fstype), flags, enc(data)), f"mount {target}")


def _locked_flags(path: str) -> int:
    """The flags of the mount `path` is on, which a read-only remount of its bind must keep (a user
    namespace may not clear them)."""
    have = os.statvfs(path).f_flag
    pairs = (
        (os.ST_NOSUID, MS_NOSUID),
        (os.ST_NODEV, MS_NODEV),
        (os.ST_NOEXEC, MS_NOEXEC),
        (os.ST_NOATIME, MS_NOATIME),
        (os.ST_NODIRATIME, MS_NODIRATIME),
        (os.ST_RELATIME, MS_RELATIME),
    )
    return sum(ms for st, ms in pairs if have & st)


def _bind(root: str, path: str) -> None:
    """Show the machine's `path` at the same place under `root`, read-only."""
    target = root + path
    if os.path.isdir(path):
        os.makedirs(target, mode=0o755, exist_ok=True)
    else:
        os.makedirs(os.path.dirname(target), mode=0o755, exist_ok=True)
        open(target, "a").close()
    _mount(path, target, None, MS_BIND)
    _mount(None, target, None, MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID | MS_NODEV | _locked_flags(path))


def view(root: str, work: str, runtime: list[str], owner: int, size: int) -> None:
    """Make `root` (an empty directory) the filesystem this process and its children see: the runtime,
    read-only, at its own paths, and at `work` a tmpfs of `size` bytes owned by `owner`, the one place the
    program can write (so a program cannot fill the machine's disk, and what it writes is gone with it);
    then leave for it, detaching the machine's root."""
    os.umask(0o022)
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing below reaches the machine's mounts
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
    for top in ("/usr", "/bin", "/sbin", "/lib", "/lib64", "/lib32", "/libx32"):
        if os.path.islink(top):  # a merged /usr: /bin -> usr/bin
            os.symlink(os.readlink(top), root + top)
        elif os.path.isdir(top):
            _bind(root, top)
    for path in runtime:  # the interpreter's installation, unless /usr's bind shows it (same filesystem)
        under_usr = path == "/usr" or path.startswith("/usr/")
        if not under_usr or os.stat(path).st_dev != os.stat("/usr").st_dev:
            _bind(root, path)
    os.mkdir(f"{root}/etc", 0o755)
    for name in ("ld.so.cache", "localtime"):  # what the dynamic loader and the time module read
        path = f"/etc/{name}"
        if os.path.islink(path):  # /etc/localtime -> /usr/share/zoneinfo/...: shown with /usr
            os.symlink(os.readlink(path), root + path)
        elif os.path.isfile(path):
            _bind(root, path)
    os.mkdir(f"{root}/dev", 0o755)
    for name in ("null", "zero", "full", "random", "urandom"):
        open(f"{root}/dev/{name}", "a").close()
        _mount(f"/dev/{name}", f"{root}/dev/{name}", None, MS_BIND)
    os.makedirs(root + work, mode=0o755)
    _mount(
        "tmpfs",
        root + work,
        "tmpfs",
        MS_NOSUID | MS_NODEV | MS_NOEXEC,
        f"size={size},nr_inodes=4096,mode=0700,uid={owner},gid={owner}",
    )
    os.mkdir(f"{root}/proc")
    os.chdir(root)
    _check(_libc.syscall(NUMBERS[os.uname().machine][1]["pivot_root"], b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", MNT_DETACH), "detach the machine's root")
    os.chdir("/")
    try:  # a /proc of this PID namespace; refused where the machine's /proc is partly covered (containers)
        _mount("proc", "/proc", "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    except OSError:
        pass  # then no /proc at all, which hides no less
    _mount(None, "/", None, MS_REMOUNT | MS_RDONLY | MS_NOSUID | MS_NODEV)
    os.chdir(work)


def loopback_up() -> None:
    """Bring up this network namespace's loopback interface (a new namespace's is down), its only one."""
    import fcntl
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        flags = struct.unpack("16sH22x", fcntl.ioctl(s, SIOCGIFFLAGS, struct.pack("16sH22x", b"lo", 0)))[1]
        fcntl.ioctl(s, SIOCSIFFLAGS, struct.pack("16sH22x", b"lo", flags | IFF_UP))


def drop_capabilities() -> None:
    """Empty every capability set of this process (its user namespace's included), so no mount or limit set
    above can be changed back."""
    header = struct.pack("Ii", 0x20080522, 0)  # _LINUX_CAPABILITY_VERSION_3, this process
    data = bytes(24)  # two {effective, permitted, inheritable} triples, all zero
    _check(_libc.capset(header, data), "capset")


def _filter(arch: int, refused: dict, special: dict, families: tuple[int, ...] = (AF_UNIX,)) -> bytes:
    """The BPF program: the wrong architecture or an x32 call is refused outright; the calls in `refused`,
    prlimit on another process, clone with a CLONE_NEW* flag and socket of a family not in `families` get EPERM;
    clone3 gets ENOSYS (its flags are out of a filter's reach; the C library then uses clone)."""
    LD, JEQ, JGE, JSET, RET = 0x20, 0x15, 0x35, 0x45, 0x06
    ALLOW, ERRNO, KILL = 0x7FFF0000, 0x00050000, 0x80000000
    numbers = sorted(n for n in refused.values() if n is not None)
    prog = [
        (LD, 0, 0, 4),
        (JEQ, 1, 0, arch),
        (RET, 0, 0, KILL),
        (LD, 0, 0, 0),
        (JGE, 0, 1, 0x40000000),
        (RET, 0, 0, KILL),
    ]
    for n in numbers:
        prog += [(JEQ, 0, 1, n), (RET, 0, 0, ERRNO | EPERM)]
    prog += [(JEQ, 0, 1, special["clone3"]), (RET, 0, 0, ERRNO | ENOSYS)]
    # prlimit64(pid, ...): pid 0 (this process) only; args[0] is at offset 16 (low half) and 20 (high half)
    prog += [
        (JEQ, 0, 6, special["prlimit64"]),
        (LD, 0, 0, 16),
        (JEQ, 0, 2, 0),
        (LD, 0, 0, 20),
        (JEQ, 1, 0, 0),
        (RET, 0, 0, ERRNO | EPERM),
        (RET, 0, 0, ALLOW),
    ]
    prog += [
        (LD, 0, 0, 0),
        (JEQ, 0, 3, special["clone"]),
        (LD, 0, 0, 16),
        (JSET, 0, 1, CLONE_NEW_ANY),
        (RET, 0, 0, ERRNO | EPERM),
    ]
    prog += [(LD, 0, 0, 0), (JEQ, 0, len(families) + 2, special["socket"]), (LD, 0, 0, 16)]
    prog += [(JEQ, len(families) - i, 0, family) for i, family in enumerate(families)]
    prog += [(RET, 0, 0, ERRNO | EPERM)]
    prog += [(RET, 0, 0, ALLOW)]
    return b"".join(struct.pack("HBBI", *ins) for ins in prog)


def seccomp(inet: bool = False) -> None:
    """no_new_privs (no set-user-ID program can raise privileges again), then the filter; both hold for
    every process the program starts. `inet`: IPv4 sockets allowed too (in a network namespace of loopback only)."""
    machine = os.uname().machine
    if machine not in NUMBERS:
        raise OSError(f"no system call table for {machine}")
    code = _filter(*NUMBERS[machine], families=(AF_UNIX, AF_INET) if inet else (AF_UNIX,))
    _check(_libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "no_new_privs")
    buf = ctypes.create_string_buffer(code, len(code))
    fprog = struct.pack("HxxxxxxQ", len(code) // 8, ctypes.addressof(buf))
    _check(_libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.c_char_p(fprog), 0, 0), "seccomp")
