"""Environments in helper processes (env.workers, grpo_cli/episodes/worker.py): the same transcripts and
metrics as in the training process, at any concurrency and for environments that draw from the shared random
generators; a crash, a call stuck in native code or a memory blow-up is an error the model reads, the run goes
on, and no worker outlives the run."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest
from episode_kit import INPUTS, Scripted, call, small_cfg

from grpo_cli.config import EnvConfig, SamplerConfig
from grpo_cli.episodes import environments
from grpo_cli.models.loading import load_model
from grpo_cli.run.console import Console
from helpers import grpo, metric_rows, read_jsonl, sandbox_runs_here

environment = environments.environment

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_episodes  # noqa: E402


def workers_alive(parent: int | None = None) -> list[int]:
    """Pids of the environment workers of `parent` (this process) that are still running."""
    alive, parent = [], parent or os.getpid()
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if (
            int(stat.rsplit(")", 1)[1].split()[1]) == parent
            and b"grpo_cli.episodes.worker" in cmd
            and stat.rsplit(")", 1)[1].split()[0] != "Z"
        ):
            alive.append(int(pid))
    return alive


def workers_left(within_s: float = 5.0) -> list[int]:
    """This process's environment workers still running `within_s` seconds after a run closed them (a worker ends
    when its pipe closes; on a loaded machine that takes a moment)."""
    deadline = time.monotonic() + within_s
    while (alive := workers_alive()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return alive


def test_episodes_in_workers_read_what_they_read_in_process_whatever_the_latency():
    """16 episodes x 3 tool turns of an environment that draws from Python's and NumPy's global generators
    and its own, every call 0-20 ms late at random: in 3 workers with 8 calls at a time, the messages and ids
    equal the one-at-a-time in-process transcripts, and no worker is left."""
    _, serial = bench_episodes.measure(16, 3, 0.0, 0.02, 1)
    _, in_workers = bench_episodes.measure(16, 3, 0.0, 0.02, 8, workers=3)
    assert in_workers == serial
    assert len({m["content"] for messages, _ in serial for m in messages if m["role"] == "tool"}) == 16 * 3
    assert workers_left() == []


def test_an_environment_bound_to_the_shared_generator_runs_concurrently_in_workers(qwen_dir, scripted, tmp_path):
    """A name bound to the shared generator before the run makes in-process calls one at a time; in workers
    each call has its process's generators to itself, seeded: concurrency stays on and the transcripts equal
    the in-process ones."""
    (tmp_path / "bound_env.py").write_text(
        "import random\n\ndraw = random._inst.random  # as `from random import random` binds it\n\n"
        "class Env:\n    def reset(self, **row):\n        self.x = draw()\n\n"
        '    def read(self) -> str:\n        """Read x."""\n        return f\'{self.x:.12f}\'\n'
    )
    Scripted.SCRIPT = [call("read"), "0"]
    model = load_model(str(qwen_dir), device="cpu")
    seen = {}
    for workers in (0, 2):
        gen, tok = generator(
            qwen_dir, EnvConfig(factory="bound_env.py:Env", fn_dir=str(tmp_path), concurrency=4, workers=workers)
        )
        assert gen.concurrency == (1 if workers == 0 else 4)
        prompt = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
        roll = gen.generate(model, [prompt, prompt + " "], 4, SamplerConfig(64), [1, 2], columns={"answer": ["0", "0"]})
        gen.close()
        seen[workers] = [ep.messages for ep in roll.episodes]
    assert seen[2] == seen[0]
    assert len({m[1]["content"] for m in seen[0]}) == 8  # every episode drew its own number


def generator(model_dir, env: EnvConfig):
    from grpo_cli.config import TrainConfig
    from grpo_cli.episodes.driver import with_env
    from grpo_cli.generate.base import make_generator
    from grpo_cli.models.loading import load_tokenizer

    tokenizer = load_tokenizer(str(model_dir))
    settings = TrainConfig().generator
    settings.name = "scripted"
    return with_env(
        make_generator(settings, tokenizer, chat_template=True, precision=None, device="cpu"),
        environment(env),
        tokenizer,
        chat_template=True,
    ), tokenizer


def test_a_trl_environment_trains_the_same_in_workers(qwen_dir, scripted, tmp_path):
    """Counter (reset text, two tool methods, an async get_reward) and a standalone tool, 2 steps: the metrics
    rows (rewards, Counter's reward term, the environment's counts) and the transcripts of env.workers=2 equal
    env.workers=0's."""
    from grpo_cli.run.trainer import train

    Scripted.SCRIPT = [call("increment", step=3), call("read"), call("add", a=1, b=2), "done"]
    out = {}
    for workers in (0, 2):
        run = tmp_path / f"w{workers}"
        cfg = small_cfg(
            run,
            qwen_dir,
            tools=["trl_env.py:add"],
            factory="trl_env.py:Counter",
            max_turns=4,
            max_tokens=400,
            workers=workers,
        )
        cfg.reward.name = "exact_match"
        train(cfg, run, Console(progress=False))
        out[workers] = metric_rows(run, timing=False), [r["messages"] for r in read_jsonl(run / "completions.jsonl")]
    assert out[2] == out[0]
    rows, transcripts = out[2]
    assert len(rows) >= 2 and all("reward/Counter" in r for r in rows if "env/turns" in r)
    assert transcripts[0][1]["content"] == "counter is 3"
    assert workers_left() == []


def test_a_worker_that_dies_under_a_call_is_an_error_the_model_reads_and_the_run_goes_on(qwen_dir, scripted, tmp_path):
    """A tool that kills its own process: the episode whose call it was reads how the process ended, an episode
    whose environment lived there reads that it is gone, both are counted as errors, and the next step starts
    a fresh worker (both steps run to the end)."""
    from grpo_cli.run.trainer import train

    (tmp_path / "fragile.py").write_text(
        "import os, signal\n\nclass Fragile:\n    def reset(self, **row):\n        return None\n\n"
        '    def poke(self) -> str:\n        """Kill this process."""\n        os.kill(os.getpid(), signal.SIGKILL)\n'
        "        return 'unreachable'\n"
    )
    Scripted.SCRIPT = [call("poke"), "5"]
    cfg = small_cfg(
        tmp_path, qwen_dir, factory="fragile.py:Fragile", max_turns=2, max_tokens=400, workers=2, concurrency=1
    )
    cfg.env.fn_dir = str(tmp_path)
    cfg.reward.name = "exact_match"
    train(cfg, tmp_path, Console(progress=False))
    rows = metric_rows(tmp_path, training=True)
    assert len(rows) == 2 and all(r["env/errors"] == 1.0 for r in rows)
    tool = [
        m["content"] for r in read_jsonl(tmp_path / "completions.jsonl") for m in r["messages"] if m["role"] == "tool"
    ]
    assert tool.count(str({"error": "the environment's process was killed by SIGKILL while running poke"})) == 4
    assert (
        tool.count(
            str({"error": "this episode's environment is gone: its process was killed by SIGKILL while running poke"})
        )
        == 4
    )
    assert workers_left() == []


def test_a_call_stuck_in_native_code_is_a_timeout_and_its_worker_is_replaced(qwen_dir, scripted, monkeypatch):
    """A regular expression that backtracks for ever holds the interpreter lock, so the worker cannot even say
    it timed out: it is killed env.timeout_s + GRACE_S after the call, the model reads a timeout, and a
    standalone tool's next call starts a fresh worker. A tool past env.worker_memory_gib reads that it ran out
    of memory."""
    monkeypatch.setattr(environments, "GRACE_S", 0.5)
    Scripted.SCRIPT = [call("spin", n=64), call("add", a=1, b=2) + "\n" + call("hog", gib=3), "3"]
    gen, tok = generator(
        qwen_dir,
        EnvConfig(
            tools=["trl_env.py:spin", "trl_env.py:add", "trl_env.py:hog"],
            fn_dir=str(INPUTS),
            timeout_s=0.5,
            workers=1,
            worker_memory_gib=2,
            max_tokens=1000,
        ),
    )
    model = load_model(str(qwen_dir), device="cpu")
    prompt = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    roll = gen.generate(model, [prompt], 1, SamplerConfig(200), [1], columns={"answer": ["3"]})
    (ep,) = roll.episodes
    tool = [m["content"] for m in ep.messages if m["role"] == "tool"]
    assert tool == [
        str({"error": "timed out after 0.5 s (its process did not answer and was stopped)"}),
        "3",
        str({"error": "ran out of memory (env.worker_memory_gib=2)"}),
    ]
    assert ep.timeouts == 1 and ep.errors == 1
    gen.close()
    assert workers_left() == []


@pytest.mark.parametrize(
    "override, message",
    [
        ("env.workers=-1", "env.workers=-1 must be >= 0"),
        ("env.worker_memory_gib=nan", "env.worker_memory_gib"),
    ],
)
def test_env_worker_mistakes_are_one_sentence(override, message, tmp_path, capsys):
    assert grpo("train", f"output_dir={tmp_path}", "env=calculator", "data.chat_template=true", override) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


@pytest.mark.parametrize("sandbox", ["none", "os"])
def test_a_trainer_killed_mid_run_takes_its_environment_workers_along(tmp_path, sandbox):
    """grpo train of the tool demo with 2 environment workers, SIGKILLed once its workers are up: within 5 s
    none of them is left (each asked to die with the trainer before it imported anything); confined
    (env.sandbox=os), their scratch directories are gone too, removed by each worker's reaper."""
    import signal
    import subprocess
    import tempfile
    import time

    from grpo_cli.sandbox.scratch import scratch_prefix

    if sandbox == "os":
        sandbox_runs_here()

    trainer = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grpo_cli",
            "train",
            "experiment=tool_use",
            "env.workers=2",
            f"env.sandbox={sandbox}",
            f"output_dir={tmp_path}",
            "trainer.steps=200",
            "trainer.eval_before_after=false",
            "trainer.threads=1",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    workers: list[int] = []

    def homes() -> list[Path]:  # the workers' scratch directories (env.sandbox=os confines each in one)
        return [p for w in workers for p in Path(tempfile.gettempdir()).glob(scratch_prefix(w) + "*")]

    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and trainer.poll() is None:
            time.sleep(0.2)
            workers = workers_alive(trainer.pid)
            if len(workers) == 2 and (sandbox != "os" or len(homes()) == 2):
                break
        assert len(workers) == 2, "the run never started its 2 environment workers"
        assert sandbox != "os" or len(homes()) == 2, "the workers never made their scratch directories"
    finally:
        trainer.send_signal(signal.SIGKILL)
        trainer.wait(10)

    def running(pid: int) -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 5
    while any(map(running, workers)) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(map(running, workers)), "an environment worker outlived its trainer"
    if sandbox == "os":
        while homes() and time.monotonic() < deadline + 5:
            time.sleep(0.1)
        assert homes() == [], "a killed worker's scratch directory was left behind"
