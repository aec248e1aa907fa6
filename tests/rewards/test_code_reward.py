"""reward=code: the share of a row's tests passed by the completion's program, each test in a sandboxed
process. A correct program scores 1; programs that loop, fork without end, eat memory, write outside
their directory, open a connection or print 100 MB each score 0, and leave the machine as it was: no
file outside the sandbox, no process left running, no sandbox directory left behind."""

import functools
import glob
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
from sandbox_attacks import SPAWN, processes_with  # noqa: E402 - the processes whose command line holds a marker

from grpo_cli.config import RewardConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rewards import build_reward
from grpo_cli.rewards.code import extract_program, parse_tests
from grpo_cli.sandbox.program import CHILD
from grpo_cli.sandbox.scratch import scratch_prefix

ADD_IO = [
    {"input": "3 4\n", "output": "7\n"},
    {"input": "10 -2\n", "output": "8\n"},
    {"input": "0 0\n", "output": "0\n"},
]
ADD_ASSERTS = ["assert add(1, 2) == 3", "assert add(-1, 1) == 0", "assert add(5, 5) == 10"]


def fenced(program: str) -> str:
    return f"Here is my program:\n```python\n{program}\n```\nIt reads the input."


@functools.cache
def isolation() -> str:
    """ "os" where the kernel allows the sandbox's namespaces; else "process", which the tests below that
    need "os" skip, saying why, and the others run with."""
    from grpo_cli.sandbox.program import Sandbox

    try:
        Sandbox(1, 256, 64, 16).check()
    except GrpoError:
        return "process"
    return "os"


def code_reward(**settings):
    return build_reward(
        RewardConfig(
            name="code", code_cpu_s=1.0, code_memory_mib=256, code_output_kib=64, **{"sandbox": isolation(), **settings}
        )
    )


def skip_without_os_isolation() -> None:
    if isolation() != "os":
        pytest.skip("the kernel refuses the sandbox's namespaces here (Sandbox.check says which)")


def score(reward, programs: list[str], tests) -> list[float]:
    total, _ = reward.score(
        ["p"] * len(programs),
        [fenced(p) for p in programs],
        [""] * len(programs),
        columns={"tests": [tests] * len(programs)},
    )
    return total


def sandbox_processes() -> list[str]:
    """Processes still running the sandbox's harness for this process (not another test process's)."""
    found = []
    for cmdline in glob.glob("/proc/[0-9]*/cmdline"):
        try:
            text = Path(cmdline).read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:  # a process that ended while being listed
            continue
        if str(CHILD) in text and f"parent={os.getpid()} " in text:  # the harness, by its path: a rename follows
            found.append(text)
    return found


def test_the_process_finder_sees_a_running_harness():
    """The control for "left processes running" below: while a program runs, sandbox_processes finds it."""
    import threading

    worker = threading.Thread(target=score, args=(code_reward(), ["import time\ntime.sleep(1.5)"], ADD_IO))
    worker.start()
    seen = False
    while worker.is_alive() and not seen:
        seen = bool(sandbox_processes())
        time.sleep(0.05)
    worker.join()
    assert seen and sandbox_processes() == []


def test_a_correct_program_scores_1_and_a_partly_right_one_its_share():
    reward = code_reward()
    right = "a, b = map(int, input().split())\nprint(a + b)"
    half = "a, b = map(int, input().split())\nprint(abs(a) + abs(b))"  # right on 2 of the 3
    assert score(reward, [right, half, "print(7)"], ADD_IO) == [1.0, pytest.approx(2 / 3), pytest.approx(1 / 3)]
    good, bad = "def add(a, b):\n    return a + b", "def add(a, b):\n    return a * b"
    assert score(reward, [good, bad], ADD_ASSERTS) == [1.0, 0.0]  # 1*2 != 3, -1*1 != 0, 5*5 != 10


def test_tests_may_be_apps_style_or_a_json_string():
    reward = code_reward()
    apps = {"inputs": ["3 4\n", "1 1\n"], "outputs": ["7\n", "2\n"]}
    right = "a, b = map(int, input().split())\nprint(a + b)"
    assert score(reward, [right], apps) == [1.0]
    assert score(reward, [right], json.dumps(ADD_IO)) == [1.0]


@pytest.mark.parametrize(
    "name, program",
    [
        ("an infinite loop", "while True:\n    pass"),
        ("a sleep past the wall clock", "import time\ntime.sleep(1000)"),
        ("a fork bomb", "import os\nwhile True:\n    os.fork()"),
        (
            "a fork bomb through subprocess",
            "import subprocess, sys\nwhile True:\n    subprocess.Popen([sys.executable, '-c', 'pass'])",
        ),
        ("a memory bomb", "hoard = []\nwhile True:\n    hoard.append(bytearray(10**7))"),
        ("a write outside its directory", "open({escape!r}, 'w').write('escaped')\nprint(7)"),
        ("a network connection", "import socket\nsocket.create_connection(('127.0.0.1', 9), timeout=1)\nprint(7)"),
        ("a 100 MB print", "import sys\nsys.stdout.write('7\\n' * 50_000_000)"),
        ("native code", "import ctypes\nctypes.CDLL(None).system(b'true')\nprint(7)"),
    ],
)
def test_a_hostile_program_scores_0_and_leaves_the_machine_as_it_was(name, program, tmp_path):
    escape = tmp_path / "escaped.txt"
    program = program.format(escape=str(escape))
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), scratch_prefix(os.getpid()) + "*")))
    start = time.monotonic()
    total = score(code_reward(), [program], [{"input": "", "output": "7\n"}])
    assert total == [0.0], name
    assert time.monotonic() - start < 10, f"{name}: one test is bounded by 2 x code_cpu_s + 1 s"
    assert not escape.exists() and not glob.glob("/tmp/grpo-escaped*")
    assert sandbox_processes() == [], f"{name} left processes running"
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), scratch_prefix(os.getpid()) + "*"))) <= before, (
        "a sandbox directory was left"
    )


def test_the_program_is_the_last_fenced_block_or_what_precedes_a_closing_fence():
    assert extract_program("```python\nx = 1\n```\ntext\n```py\nprint(2)\n```") == "print(2)\n"
    assert extract_program("print(3)\n```\nthat was it") == "print(3)\n"  # the prompt opened the block
    assert extract_program("print(4)") == "print(4)"


def test_bad_tests_are_named_with_the_row_and_the_fix():
    with pytest.raises(GrpoError, match=r"Row 3's tests holds 5, not a test"):
        parse_tests([5], 3, "tests")
    with pytest.raises(GrpoError, match=r"Row 0's tests is empty"):
        parse_tests([], 0, "tests")
    reward = code_reward(tests_field="cases")
    with pytest.raises(
        GrpoError, match=r"dataset column 'cases', which this data does not have .*set reward.tests_field"
    ):
        score(reward, ["print(1)"], ADD_IO)


def test_every_built_in_code_problems_reference_program_passes_its_tests_in_the_sandbox():
    from grpo_cli.data.code_tasks import code_problems

    data = code_problems()
    rows = [r for split in ("train", "test") for r in data[split]]
    assert len(rows) == 62 and len({r["prompt"] for r in rows}) == 62
    assert not {r["prompt"] for r in data["test"]} & {r["prompt"] for r in data["train"]}
    reward = code_reward()
    total, _ = reward.score(
        [r["prompt"] for r in rows],
        [fenced(r["answer"]) for r in rows],
        [""] * len(rows),
        columns={"tests": [r["tests"] for r in rows]},
    )
    assert total == [1.0] * len(rows)
    wrong, _ = reward.score([rows[0]["prompt"]], [fenced("print(0)")], [""], columns={"tests": [rows[0]["tests"]]})
    assert wrong[0] < 1.0


# A daemon in a session of its own, started by a primitive the audit hook does not see (_posixsubprocess,
# Python 3.11's signature): the kill of the test's process group cannot reach it; its PID namespace can.
DAEMON = (
    "import _posixsubprocess, os\nr, w = os.pipe()\n_posixsubprocess.fork_exec([b'/bin/sleep', b'%d.%d' % {parts}], "
    "[b'/bin/sleep'], True, (w,), None, None, -1, -1, -1, -1, -1, -1, r, w, True, True, -1, None, None, None, "
    "-1, None, False)\nprint(7)"
)


def daemon(marker: str) -> str:
    """DAEMON sleeping `marker` seconds ("61.4041"), the number not spelled out in the program's own text."""
    return DAEMON.replace("{parts}", "(%s, %s)" % tuple(marker.split(".")))


def wait_gone(marker: str, seconds: float) -> list[int]:
    deadline = time.monotonic() + seconds
    while processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    return processes_with(marker)


def test_a_daemon_the_program_starts_in_a_session_of_its_own_dies_with_the_test():
    """The escape works outside the sandbox (so the check below can fail); inside, the program is its PID
    namespace's first process, and the daemon dies when the test ends."""
    import subprocess
    import sys

    skip_without_os_isolation()
    marker = "61.4041"
    subprocess.run(
        [sys.executable, "-c", daemon(marker)], check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.monotonic() + 5
    while not processes_with(marker) and time.monotonic() < deadline:  # the daemon execs a moment later
        time.sleep(0.05)
    escaped = processes_with(marker)
    for pid in escaped:
        os.kill(pid, 9)
    assert escaped, "the daemon primitive did not start a daemon outside the sandbox"
    marker = "61.4042"
    assert score(code_reward(), [daemon(marker)], [{"input": "", "output": "7\n"}]) == [1.0]
    assert wait_gone(marker, 2) == [], "the program's daemon outlived its test"


def test_a_trainer_killed_mid_test_leaves_no_process_and_no_directory(tmp_path):
    """A process scoring a program that sleeps is SIGKILLed mid-test: within 5 s no process of the test (nor
    the daemon it started) is left, and its reaper has removed the test's directory and ended; the next
    sandbox to start sweeps what a killed reaper would have left."""
    import signal
    import subprocess
    import sys

    from grpo_cli.sandbox.program import Sandbox

    marker = "62.4043"
    program = daemon(marker).replace("print(7)", "import time\ntime.sleep(30)")
    trainer = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\nfrom grpo_cli.sandbox.program import Sandbox\n"
            "Sandbox(20, 256, 64, 16).passes(sys.argv[1], 'io', '', '7')",
            program,
        ]
    )
    deadline = time.monotonic() + 30
    while not processes_with(marker) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert processes_with(marker), "the test never started"
    left = glob.glob(os.path.join(tempfile.gettempdir(), scratch_prefix(trainer.pid) + "*"))
    trainer.send_signal(signal.SIGKILL)
    trainer.wait(10)
    assert wait_gone(f"parent={trainer.pid}\0", 5) == [], "the test outlived its trainer"
    assert wait_gone(marker, 5) == [], "the test's daemon outlived its trainer"
    assert left, "the test had no directory"
    reaper = f"grpo_cli.sandbox.scratch\0{trainer.pid}\0"
    assert wait_gone(reaper, 5) == [], "the trainer's reaper outlived its work"
    assert not any(os.path.exists(d) for d in left), "a dead process's sandbox directory was left behind"
    stale = tempfile.mkdtemp(prefix=scratch_prefix(trainer.pid))  # as a killed reaper would leave it
    Sandbox(1, 256, 64, 16)
    assert not os.path.exists(stale), "the next start did not sweep a dead process's directory"


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can make a file immutable (chattr +i)")
def test_a_file_the_program_makes_immutable_does_not_keep_its_directory():
    """With reward.sandbox=process as root, where the interpreter is under /root (so `nobody` cannot run
    it and the program keeps its user), a program can set a file's immutable flag; the directory is still
    removed. (With isolation "os" it runs as nobody, which cannot.)"""
    program = (
        "import fcntl, os, struct\nfd = os.open('stuck', os.O_CREAT | os.O_WRONLY)\n"
        "fcntl.ioctl(fd, 0x40086602, struct.pack('i', 0x10))\nprint(7)"
    )
    before = set(glob.glob(os.path.join(tempfile.gettempdir(), scratch_prefix(os.getpid()) + "*")))
    score(code_reward(sandbox="process"), [program], [{"input": "", "output": "7\n"}])
    assert set(glob.glob(os.path.join(tempfile.gettempdir(), scratch_prefix(os.getpid()) + "*"))) <= before


def test_after_100_tests_with_timeouts_no_process_or_directory_is_left():
    """100 sandboxed tests (right, wrong, raising, and 4 past the wall clock): nothing of theirs left."""
    programs = (["print(7)", "print(8)", "raise SystemExit(3)"] * 32)[:96] + ["while True:\n    pass"] * 4
    totals = score(code_reward(), programs, [{"input": "", "output": "7\n"}])
    assert totals == [1.0 if p == "print(7)" else 0.0 for p in programs]
    assert wait_gone(f"parent={os.getpid()}\0", 2) == []
    assert glob.glob(os.path.join(tempfile.gettempdir(), scratch_prefix(os.getpid()) + "*")) == []


def test_the_program_sees_no_other_process_and_cannot_read_another_s_environment():
    """A secret in the environment of a process of this machine (the trainer's, say), read through
    /proc/<pid>/environ: the same program reads it outside the sandbox (so the check can fail); inside, its
    /proc is its namespace's own, and it lists one process, itself."""
    import subprocess
    import sys

    skip_without_os_isolation()
    victim = subprocess.Popen(["sleep", "30"], env={"GRPO_PLANTED_SECRET": "s3cr3t-4077"})
    try:
        program = (
            f"import os\ntry:\n    leak = open('/proc/{victim.pid}/environ', 'rb').read()\nexcept OSError:\n"
            "    leak = b''\nprint('leak' if b's3cr3t-4077' in leak else "
            "len([p for p in os.listdir('/proc') if p.isdigit()]))"
        )
        outside = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True).stdout.strip()
        assert outside == "leak", outside
        assert score(code_reward(), [program], [{"input": "", "output": "1\n"}]) == [1.0]
    finally:
        victim.kill()
        victim.wait()


def test_as_root_each_test_runs_as_a_user_of_its_own_whose_process_limit_is_its_own():
    """The limit of 8 processes binds (a test starting 10 fails), and counts one test's processes alone: two
    tests at once each start 4 children beside 6 processes of `nobody` running outside, which under one shared
    user (`nobody`, as before) would be 6 + 2 x 5 = 16 processes of one user. Each runs as an id of its own,
    neither root's nor nobody's."""
    import subprocess
    from concurrent.futures import ThreadPoolExecutor

    from grpo_cli.sandbox.namespaces import NOBODY, OWN_IDS
    from grpo_cli.sandbox.program import Sandbox

    skip_without_os_isolation()
    if os.getuid() != 0 or not shutil.which("setpriv"):
        pytest.skip("needs root (as another user a test keeps that user's id) and setpriv (util-linux)")
    sandbox = Sandbox(5, 256, 64, 8)
    program = SPAWN + (
        "import sys, time\nfor _ in range(int(sys.stdin.read())):\n    spawn('/bin/sleep', '1')\n"
        f"time.sleep(0.5)\nprint('ok', os.getuid() >= {OWN_IDS} and os.getuid() == os.getgid())"
    )
    outsiders = [
        subprocess.Popen(["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "sleep", "20"])
        for _ in range(6)
    ]
    try:
        time.sleep(0.2)
        with ThreadPoolExecutor(2) as pool:
            runs = list(pool.map(lambda _: sandbox.run(program, ("io", "4", "ok True\n")), range(2)))
        too_many = sandbox.run(program, ("io", "10", "ok True\n"))
    finally:
        for p in outsiders:
            p.kill()
            p.wait()
    assert runs == [(True, ""), (True, "")], runs
    assert not too_many[0] and "Resource temporarily unavailable" in too_many[1], too_many


def test_as_an_unprivileged_user_the_process_limit_counts_the_test_s_processes_alone():
    """Run by a user of no privilege who has 12 processes running already, a test under a limit of 8 still
    starts 4 children (Linux 5.14+ counts the limit per user namespace), and one starting 10 fails."""
    import subprocess

    skip_without_os_isolation()
    if os.getuid() != 0 or not shutil.which("setpriv") or not shutil.which("useradd"):
        pytest.skip("needs root to make the user, and setpriv and useradd")
    if not os.path.exists("/usr/bin/python3"):
        pytest.skip("no system Python that another user can run")
    if tuple(int(part) for part in os.uname().release.split("-")[0].split(".")[:2]) < (5, 14):
        pytest.skip("kernels before 5.14 count the process limit per user, not per user namespace")
    from test_sandbox_attacks import unprivileged_user

    from helpers import REPO

    user = unprivileged_user()
    as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"]
    script = (
        "import sys; sys.path[:0] = sys.argv[1:3]\nfrom grpo_cli.sandbox.program import Sandbox\n"
        "from sandbox_attacks import SPAWN\ns = Sandbox(5, 256, 64, 8)\ns.check()\n"
        "p = SPAWN + \"import sys, time\\nfor _ in range(int(sys.stdin.read())):\\n    spawn('/bin/sleep', '1')\\n"
        "time.sleep(0.5)\\nprint('ok')\"\nprint(s.run(p, ('io', '4', 'ok\\n')), s.run(p, ('io', '10', 'ok\\n'))[0])"
    )
    others = [subprocess.Popen([*as_user, "sleep", "20"]) for _ in range(12)]
    try:
        run = subprocess.run(
            [*as_user, "/usr/bin/python3", "-c", script, str(REPO), str(REPO / "scripts")],
            capture_output=True,
            text=True,
            cwd="/",
            env={"PATH": "/usr/bin:/bin"},
            timeout=60,
        )
    finally:
        for p in others:
            p.kill()
            p.wait()
    if "cannot run here" in run.stderr:
        pytest.skip(f"the kernel refuses user namespaces to unprivileged users here: {run.stderr.strip()[-200:]}")
    assert run.stdout.strip() == "(True, '') False", run.stdout + run.stderr


@pytest.mark.parametrize("sandbox", ["os", "process"])
@pytest.mark.parametrize(
    "name, sabotage",
    [
        ("a FIFO", "os.remove('../stdout')\nos.mkfifo('../stdout')"),
        ("a directory", "os.remove('../stdout')\nos.mkdir('../stdout')"),
        ("nothing", "os.remove('../stdout')"),
    ],
)
def test_stdout_replaced_by_the_program_neither_hangs_nor_breaks_the_trainer(name, sabotage, sandbox):
    """The program replaces its stdout file's name with a FIFO (whose open would block the trainer for good),
    a directory or nothing, where it can reach the name (sandbox=process; with "os" the file is outside its
    view): the test is scored from what it wrote, through the trainer's own descriptor."""
    if sandbox == "os":
        skip_without_os_isolation()
    body = "\n".join("    " + line for line in sabotage.splitlines())
    program = f"import os\nprint(7, flush=True)\ntry:\n{body}\nexcept OSError:\n    pass"
    start = time.monotonic()
    assert score(code_reward(sandbox=sandbox), [program], [{"input": "", "output": "7\n"}]) == [1.0], name
    assert time.monotonic() - start < 10


def test_where_the_kernel_refuses_namespaces_the_run_stops_in_one_sentence_and_process_mode_runs():
    """A process whose system call filter refuses unshare and mount (the namespaces module's own filter, installed
    first) stands for a kernel that refuses them: the check names the refusal and the fix; with
    reward.sandbox=process, chosen explicitly, tests run."""
    import subprocess
    import sys

    from grpo_cli.sandbox.program import CHILD

    script = (
        "import sys; sys.path.insert(0, sys.argv[1]); import namespaces; namespaces.seccomp()\n"
        "from grpo_cli.errors import GrpoError\nfrom grpo_cli.sandbox.program import Sandbox\n"
        "try:\n    Sandbox(1, 256, 64, 16).check()\nexcept GrpoError as e:\n    print(e)\n"
        "s = Sandbox(1, 256, 64, 16, 'process')\ns.check()\nprint(s.passes('print(7)', 'io', '', '7\\n'))"
    )
    run = subprocess.run([sys.executable, "-c", script, str(CHILD.parent)], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    refusal, passed = run.stdout.strip().splitlines()
    assert refusal.startswith(
        "The code sandbox cannot run here (grpo-sandbox: a namespace or the filesystem view "
        "refused: [Errno 1] unshare: Operation not permitted)"
    )
    assert refusal.endswith("or accept weaker isolation with reward.sandbox=process.")
    assert passed == "True"
