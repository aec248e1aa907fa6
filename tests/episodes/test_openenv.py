"""env.openenv: an OpenEnv environment server's sessions as step environments (grpo_cli/episodes/openenv.py),
against a server the test starts (tests/inputs/guess_server.py)."""

from __future__ import annotations

import sys
import time

import pytest
from episode_kit import INPUTS

from grpo_cli.commands.compose import compose_config
from grpo_cli.data.tasks import load_data
from grpo_cli.episodes import environment, generator_for
from grpo_cli.generate.base import generate
from grpo_cli.models.loading import load_model, load_tokenizer

pytest.importorskip("openenv", reason="env.openenv needs OpenEnv's client: pip install openenv-core")
sys.path.insert(0, str(INPUTS))
from guess_server import Server  # noqa: E402


@pytest.fixture
def server():
    s = Server()
    yield s
    s.stop()


def run_episodes(url: str, *extra: str, prompts: int = 4, G: int = 4):
    cfg = compose_config("train", [f"env.openenv={url}", "env.concurrency=8", *extra])
    tokenizer, model = load_tokenizer(cfg.model.path), load_model(cfg.model.path, device="cpu")
    env = environment(cfg.env)
    columns = load_data(cfg.data, tokenizer, tools=env.schemas_for)["train"][list(range(prompts))]
    generator = generator_for(
        cfg.generator, cfg.data, tokenizer, env, precision=None, device="cpu", world_size=1, seed=0
    )
    roll = generate(
        generator, model, columns[cfg.data.prompt_field], G, cfg.sampler, list(range(prompts)), columns=columns
    )
    return roll, generator


def wait_closed(server, timeout: float = 10.0) -> int:
    end = time.monotonic() + timeout
    while server.open_sessions() and time.monotonic() < end:
        time.sleep(0.01)
    return server.open_sessions()


def test_episodes_run_as_concurrent_sessions_and_every_one_is_closed_once_scored(server):
    roll, generator = run_episodes(server.url, "env.max_turns=3")
    assert server.most_open >= 2, "the sessions never overlapped"
    assert server.open_sessions() == 16  # held until the step's rewards are read (get_reward could need them)
    for ep in roll.episodes:
        assert ep.observation == " Guess my letter:" and ep.turns >= 1
        said = [m["content"] for m in ep.messages if m["role"] == "assistant"]
        assert ep.reward == float(any(s.strip().startswith("q") for s in said))
        assert ep.done or ep.cut == "turns"
    generator.close()
    assert wait_closed(server) == 0


def test_episodes_cut_at_max_turns_close_their_sessions_at_the_next_step(server):
    roll, generator = run_episodes(server.url, "env.max_turns=1")
    assert any(ep.cut == "turns" or not ep.done for ep in roll.episodes)
    generator.close_environments()  # what the next step's generate does first
    assert wait_closed(server) == 0
    generator.close()


def test_a_server_that_is_not_there_or_a_url_that_is_not_one_is_one_sentence(server):
    from grpo_cli.errors import GrpoError
    from helpers import refusal

    assert "is not a server's URL" in refusal(compose_config("train", ["env.openenv=localhost:8000"]))
    url = server.url
    server.stop()
    time.sleep(0.3)
    with pytest.raises(GrpoError, match="no OpenEnv server answers there"):
        run_episodes(url, prompts=1, G=1)
