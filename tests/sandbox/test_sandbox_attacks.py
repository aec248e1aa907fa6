"""reward=code's sandbox against hostile programs (scripts/sandbox_attacks.py holds them: writes outside,
reads of a planted secret, signals and limits on the trainer, stdio sabotage, forged passes, fork and
memory bombs, native code run through a shell the audit hook never sees, and escapes from the kill):
every one is contained with isolation "os". The weaker reward.sandbox=process lets some through, which
shows the checks can fail; so does the control that runs a harmful program with no sandbox at all."""

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import sandbox_attacks as attacks  # noqa: E402

from grpo_cli.errors import GrpoError  # noqa: E402
from grpo_cli.sandbox.program import Sandbox  # noqa: E402


@pytest.fixture(scope="module")
def ctx():
    try:
        Sandbox(1, 256, 64, 16).check()
    except GrpoError as e:
        pytest.skip(f"the kernel refuses the sandbox's namespaces here: {e}")
    with tempfile.TemporaryDirectory(prefix="grpo-attacks-") as base:
        os.chmod(base, 0o755)
        context = attacks.context(Path(base))
        yield context
        attacks.close(context)


def test_the_suite_has_at_least_100_attacks_covering_every_kind():
    groups = {group for group, _, _ in attacks.ATTACKS}
    assert len(attacks.ATTACKS) >= 100
    assert groups == {"write", "native", "read", "harm", "stdio", "forge", "bomb", "kill", "leftover"}
    assert len({name for _, name, _ in attacks.ATTACKS}) == len(attacks.ATTACKS)
    assert SLOW <= {name for _, name, _ in attacks.ATTACKS}


# Attacks that last until the test's deadline or sleep on purpose (2-5 s each) run in the slow lane.
SLOW = {
    "a file outside made by a daemon later",
    "a daemon started at the deadline",
    "sleep forever",
    "shell fork bomb",
    "thread bomb",
    "a full pipe",
    "SIGTERM ignored",
    "stdin read without end",
    "zip bomb",
    "recursion past the C stack",
    "deeply nested directories",
}


@pytest.mark.parametrize(
    "index",
    [
        pytest.param(i, marks=[pytest.mark.slow] if name in SLOW else [], id=f"{group}: {name}")
        for i, (group, name, _) in enumerate(attacks.ATTACKS)
    ],
)
def test_every_attack_is_contained(ctx, index):
    group, name, program = attacks.ATTACKS[index]
    outcome, detail = attacks.run_one(group, name, program, ctx, "os", f"{70 + index % 9}.{4000 + index}")
    assert outcome == "contained", f"{group} / {name}: {outcome} ({detail})"


@pytest.mark.parametrize(
    "name, outcome",
    [
        ("dir_fd", "escaped"),
        ("a shell the hook never sees", "escaped"),
        ("a root-only file", "leaked"),
        ("the dataset file", "leaked"),
        ("the expected value from the dataset", "forged"),
        ("a daemon in a session of its own", "left behind"),
    ],
)
def test_the_checks_can_fail_without_the_kernel_s_isolation(ctx, name, outcome):
    """reward.sandbox=process, as root: the audit hook alone misses these, and the checks say so."""
    if os.geteuid() != 0:
        pytest.skip("as another user the process mode cannot read the root-only file either")
    index, (group, _, program) = next((i, a) for i, a in enumerate(attacks.ATTACKS) if a[1] == name)
    assert attacks.run_one(group, name, program, ctx, "process", f"{70 + index % 9}.{5000 + index}")[0] == outcome


@pytest.mark.parametrize(
    "name",
    [
        "prlimit NOFILE",
        "renice",
        "a forged line on the trainer's stdout",
        pytest.param("SIGSTOP the trainer", marks=pytest.mark.slow),
    ],
)  # waits out its deadline
def test_the_harm_check_sees_an_unsandboxed_attack(ctx, name):
    program = next(p for _, n, p in attacks.ATTACKS if n == name)
    fill = {k: v for k, v in ctx.items() if not k.startswith("_")}
    outcome = attacks._harm(program, {**fill, "marker": "1"}, "none")
    assert outcome is not None and outcome[0] == "harmed", outcome


def unprivileged_user() -> str:
    """A user of no privilege, made if missing (the caller is root and has checked for useradd)."""
    user = "grpo-sandbox-test"
    if subprocess.run(["id", user], capture_output=True).returncode:
        made = subprocess.run(
            ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", user], capture_output=True
        )
        if made.returncode:
            pytest.skip(f"useradd failed: {made.stderr.decode().strip()}")
    return user


def test_as_an_unprivileged_user_the_program_cannot_read_a_root_only_file(tmp_path):
    """The sandbox started by a user of no privilege (made here), with the system's Python: a root-only
    file is out of reach there as for root's trainer (test_every_attack_is_contained)."""
    if os.geteuid() != 0:
        pytest.skip("making a user needs root")
    if not shutil.which("setpriv") or not shutil.which("useradd"):
        pytest.skip("setpriv and useradd (util-linux, passwd) are needed to run the sandbox as another user")
    python = "/usr/bin/python3"
    if (
        not os.path.exists(python)
        or subprocess.run([python, "-c", "import sys; assert sys.version_info >= (3, 10)"]).returncode
    ):
        pytest.skip("no system Python 3.10+ that another user can run")
    user = unprivileged_user()
    secret = tmp_path / "root-only"
    secret.write_text("grpo-secret-0123456789abcdef")
    secret.chmod(0o600)
    os.chmod(tmp_path, 0o755)
    repo = str(Path(__file__).resolve().parents[2])
    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); from grpo_cli.sandbox.program import Sandbox\n"
        "s = Sandbox(1, 256, 64, 16)\ns.check()\n"
        "program = 'try:\\n    print(open(%r).read())\\nexcept OSError as e:\\n    print(type(e).__name__)' % "
        "sys.argv[2]\n"
        "print(s.run(program, ('io', '', 'grpo-secret-0123456789abcdef\\n'))[0], "
        "s.run(program, ('io', '', 'FileNotFoundError\\n'))[0])"
    )
    run = subprocess.run(
        ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups", python, "-c", script, repo, str(secret)],
        capture_output=True,
        text=True,
        cwd="/",
    )
    if "cannot run here" in run.stderr:
        pytest.skip(f"the kernel refuses user namespaces to unprivileged users here: {run.stderr.strip()[-200:]}")
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "True"]  # not read; not even there


@pytest.mark.parametrize(
    "machine, header",
    [("x86_64", "/usr/include/x86_64-linux-gnu/asm/unistd_64.h"), ("aarch64", "/usr/include/asm-generic/unistd.h")],
)
def test_the_filter_s_system_call_numbers_are_the_kernel_headers(machine, header):
    """The seccomp table's numbers against the machine's kernel headers (linux-libc-dev), arm64's too, which
    no test here can run: every call the header names has the number the table holds; one it lacks (newer
    than the header, or absent on that architecture) is listed, not guessed."""
    import re

    from grpo_cli.sandbox.namespaces import NUMBERS

    if not os.path.exists(header):
        pytest.skip(f"{header} is not installed (the linux-libc-dev package holds it)")
    text = Path(header).read_text()
    defined = {m.group(1): int(m.group(2)) for m in re.finditer(r"#define __NR(?:3264)?_(\w+)\s+(\d+)", text)}
    _, refused, special = NUMBERS[machine]
    table = {**refused, **special}
    wrong = {name: (n, defined[name]) for name, n in table.items() if name in defined and n != defined[name]}
    assert wrong == {}
    absent_there = {name for name, n in table.items() if n is None}
    assert absent_there.isdisjoint(defined)  # a call the table says the architecture lacks is not in its header
    assert len([name for name in table if name in defined]) >= len(table) // 2  # the header is not some other file
