"""The sandbox's first code, run as `python -I -S sandbox/child.py KEY=VALUE ...` in a fresh scratch directory
(rewards/code.py): it confines its own process, then runs the model's program.

How it works in detail: docs/internals.md, grpo_cli/sandbox/child.py.
"""

import marshal
import os
import resource
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import namespaces  # noqa: E402 - namespaces.py, beside this file (-I leaves it off the path)

del sys.path[0]  # the program imports from the standard library only

CLONE_NEWNET = 0x40000000
NOBODY = namespaces.NOBODY
WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
MARK = b"\x00grpo-values "  # as rewards/code_verdict.MARK
REFUSED_EXIT = 71  # the kernel refused a confinement: the trainer names it at start (reward.sandbox=process)


def limit(settings: dict) -> None:
    cpu, memory, size = settings["cpu_s"], settings["memory_bytes"], settings["file_bytes"]
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 1))
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, size))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    if settings["drop_user"]:
        namespaces.become(settings.get("uid", NOBODY))
    resource.setrlimit(resource.RLIMIT_NPROC, (settings["processes"], settings["processes"]))


def refused(what: str, e: BaseException) -> None:
    os.write(2, f"grpo-sandbox: {what} refused: {e}\n".encode())
    os._exit(REFUSED_EXIT)


def confine(settings: dict) -> None:
    """Everything before the program's first line: namespaces and the filesystem view (isolation "os"; a
    network namespace where allowed otherwise), limits and user, no capabilities, the system call filter."""
    if settings["isolation"] == "os":
        if settings["drop_user"]:
            settings["uid"] = namespaces.own_uid()  # before the namespace: this pid is unique on the machine's side
        try:
            namespaces.namespaces()
            namespaces.first_process()
            owner = settings["uid"] if settings["drop_user"] else os.getuid()
            namespaces.view(
                settings["root"],
                os.getcwd(),
                [os.path.realpath(sys.base_prefix)],
                owner,
                max(4 * settings["file_bytes"], 2**20),
            )
        except OSError as e:
            refused("a namespace or the filesystem view", e)
    elif sys.platform == "linux":
        namespaces._libc.unshare(CLONE_NEWNET)  # -1 without the right: then the audit hook alone refuses sockets
    limit(settings)
    namespaces.die_with_parent(
        0 if settings["isolation"] == "os" else settings["parent"]
    )  # a change of user cleared it
    try:
        if settings["isolation"] == "os":
            namespaces.drop_capabilities()
            namespaces.seccomp()
        elif sys.platform == "linux":
            try:
                namespaces.seccomp()
            except OSError:  # no table for this machine: isolation "process" goes without, as chosen
                pass
    except OSError as e:
        refused("the system call filter", e)


def read_header() -> dict:
    """The test's first line on stdin (the trainer's marshal, in hex), read byte by byte so the program
    reads what follows from its start."""
    line = b""
    while not line.endswith(b"\n"):
        byte = os.read(0, 1)
        if not byte:
            break
        line += byte
    return marshal.loads(bytes.fromhex(line.decode()))


def read_settings(argv: list[str]) -> dict:
    """`key=value` arguments (strings, or integers where they parse) as the trainer wrote them."""
    settings = dict(a.split("=", 1) for a in argv)
    return {k: int(v) if v.lstrip("-").isdigit() else v for k, v in settings.items()}


def encode(v):
    """A value as tagged plain data that the trainer decodes (rewards/code_verdict.decode); only builtin
    types, exactly: anything else raises, and the piece counts as raised."""
    t = type(v)
    if v is None or t in (bool, int, str):
        return v
    if t is float:
        return {"f": float.__repr__(v)}
    if t is complex:
        return {"c": [float.__repr__(v.real), float.__repr__(v.imag)]}
    if t is bytes:
        return {"b": v.hex()}
    if t is range:
        return {"r": [v.start, v.stop, v.step]}
    tags = {list: "l", tuple: "t", set: "s", frozenset: "F"}
    if t in tags:
        return {tags[t]: [encode(x) for x in v]}
    if t is dict:
        return {"d": [[encode(k), encode(x)] for k, x in v.items()]}
    if hasattr(t, "__next__"):
        return {"i": [encode(x) for x in v]}
    raise TypeError(f"a {t.__name__} is not plain data")


def values(pieces: list[str], namespace: dict) -> bytes:
    """Each piece's value, encoded, as one line of Python literals (the trainer reads it with
    ast.literal_eval, which evaluates nothing); a piece that raises is recorded as raised."""
    out = []
    for piece in pieces:
        try:
            out.append(repr(encode(eval(piece, namespace))))  # an int past Python's digit limit raises here too
        except BaseException as e:  # noqa: BLE001 - SystemExit too: the assertion fails, as in Python
            out.append(repr({"raised": type(e).__name__}))
    return MARK + ("[" + ", ".join(out) + "]").encode(errors="backslashreplace") + b"\n"


def audit(home: str):
    """The hook: refuse what a test program has no business doing."""
    home = os.path.realpath(home)
    refused = (
        "socket.",
        "subprocess.",
        "os.fork",
        "os.forkpty",
        "os.posix_spawn",
        "os.spawn",
        "os.exec",
        "os.system",
        "os.kill",
        "os.killpg",
        "ctypes.",
        "pty.",
        "os.chmod",
        "os.chown",
        "os.link",
        "os.symlink",
    )

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
    settings = read_settings(sys.argv[1:])
    namespaces.die_with_parent(settings["parent"])
    test = read_header()
    with open("program.py") as f:  # read before the program can change it
        source = f.read()
    confine(settings)
    sys.addaudithook(audit(os.getcwd()))
    code = compile(source, "program.py", "exec")
    check = compile(test["source"], "test", "exec") if test["kind"] == "assert" else None
    namespace = {"__name__": "__main__", "__builtins__": __builtins__}
    pieces, imports, token = test.get("pieces"), test.get("imports", []), test.get("token")
    del test
    exec(code, namespace)
    if check is not None:
        exec(check, namespace)
        sys.stdout.write(f"{token}\n")
    if pieces is not None:
        for line in imports:
            exec(line, namespace)
        sys.stdout.flush()
        os.write(1, b"\n" + values(pieces, namespace))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
