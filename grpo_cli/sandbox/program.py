"""One program run against one test under the limits and, with isolation "os", in namespaces of its own with a
read-only view of the runtime, no privileges and a seccomp filter (child.py, namespaces.py); and the scratch
directories the tests write in, removed whatever the program did to them, and swept at the next start where a
killed process left them. docs/sandbox.md has the threat model."""

from __future__ import annotations

import marshal
import os
import secrets
import select
import signal
import stat
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from grpo_cli.errors import GrpoError
from grpo_cli.sandbox.scratch import reap_when_gone, remove_tree, scratch_prefix, sweep_stale

CHILD = Path(__file__).with_name("child.py")
NOBODY = 65534


def text_of(v) -> str:
    return "\n".join(map(str, v)) + "\n" if isinstance(v, list) else str(v)


def _same_output(got: str, want: str) -> bool:
    strip = lambda s: [line.rstrip() for line in s.strip().splitlines()]  # noqa: E731
    return strip(got) == strip(want)


def nobody_can_run_python() -> bool:
    """Whether `nobody` could run this interpreter's standard library where it lies: every directory above
    it searchable by others (not so under /root, where pyenv puts it). Isolation "os" shows the runtime in
    a view of its own, whose directories are searchable, so there only the library's own modes count."""
    path = Path(os.__file__).resolve().parent
    for d in [path, *path.parents]:
        if not d.stat().st_mode & stat.S_IXOTH:
            return False
    return bool(path.stat().st_mode & stat.S_IROTH)


_WORKS: set[tuple] = set()  # the settings Sandbox.check has seen a test pass with, in this process


class Sandbox:
    """Runs one program against one test under the limits (sandbox/child.py), with isolation "os"
    (namespaces, a read-only view, seccomp: sandbox/namespaces.py) or "process" (without them)."""

    def __init__(self, cpu_s: float, memory_mib: int, output_kib: int, processes: int, isolation: str = "os"):
        root = os.getuid() == 0
        self.settings: dict[str, Any] = {
            "cpu_s": max(1, int(cpu_s + 0.999)),
            "memory_bytes": int(memory_mib) * 2**20,
            "file_bytes": int(output_kib) * 2**10,
            "processes": int(processes),
            "isolation": isolation,
            "drop_user": root and (isolation == "os" or nobody_can_run_python()),
        }
        self.wall_s = 2 * cpu_s + 1
        sweep_stale()

    def check(self) -> None:
        """Stop with one sentence when a program cannot run here as configured (the kernel refuses a
        namespace or the filter, or `nobody` cannot read the Python runtime)."""
        key = tuple(sorted(self.settings.items()))
        if key in _WORKS:  # the data check ran it before the model loaded; the reward's build asks again
            return
        ok, err = self.run("print(2 + 2)", ("io", "", "4\n"))
        if ok:
            _WORKS.add(key)
            return
        why = err.strip().splitlines()[-1] if err.strip() else "a test printing 4 did not pass"
        if "grpo-sandbox:" in err:
            raise GrpoError(
                f"The code sandbox cannot run here ({why}); run where the kernel allows user namespaces "
                "(sysctl kernel.unprivileged_userns_clone=1, or a container with --privileged or "
                "seccomp=unconfined), or accept weaker isolation with reward.sandbox=process."
            )
        raise GrpoError(
            f"The code sandbox cannot run a test program here ({why}); make the Python installation "
            f"readable by others (chmod -R o+rX {os.path.realpath(sys.base_prefix)}), since tests run as "
            "a user of no privilege, or set reward.sandbox=process."
        )

    def passes(self, program: str, kind: str, given: str, want) -> bool:
        return self.run(program, (kind, given, want))[0]

    def run(self, program: str, test: tuple) -> tuple[bool, str]:
        """Whether `program` passes `test`, and what it wrote to stderr."""
        kind, given, want = test
        reap_when_gone()  # this process's directories go once it has ended, SIGKILL included (scratch.py)
        home = tempfile.mkdtemp(prefix=scratch_prefix(os.getpid()))
        try:
            work = os.path.join(home, "work")
            os.mkdir(work)
            os.mkdir(os.path.join(home, "root"))  # the view's mount point (isolation "os")
            (Path(work) / "program.py").write_text(program)
            if self.settings["drop_user"]:
                os.chown(home, NOBODY, NOBODY)
                os.chown(work, NOBODY, NOBODY)
            header = {"kind": kind}
            if kind == "assert":
                header.update(source=given, token=secrets.token_hex(16))
            elif kind == "judged":  # the pieces go to the sandbox; the assertions stay here
                header.update(imports=want.imports, pieces=want.pieces)
            stdin = marshal.dumps(header).hex() + "\n" + (given if kind == "io" else "")
            settings = {**self.settings, "parent": os.getpid(), "root": os.path.join(home, "root")}
            got, err = self._launch(home, work, settings, stdin)
            if got is None:
                return False, err
            if kind == "assert":
                return got.rstrip("\n").rsplit("\n", 1)[-1] == header["token"], err
            return (want.passes(got) if kind == "judged" else _same_output(got, want)), err
        finally:
            remove_tree(home)

    def _launch(self, home: str, work: str, settings: dict, stdin: str) -> tuple[str | None, str]:
        """The child's stdout (None when it failed or ran out of time) and stderr. Both are read back through
        the descriptors opened here, in a directory the program does not see (isolation "os")."""
        with (
            open(os.path.join(home, "stdin"), "w+b") as given,
            open(os.path.join(home, "stdout"), "w+b") as out,
            open(os.path.join(home, "stderr"), "w+b") as err,
        ):
            given.write(stdin.encode())
            given.seek(0)
            arguments = [f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in settings.items()]
            proc = subprocess.Popen(
                [sys.executable, "-I", "-S", str(CHILD), *arguments],
                cwd=work,
                env={"PATH": "/usr/bin:/bin", "LANG": "C.UTF-8", "TMPDIR": work},
                stdin=given,
                stdout=out,
                stderr=err,
                start_new_session=True,
            )
            try:
                late = not _ended_within(proc, self.wall_s)  # a test that outlives the wall clock fails
            finally:
                _kill_group(proc)
            err.seek(0)
            message = err.read(4096).decode(errors="replace")
            if late or proc.returncode != 0:
                return None, message
            out.seek(0)
            return out.read(self.settings["file_bytes"] + 1).decode(errors="replace"), message


def _ended_within(proc: subprocess.Popen, seconds: float) -> bool:
    """Wait for the process to end, up to `seconds`: on its pidfd, which wakes the moment it ends (Popen's
    own wait with a timeout polls, and cost each test up to 50 ms for nothing)."""
    try:
        fd = os.pidfd_open(proc.pid)
    except (AttributeError, OSError):  # not Linux 5.3+
        try:
            proc.wait(seconds)
            return True
        except subprocess.TimeoutExpired:
            return False
    try:
        return bool(select.select([fd], [], [], seconds)[0])
    finally:
        os.close(fd)


def _kill_group(proc: subprocess.Popen) -> None:
    """The test's whole process group, whatever it started, and the test itself reaped; then up to a second
    for the rest of the group (the program, in its PID namespace, is not this process's child) to be gone."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:  # already gone, every member
        pass
    proc.wait()
    for _ in range(100):
        try:
            os.killpg(proc.pid, 0)
        except (ProcessLookupError, PermissionError):
            return
        time.sleep(0.01)
