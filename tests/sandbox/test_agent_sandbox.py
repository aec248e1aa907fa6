"""Agents confined by the kernel (env.agent with env.workers and env.sandbox=os, grpo_cli/episodes/agent_workers.py):
an agent that does what a hostile or buggy harness could reaches the run's endpoint, through the same base_url with
any HTTP library, and nothing else of the machine; the control, the same agent in an unconfined worker, reaches it
all, so each check can fail."""

from __future__ import annotations

import os
import socket

import pytest
from test_agent import chain

from helpers import sandbox_runs_here

pytest.importorskip("openai", reason="env.agent hands the agent an openai client: pip install openai")

PROBE = """
import json, os, socket, urllib.request


async def probe(client, model, row):
    reply = await client.chat.completions.create(model=model, messages=list(row["prompt"]), max_tokens=4)
    out = {"reward": float(len(reply.choices) == 1)}

    def attempt(name, fn):
        try:
            fn()
            out[name] = 1.0
        except Exception:
            out[name] = 0.0

    def own_client():  # the endpoint through base_url with another HTTP library
        where = row["_endpoint"]
        request = urllib.request.Request(where["base_url"] + "/models")
        request.add_header("Authorization", "Bearer " + where["api_key"])
        with urllib.request.urlopen(request, timeout=10) as answer:
            assert json.load(answer)["data"][0]["id"] == model

    attempt("own_client", own_client)
    attempt("read_secret", lambda: open(os.environ["GRPO_TEST_SECRET"]).read())
    attempt("write_outside", lambda: open(os.path.join(os.environ["GRPO_TEST_DIR"], "written.txt"), "w").write("x"))
    attempt("host_port", lambda: socket.create_connection(("127.0.0.1", int(os.environ["GRPO_TEST_PORT"])), 2).close())
    attempt("signal_trainer", lambda: os.kill(int(os.environ["GRPO_TEST_TRAINER"]), 0))
    return out
"""
ESCAPES = ("read_secret", "write_outside", "host_port", "signal_trainer")


@pytest.fixture
def probe_agent(tmp_path, monkeypatch, tools_model):
    where = tmp_path / "agent"
    where.mkdir()
    (where / "probe_agent.py").write_text(PROBE)
    secret = tmp_path / "elsewhere" / "secret.txt"
    secret.parent.mkdir()
    secret.write_text("outside-secret")
    listener = socket.create_server(("127.0.0.1", 0))  # a service of the machine's own loopback
    monkeypatch.setenv("GRPO_TEST_PORT", str(listener.getsockname()[1]))
    monkeypatch.setenv("GRPO_TEST_SECRET", str(secret))
    monkeypatch.setenv("GRPO_TEST_DIR", str(tmp_path))
    monkeypatch.setenv("GRPO_TEST_TRAINER", str(os.getpid()))
    yield str(where / "probe_agent.py")
    listener.close()


@pytest.fixture(scope="module")
def tools_model():
    from grpo_cli.models.loading import load_model, load_tokenizer

    return load_tokenizer("builtin:tiny-tools"), load_model("builtin:tiny-tools", device="cpu")


def attempts(agent: str, sandbox: str, tools_model) -> list[dict]:
    from grpo_cli.generate.base import generate

    _, model = tools_model
    overrides = ["env.tools=[]", f"env.agent={agent}:probe", "env.workers=1", f"env.sandbox={sandbox}"]
    cfg, generator, columns = chain(overrides, tools_model, n_prompts=2)
    try:
        roll = generate(generator, model, columns[cfg.data.prompt_field], 2, cfg.sampler, [1, 2], columns=columns)
    finally:
        generator.close()
    socket_dir = generator.spec.workers.socket_dir
    assert socket_dir is None or not os.path.exists(socket_dir), "the endpoint's socket directory was left"
    assert all(ep.failed is None and ep.reward == 1.0 for ep in roll.episodes), roll.episodes[0].failed
    return [ep.metrics for ep in roll.episodes]


def test_a_confined_agent_reaches_the_endpoint_and_nothing_else(probe_agent, tools_model, tmp_path):
    sandbox_runs_here()
    for metrics in attempts(probe_agent, "os", tools_model):
        assert metrics["own_client"] == 1.0
        assert {k: metrics[k] for k in ESCAPES} == dict.fromkeys(ESCAPES, 0.0)
    assert not (tmp_path / "written.txt").exists()


def test_the_control_an_unconfined_agent_worker_reaches_it_all(probe_agent, tools_model, tmp_path):
    for metrics in attempts(probe_agent, "none", tools_model):
        assert metrics == {"own_client": 1.0, **dict.fromkeys(ESCAPES, 1.0)}
    assert (tmp_path / "written.txt").exists()
