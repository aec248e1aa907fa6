"""Episodes' environment calls run concurrently (env.concurrency) and give the transcripts of one-at-a-time
calls: each call draws from its episode's own generators, even an environment that draws from Python's or
NumPy's global ones (tests/inputs/sleepy_env.py). Timed with scripts/bench_episodes.py, whose replaying
generator makes the environment the only cost."""

from __future__ import annotations

import random
import sys
from pathlib import Path

import pytest
import torch
from episode_kit import INPUTS, Scripted, call, episode_generator, small_cfg

from grpo_cli.config import EnvConfig, SamplerConfig
from grpo_cli.episodes.environments import EnvSpec
from grpo_cli.models.loading import load_model
from grpo_cli.run.console import Console
from helpers import metric_rows, read_jsonl

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))
import bench_episodes  # noqa: E402


def test_concurrent_calls_with_random_latencies_give_the_one_at_a_time_transcripts():
    """16 episodes x 3 tool turns; every reset and call sleeps 0-20 ms at random (so they finish in another
    order each time) and draws from the global generators and the episode's own: the messages and ids are
    those of env.concurrency=1, and the draws differ between episodes."""
    _, serial = bench_episodes.measure(16, 3, 0.0, 0.02, 1)
    for level in (4, 16):
        _, concurrent = bench_episodes.measure(16, 3, 0.0, 0.02, level)
        assert concurrent == serial, level
    results = [m["content"] for messages, _ in serial for m in messages if m["role"] == "tool"]
    assert len(results) == 16 * 3 and len(set(results)) == len(results)
    assert [m["content"] for m in serial[0][0]][-1] == "done"


@pytest.mark.timing
def test_64_episodes_of_3_turns_with_100_ms_calls_take_an_eighth_of_the_serial_time_or_less():
    """The issue's figure: a sleeping reset and tool (100 ms each), 64 episodes x 3 tool turns; measured here
    (Intel Xeon, AVX-512) 27.4 s one at a time, 1.8 s at the default 16, 0.7 s at 64."""
    serial_s, serial = bench_episodes.measure(64, 3, 0.1, 0.0, 1)
    concurrent_s, concurrent = bench_episodes.measure(64, 3, 0.1, 0.0, 64)
    assert concurrent == serial
    assert serial_s >= 64 * 4 * 0.1 and concurrent_s <= serial_s / 8, (serial_s, concurrent_s)


def write_env(tmp_path: Path, body: str) -> str:
    (tmp_path / "bound_env.py").write_text("import random\n\n" + body)
    return "bound_env.py:Env"


def test_an_environment_holding_the_shared_generator_runs_one_call_at_a_time_and_is_told(qwen_dir, scripted, tmp_path):
    """A name bound to the shared generator's method before the run (`from random import random` in a module
    imported earlier) draws from the shared state whichever thread calls it: such an environment is found
    when it loads and runs its calls one at a time, and the run says so before training."""
    from grpo_cli.run.build import warn_env

    spec = write_env(
        tmp_path,
        "draw = random._inst.random  # as `from random import random` binds it\n\n"
        "class Env:\n    def reset(self, **row):\n        self.x = draw()\n",
    )
    env = EnvSpec(EnvConfig(factory=spec, concurrency=8), str(tmp_path))
    assert env.shared_draws == ["draw (bound_env.py)"]
    gen, tok, _ = episode_generator(qwen_dir, EnvConfig(factory=str(tmp_path / "bound_env.py") + ":Env", concurrency=8))
    assert gen.concurrency == 1 and gen._pool is None
    console = Console(progress=False)
    messages = []
    console.warn = messages.append
    model = load_model(str(qwen_dir), device="cpu")
    warn_env(
        small_cfg(tmp_path, qwen_dir, factory=str(tmp_path / "bound_env.py") + ":Env", concurrency=8),
        gen.spec,
        model,
        tok,
        ["x"],
        console,
    )
    assert any(
        m.startswith("draw (bound_env.py) holds the shared random generator") and "one episode at a time" in m
        for m in messages
    ), messages


def test_a_call_that_draws_from_the_shared_generator_anyway_turns_concurrency_off_with_a_warning(
    qwen_dir, scripted, tmp_path
):
    """The safety net: should the shared generators move during concurrent calls (here a reset reaches the
    shared instance itself), the step warns and the rest of the run calls one episode at a time."""
    write_env(
        tmp_path,
        "class Env:\n    def reset(self, **row):\n        self.x = random._inst.random()\n\n"
        '    def read(self) -> str:\n        """Read x."""\n        return str(self.x)\n',
    )
    Scripted.SCRIPT = ["no tools"]
    gen, tok, _ = episode_generator(qwen_dir, EnvConfig(factory=str(tmp_path / "bound_env.py") + ":Env", concurrency=4))
    assert gen.concurrency == 4
    model = load_model(str(qwen_dir), device="cpu")
    prompt = tok.apply_chat_template([{"role": "user", "content": "x"}], tokenize=False, add_generation_prompt=True)
    state = random.getstate()
    with pytest.warns(RuntimeWarning, match="shared random generator during concurrent calls"):
        gen.generate(model, [prompt], 4, SamplerConfig(8), [1], columns={"answer": ["0"]})
    random.setstate(state)
    assert gen.concurrency == 1 and gen._pool is None


def test_a_run_with_concurrent_jittered_calls_resumes_bitwise(qwen_dir, scripted, tmp_path):
    """2 steps straight == 1 step, then resume=auto to 2, with env.concurrency=8 and calls that finish in a
    random order: the weights, the metrics rows and the transcripts."""
    from safetensors.torch import load_file

    from grpo_cli.registry import load_function
    from grpo_cli.run.trainer import train

    module = sys.modules[load_function("sleepy_env.py:Sleepy", str(INPUTS)).__module__]
    module.DELAY, module.JITTER = 0.0, 0.01
    Scripted.SCRIPT = [call("look", k=1), call("look", k=2), "3"]

    def run(out: Path, steps: int, resume: str | None = None) -> None:
        cfg = small_cfg(out, qwen_dir, factory="sleepy_env.py:Sleepy", max_turns=3, max_tokens=400, concurrency=8)
        cfg.trainer.steps, cfg.trainer.save_every, cfg.resume = steps, 1, resume
        cfg.sampler.temperature = 1.0
        train(cfg, out, Console(progress=False))

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    run(straight, 2)
    run(resumed, 1)
    run(resumed, 2, "auto")
    module.JITTER = 0.0
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(resumed / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert metric_rows(straight, timing=False) == metric_rows(resumed, timing=False)
    transcripts = [r["messages"] for r in read_jsonl(straight / "completions.jsonl")]
    assert transcripts == [r["messages"] for r in read_jsonl(resumed / "completions.jsonl")]
    assert len({m["content"] for t in transcripts for m in t if m["role"] == "tool"}) > 2  # the draws differ
