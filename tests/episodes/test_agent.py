"""Agents written as ordinary code (env.agent): the endpoint's contract, token-exact trajectories, and each way an
agent can go wrong. The model is the tool demo's (builtin:tiny-tools); the agents are in tests/inputs/my_agents.py
and grpo_cli/demo/agent.py."""

from __future__ import annotations

import json
import math
import socket
import time
import urllib.error
import urllib.request
from dataclasses import replace

import pytest
import torch
from episode_kit import INPUTS

from grpo_cli.commands.compose import compose_config
from grpo_cli.data.tasks import load_data
from grpo_cli.episodes import environment, generator_for
from grpo_cli.episodes.endpoint import MAX_BODY
from grpo_cli.generate.base import generate
from grpo_cli.models.loading import load_model, load_tokenizer
from grpo_cli.rewards.exact_match import is_correct

openai = pytest.importorskip("openai", reason="env.agent hands the agent an openai client: pip install openai")

DEMO = ["experiment=tool_use", "trainer.threads=1"]


@pytest.fixture(scope="module")
def tools_model():
    return load_tokenizer("builtin:tiny-tools"), load_model("builtin:tiny-tools", device="cpu")


def chain(overrides: list[str], tools_model, n_prompts: int = 4, demo: list[str] = DEMO):
    """The command's generator chain (in-process tools, or env.agent) and the first training prompts."""
    tokenizer, _ = tools_model
    cfg = compose_config("train", demo + overrides)
    cfg.env.fn_dir = str(INPUTS)
    env = environment(cfg.env)
    rows = load_data(cfg.data, tokenizer, tools=env.schemas_for)["train"]
    columns = rows[list(range(n_prompts))]
    generator = generator_for(
        cfg.generator, cfg.data, tokenizer, env, precision=None, device="cpu", world_size=1, seed=0
    )
    return cfg, generator, columns


def episodes_of(overrides, tools_model, *, n_prompts=4, G=4, seed=7, sampling=None, demo=DEMO):
    tokenizer, model = tools_model
    cfg, generator, columns = chain(overrides, tools_model, n_prompts, demo)
    prompts = columns[cfg.data.prompt_field]
    try:
        roll = generate(
            generator,
            model,
            prompts,
            G,
            sampling or cfg.sampler,
            [seed + i for i in range(len(prompts))],
            columns=columns,
            with_logprobs=True,
        )
    finally:
        generator.close()
    return roll, generator, columns


AGENT = ["env.tools=[]", "env.agent=grpo_cli.demo.agent:calculator"]


def test_the_demo_agent_gives_the_in_process_driver_s_tokens_log_probs_and_rewards(tools_model):
    """The tool demo written with the openai SDK, served by the endpoint, against env.tools: 8 prompts x 4
    episodes, sampled with the same seeds. Every token, every action-mask bit, every sampled log-prob and every
    reward is the same (the agent scores its last reply as exact_match does)."""
    ours, _, columns = episodes_of([], tools_model, n_prompts=8)
    theirs, agent, _ = episodes_of(AGENT, tools_model, n_prompts=8)
    assert torch.equal(ours.tokens, theirs.tokens)
    assert torch.equal(ours.loss_mask, theirs.loss_mask)
    assert torch.allclose(ours.sampler_logp, theirs.sampler_logp, atol=1e-6)
    answers = [a for a in columns["answer"] for _ in range(4)]
    expected = [float(is_correct(ep.final_text, a)) for ep, a in zip(ours.episodes, answers)]
    assert [ep.reward for ep in theirs.episodes] == expected
    assert sum(ep.tool_calls for ep in theirs.episodes) > 0, (
        "no episode called the tool: nothing multi-turn was compared"
    )
    assert all(ep.failed is None and ep.prefix_breaks == 0 for ep in theirs.episodes)


def test_the_chained_call_demo_agent_gives_the_in_process_environment_s_tokens_and_rewards():
    """The chained-call demo (env.factory=Links, whose follow() the model calls twice) against its agent, which
    holds the table and runs follow() itself: the same tokens, mask, log-probs and rewards for the same seeds."""
    chain_model = load_tokenizer("builtin:tiny-chain"), load_model("builtin:tiny-chain", device="cpu")
    demo = ["experiment=tool_chain", "trainer.threads=1"]
    ours, _, columns = episodes_of([], chain_model, n_prompts=8, demo=demo)
    agent = ["env.factory=null", "env.agent=grpo_cli.demo.agent:links"]
    theirs, _, _ = episodes_of(agent, chain_model, n_prompts=8, demo=demo)
    assert torch.equal(ours.tokens, theirs.tokens)
    assert torch.equal(ours.loss_mask, theirs.loss_mask)
    assert torch.allclose(ours.sampler_logp, theirs.sampler_logp, atol=1e-6)
    answers = [a for a in columns["answer"] for _ in range(4)]
    expected = [float(is_correct(ep.final_text, a, extract="full")) for ep, a in zip(ours.episodes, answers)]
    assert [ep.reward for ep in theirs.episodes] == expected
    assert sum(ep.tool_calls for ep in theirs.episodes) >= 8, "too few calls: the chain was hardly compared"
    assert all(ep.failed is None and ep.prefix_breaks == 0 for ep in theirs.episodes)


def test_a_streaming_agent_reads_the_same_replies_and_trains_the_same_tokens(tools_model):
    """The demo agent written with stream=true (it reassembles the deltas, usage included): the same tokens, log-probs
    and rewards as the demo agent without streaming."""
    plain, _, _ = episodes_of(AGENT, tools_model, n_prompts=8)
    streamed, _, _ = episodes_of(
        ["env.tools=[]", "env.agent=my_agents.py:streams_the_calculator"], tools_model, n_prompts=8
    )
    assert all(ep.failed is None for ep in streamed.episodes), streamed.episodes[0].failed
    assert torch.equal(plain.tokens, streamed.tokens)
    assert torch.allclose(plain.sampler_logp, streamed.sampler_logp, atol=1e-6)
    assert [ep.reward for ep in plain.episodes] == [ep.reward for ep in streamed.episodes]
    assert sum(ep.tool_calls for ep in streamed.episodes) > 0
    assert all(ep.metrics["completion_tokens"] > 0 for ep in streamed.episodes)


def test_every_trained_token_is_one_the_endpoint_sampled_and_every_other_is_context(tools_model):
    """The records the endpoint keeps (each request's prompt ids and the ids it sampled) rebuild each row: the
    trained tokens are the sampled ones, in order, and each request's prompt is the row up to it."""
    roll, agent, _ = episodes_of(AGENT, tools_model)
    for i, (ep, records) in enumerate(zip(roll.episodes, agent.records)):
        trained = [t for t, a in zip(ep.ids, ep.action) if a]
        sampled = [t for r in records for t in r["choices"][0][0]]
        assert trained == sampled, i
        whole = ep.prompt_ids + ep.ids
        for r in records:
            assert whole[: len(r["prompt_ids"])] == r["prompt_ids"]


def wire(
    url: str, body: dict | None = None, key: str | None = None, method: str | None = None, raw: bytes | None = None
):
    data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
    request = urllib.request.Request(url, data=data, method=method or ("POST" if data is not None else "GET"))
    request.add_header("Content-Type", "application/json")
    if key is not None:
        request.add_header("Authorization", f"Bearer {key}")
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


@pytest.fixture
def endpoint_agent(tools_model):
    """An AgentGenerator whose endpoint is open, with one episode of a live step (its generate runs elsewhere)."""
    _, generator, _ = chain(AGENT, tools_model)
    generator.sampling = compose_config("train", DEMO).sampler
    generator.endpoint.open("e1")
    yield generator
    generator.close()


def test_the_endpoint_refuses_a_wrong_key_model_route_body_and_a_closed_episode(endpoint_agent):
    ep = endpoint_agent.endpoint
    url, key = ep.base_url("e1"), ep.key
    ok = {"model": "policy", "messages": [{"role": "user", "content": "1+2="}]}
    assert wire(url + "/models", key=key) == (
        200,
        {"object": "list", "data": [{"id": "policy", "object": "model", "owned_by": "grpo-cli"}]},
    )
    cases = [
        (wire(url + "/chat/completions", ok, key="wrong"), 401, "invalid_api_key"),
        (wire(url + "/chat/completions", ok), 401, "invalid_api_key"),
        (wire(url + "/chat/completions", {**ok, "model": "gpt-4o"}, key), 404, "model_not_found"),
        (wire(url + "/embeddings", ok, key), 404, "not_found"),
        (wire(url + "/chat/completions", {**ok, "stream": "yes"}, key), 400, "invalid_stream"),
        (wire(url + "/chat/completions", raw=b"{not json", key=key), 400, "invalid_json"),
        (wire(url + "/chat/completions", raw=b" " * (MAX_BODY + 1), key=key), 413, "body_too_large"),
        (wire(ep.base_url("e2") + "/chat/completions", ok, key), 410, "episode_closed"),
    ]
    for (status, body), want, code in cases:
        assert (status, body["error"]["code"]) == (want, code), body
        assert body["error"]["message"].endswith(".")


def test_the_endpoint_listens_on_loopback_only(endpoint_agent):
    server = endpoint_agent.endpoint.server
    assert server.server_address[0] == "127.0.0.1"
    probe = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        probe.connect(("10.255.255.255", 1))  # no packet is sent: this only picks the outward interface
        outward = probe.getsockname()[0]
    except OSError:
        outward = "127.0.0.1"
    finally:
        probe.close()
    if outward.startswith("127."):
        pytest.skip("this machine has no address but loopback to try the endpoint's port from")
    with pytest.raises(OSError):
        socket.create_connection((outward, endpoint_agent.endpoint.port), timeout=5).close()


def agent_roll(tools_model, agent: str, *extra, n_prompts=2, G=2, fails=False):
    if fails:  # the step says how many agents failed, and the first one's error
        with pytest.warns(RuntimeWarning, match=r"of 4 agents failed this step; the first: "):
            return agent_roll(tools_model, agent, *extra, n_prompts=n_prompts, G=G)
    return episodes_of(
        ["env.tools=[]", f"env.agent=my_agents.py:{agent}", *extra], tools_model, n_prompts=n_prompts, G=G
    )


def test_a_raising_a_hanging_and_a_nan_returning_agent_are_each_an_unscored_episode_not_a_crash(tools_model):
    for name, why in (
        ("raises", "RuntimeError: the agent's own bug"),
        ("returns_nan", "ValueError: the agent returned nan"),
    ):
        roll, _, _ = agent_roll(tools_model, name, fails=True)
        assert all(ep.failed is not None and ep.failed.startswith(why) for ep in roll.episodes), name
    roll, _, _ = agent_roll(tools_model, "hangs", "env.timeout_s=0.5", fails=True)
    assert all(ep.failed.startswith("timeout") and ep.timeouts == 1 for ep in roll.episodes)
    roll, _, _ = agent_roll(tools_model, "hangs_in_a_plain_def", "env.timeout_s=0.5", fails=True)
    assert all(ep.failed.startswith("timeout") for ep in roll.episodes)


def test_a_failed_agent_s_episode_gets_no_reward_and_is_left_out_of_the_group(tools_model):
    from grpo_cli.rewards import reward_with

    cfg = compose_config("train", DEMO + ["env.tools=[]", "env.agent=my_agents.py:raises"])
    cfg.env.fn_dir = str(INPUTS)
    env = environment(cfg.env)
    reward = reward_with(cfg.reward, env)
    roll, _, _ = agent_roll(tools_model, "raises", fails=True)
    scores = reward.terms["agent"](type("B", (), {"episodes": roll.episodes})())
    assert scores == [None] * len(roll.episodes)


def test_a_plain_def_agent_and_a_dict_with_metrics_train_as_a_coroutine_does(tools_model):
    roll, _, _ = agent_roll(tools_model, "plain_with_metrics")
    assert all(ep.failed is None and ep.reward in (0.0, 1.0) for ep in roll.episodes)
    assert all(ep.metrics == {"replies": 1.0} for ep in roll.episodes)


def test_a_prefix_breaking_agent_trains_its_last_chain_and_is_counted(tools_model):
    """The agent asks, then asks again with its history rewritten (a summary instead of the first turn): the
    second request starts a new chain; the row is that chain, and the first chain's tokens are counted out."""
    roll, agent, _ = agent_roll(tools_model, "rewrites_history")
    for ep, records in zip(roll.episodes, agent.records):
        assert ep.prefix_breaks == 1 and ep.requests == 2
        assert ep.prompt_ids == records[1]["prompt_ids"]
        assert [t for t, a in zip(ep.ids, ep.action) if a] == records[1]["choices"][0][0]
        assert ep.dropped_tokens == len(records[0]["choices"][0][0])


def test_n_choices_sample_apart_and_the_one_the_agent_goes_on_with_is_trained(tools_model):
    """n=3: three samples of one prompt, each under its own seed; the agent answers with the last choice's
    message, and that choice's ids are the ones trained."""
    roll, agent, _ = agent_roll(tools_model, "picks_the_last_of_three", "env.max_turns=3")
    for ep, records in zip(roll.episodes, agent.records):
        choices = [ids for ids, _ in records[0]["choices"]]
        assert len(choices) == 3 and len({tuple(c) for c in choices}) > 1
        trained = [t for t, a in zip(ep.ids, ep.action) if a]
        assert trained[: len(choices[2])] == choices[2]


def test_a_forced_tool_choice_opens_the_call_as_context_and_the_model_writes_the_rest(tools_model):
    """tool_choice naming add: every first reply calls add (the base model calls it in about a quarter of its
    sampled episodes), the opening the template writes before a call's arguments is context (not trained), and the
    row is still the requests' prompts and sampled ids."""
    tokenizer, _ = tools_model
    roll, agent, _ = episodes_of(["env.tools=[]", "env.agent=my_agents.py:forces_add"], tools_model)
    assert all(ep.failed is None and ep.metrics["calls"] >= 1 for ep in roll.episodes)
    for ep, records in zip(roll.episodes, agent.records):
        first = records[0]
        opening = first["prompt_ids"][len(ep.prompt_ids) :]  # the context past the rendered prompt: the opening
        assert tokenizer.decode(opening) == '<tool_call>{"name":"add'
        sampled = first["choices"][0][0]
        assert ep.ids[: len(opening) + len(sampled)] == opening + sampled
        assert ep.action[: len(opening) + len(sampled)] == [0] * len(opening) + [1] * len(sampled)
        assert [t for t, a in zip(ep.ids, ep.action) if a] == [t for r in records for t in r["choices"][0][0]]


def test_a_forced_tool_choice_without_that_tool_or_of_another_shape_is_a_400(endpoint_agent):
    from grpo_cli.demo.agent import ADD
    from grpo_cli.episodes.endpoint import Refusal

    messages = [{"role": "user", "content": "1+2="}]
    for tools, choice in (
        ([ADD], {"type": "function", "function": {"name": "subtract"}}),
        (None, "required"),
        ([ADD], "always"),
    ):
        with pytest.raises(Refusal) as refused:
            endpoint_agent.chains.forced(messages, tools, choice)
        assert refused.value.status == 400 and str(refused.value).endswith(".")


def test_the_run_s_sampling_wins_unless_env_agent_sampling_is_request(tools_model, endpoint_agent):
    """An agent asking temperature 0: the run's temperature 1 samples each group member apart (the default), and
    with env.agent_sampling=request every member gets the one greedy reply, the untempered log-probs with it."""
    from grpo_cli.episodes.endpoint import Refusal

    agent = ["env.tools=[]", "env.agent=my_agents.py:asks_greedy"]

    def replies(roll):
        return [tuple(ep.ids) for ep in roll.episodes]

    run_wins, _, _ = episodes_of(agent, tools_model)
    asked, generator, _ = episodes_of([*agent, "env.agent_sampling=request"], tools_model)
    G = 4
    assert any(len(set(replies(run_wins)[i : i + G])) > 1 for i in range(0, 16, G))
    assert all(len(set(replies(asked)[i : i + G])) == 1 for i in range(0, 16, G))
    tokenizer, model = tools_model
    ep = asked.episodes[0]
    with torch.no_grad():
        logits = model(torch.tensor([ep.prompt_ids + ep.ids])).logits[0, len(ep.prompt_ids) - 1 : -1].double()
    assert [int(t) for t in logits.argmax(-1)] == ep.ids
    expected = logits.log_softmax(-1).gather(-1, torch.tensor(ep.ids)[:, None]).squeeze(-1)
    assert torch.allclose(torch.tensor(ep.logps, dtype=torch.float64), expected, atol=1e-4)
    endpoint_agent.cfg.agent_sampling = "request"
    for body in ({"temperature": 5}, {"top_p": 0}, {"temperature": "hot"}):
        with pytest.raises(Refusal):
            endpoint_agent._sampling(body)
    assert endpoint_agent._sampling({"temperature": 0.5}) == (0.5, 1.0)


def test_top_logprobs_give_each_token_s_likeliest_alternatives(tools_model):
    """top_logprobs=3: three alternatives a token, likeliest first, their probabilities summing to at most 1; where
    the sampled token is among them, the log-prob the one forward pass gives it is the decode's own (to 1e-4)."""
    _, generator, _ = episodes_of(
        ["env.tools=[]", "env.agent=my_agents.py:asks_top_logprobs"], tools_model, n_prompts=2
    )
    answered = generator.spec.fn.__globals__["SEEN"]  # the agent's module, as the run loaded it
    assert len(answered) == 8
    compared = 0
    for seen in answered:
        for token in seen["content"]:
            top = token["top_logprobs"]
            assert len(top) == 3 and [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
            assert sum(math.exp(t["logprob"]) for t in top) <= 1 + 1e-6
            same = [t["logprob"] for t in top if t["token"] == token["token"]]
            if same:
                assert abs(same[0] - token["logprob"]) < 1e-4
                compared += 1
    assert compared >= 8


def test_parallel_calls_from_one_agent_each_get_an_answer_and_one_chain_is_trained(tools_model):
    roll, agent, _ = agent_roll(tools_model, "asks_twice_at_once")
    for ep, records in zip(roll.episodes, agent.records):
        assert ep.failed is None and ep.reward == 2.0  # both answers reached the agent
        assert len(records) == 2 and ep.prefix_breaks == 1
        assert [t for t, a in zip(ep.ids, ep.action) if a] == records[1]["choices"][0][0]


def test_an_answer_the_agent_never_read_is_not_trained(tools_model):
    """The agent's client gives up on its request before the answer: that answer is left out of the row."""
    roll, agent, _ = agent_roll(tools_model, "gives_up_on_its_request", "env.timeout_s=5")
    for ep, records in zip(roll.episodes, agent.records):
        assert ep.unanswered == 1 and ep.requests == 1 and ep.failed is None and ep.reward == 1.0
        assert len(records[0]["choices"][0][0]) > 1  # sampled, and left out:
        assert ep.ids == [roll.episodes[0].ids[0]] and ep.action == [1]  # one EOS, as an episode with no reply


def test_the_completions_route_continues_a_text_chain(tools_model):
    """completions: the second prompt is the first plus the reply plus new text; the row is one chain whose
    trained tokens are both replies'."""
    roll, agent, _ = agent_roll(tools_model, "completes_text")
    for ep, records in zip(roll.episodes, agent.records):
        assert ep.prefix_breaks == 0 and len(records) == 2
        assert [t for t, a in zip(ep.ids, ep.action) if a] == records[0]["choices"][0][0] + records[1]["choices"][0][0]
        assert math.isfinite(ep.reward)


def test_env_agent_with_tools_or_plain_prompts_is_one_sentence():
    from helpers import refusal

    agent = "env.agent=grpo_cli.demo.agent:calculator"
    assert "keep one of them" in refusal(compose_config("train", DEMO + [agent]))
    assert "set env.workers" in refusal(compose_config("train", DEMO + [agent, "env.tools=[]", "env.sandbox=os"]))
    assert refusal(compose_config("train", DEMO + [agent, "env.tools=[]", "env.workers=2", "env.sandbox=os"])) == ""
    assert "data.chat_template=true" in refusal(
        compose_config("train", DEMO + [agent, "env.tools=[]", "data.chat_template=false"])
    )
    assert refusal(compose_config("train", DEMO + [agent, "env.tools=[]"])) == ""


@pytest.mark.parametrize("where", [["env.workers=2"], ["env.workers=2", "env.sandbox=os"]], ids=["workers", "confined"])
def test_agents_in_workers_and_confined_give_the_in_process_agent_s_tokens_and_rewards(tools_model, where):
    """env.workers runs the agents in helper processes (the trainer never imports them), env.sandbox=os confines
    those by the kernel with loopback HTTP to the endpoint the one way out: the same episodes, two steps running
    (the workers are kept between steps)."""
    if "env.sandbox=os" in where:
        from helpers import sandbox_runs_here

        sandbox_runs_here()
    tokenizer, model = tools_model
    ours, _, _ = episodes_of(AGENT, tools_model, n_prompts=8)
    cfg, generator, columns = chain(AGENT + where, tools_model, n_prompts=8)
    try:
        prompts = columns[cfg.data.prompt_field]
        for step in range(2):
            seeds = [7 + i + step for i in range(len(prompts))]
            theirs = generate(generator, model, prompts, 4, cfg.sampler, seeds, columns=columns, with_logprobs=True)
            assert all(ep.failed is None for ep in theirs.episodes), theirs.episodes[0].failed
            if step == 0:
                assert torch.equal(ours.tokens, theirs.tokens)
                assert torch.allclose(ours.sampler_logp, theirs.sampler_logp, atol=1e-6)
                assert [ep.reward for ep in theirs.episodes] == [ep.reward for ep in ours.episodes]
        assert all(h is not None and h.alive() for h in generator.spec.workers.helpers)
    finally:
        generator.close()


def test_an_agent_that_ends_its_worker_fails_its_episodes_and_the_next_step_restarts_it(tools_model):
    _, model = tools_model
    cfg, generator, columns = chain(
        ["env.tools=[]", "env.agent=my_agents.py:ends_its_process", "env.workers=1"], tools_model, n_prompts=2
    )
    try:
        prompts = columns[cfg.data.prompt_field]
        with pytest.warns(RuntimeWarning, match="4 of 4 agents failed"):
            first = generate(generator, model, prompts, 2, cfg.sampler, [1, 2], columns=columns)
        assert all("agent worker 0 exited with code 3" in ep.failed for ep in first.episodes)
        gone = generator.spec.workers.helpers[0].process
        gone.wait(5)
        with pytest.warns(RuntimeWarning, match="4 of 4 agents failed"):
            second = generate(generator, model, prompts, 2, cfg.sampler, [1, 2], columns=columns)
        assert all("exited with code 3" in ep.failed for ep in second.episodes), [ep.failed for ep in second.episodes]
        assert generator.spec.workers.helpers[0].process.pid != gone.pid  # a fresh worker ran them
    finally:
        generator.close()


def test_an_agent_that_fails_on_import_in_its_workers_is_one_sentence_and_leaves_no_worker(tmp_path, capfd):
    from grpo_cli.errors import GrpoError

    (tmp_path / "broken.py").write_text(
        "import no_such_module_here\n\nasync def solve(client, model, row):\n    return 1.0\n"
    )
    cfg = compose_config("train", [*DEMO, "env.tools=[]", "env.agent=broken.py:solve", "env.workers=3"])
    cfg.env.fn_dir = str(tmp_path)
    with pytest.raises(GrpoError, match="fails on import .*no_such_module_here.*fix the file"):
        environment(cfg.env)
    time.sleep(1)  # the other workers' last words, if any, would reach stderr by now
    assert "Traceback" not in capfd.readouterr().err
    assert not [p for p in children_command_lines() if "agent_workers" in " ".join(p)]


def children_command_lines() -> list[list[str]]:
    """The command lines of this process's live children, read from /proc."""
    import os

    out = []
    for pid in os.listdir("/proc"):
        try:
            with open(f"/proc/{pid}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) != os.getpid():
                    continue
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                out.append(f.read().decode(errors="replace").split("\0"))
        except (OSError, ValueError, IndexError):
            continue
    return [c for c in out if c != [""]]


def test_greedy_held_out_scoring_runs_through_the_agent(tools_model):
    cfg = compose_config("train", DEMO)
    roll, _, _ = episodes_of(AGENT, tools_model, n_prompts=2, G=1, sampling=replace(cfg.sampler, temperature=0.0))
    assert all(ep.failed is None for ep in roll.episodes)


AGENT_RUN = [
    "experiment=tool_agent",
    "trainer.prompts_per_step=4",
    "sampler.group_size=4",
    "trainer.micro_batch_size=8",
    "trainer.eval_before_after=false",
    "trainer.eval_every=0",
    "trainer.progress=false",
    "trainer.log_completions_every=1",
    "trainer.threads=1",
]


def test_the_agent_demo_trains_resumes_bitwise_and_logs_what_the_agent_did(tmp_path):
    """4 steps straight == 2 steps then resume=auto to 4, through `grpo train`; the rows log the agent's episodes
    (tool calls, requests, no failures) and completions.jsonl their transcripts as the model read them."""
    from safetensors.torch import load_file

    from helpers import grpo, metric_rows, read_jsonl

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert grpo("train", f"output_dir={straight}", "trainer.steps=4", *AGENT_RUN) == 0
    assert grpo("train", f"output_dir={resumed}", "trainer.steps=2", *AGENT_RUN) == 0
    assert grpo("train", f"output_dir={resumed}", "trainer.steps=4", "resume=auto", *AGENT_RUN) == 0
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(resumed / "final" / "model.safetensors")
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = metric_rows(straight, timing=False)
    assert rows == metric_rows(resumed, timing=False)
    assert all(r["agent/failed_frac"] == 0 and r["agent/requests"] >= 1 and "reward/agent" in r for r in rows)
    assert any(r["env/tool_calls"] > 0 for r in rows)
    logged = read_jsonl(straight / "completions.jsonl")
    called = [r for r in logged if r["tool_calls"]]
    assert called and all(r["messages"][1]["role"] == "tool" for r in called)
    assert all("<tool_call>" in "".join(t["text"] for t in r["rendered"]["turns"]) for r in called)


def test_a_verifiers_environment_runs_through_the_endpoint_and_its_rubric_is_the_reward(tools_model):
    """A verifiers SingleTurnEnv (tests/inputs/vf_env.py) as the agent: its rollout's request is served by the
    endpoint, and each episode's reward is its rubric's score of the very reply the endpoint sampled."""
    pytest.importorskip("verifiers", reason="env.verifiers needs the verifiers package: pip install verifiers")

    roll, agent, columns = episodes_of(
        ["env.tools=[]", "env.verifiers=vf_env.py:load_environment", "env.verifiers_args={weight:2.0}"],
        tools_model,
        n_prompts=2,
        G=2,
    )
    answers = [a for a in columns["answer"] for _ in range(2)]
    for ep, records, answer in zip(roll.episodes, agent.records, answers):
        assert ep.failed is None and len(records) == 1
        assert ep.reward == 2.0 * float(answer in ep.final_text)
        assert ep.metrics["replies"] == 1.0
        assert [t for t, a in zip(ep.ids, ep.action) if a] == records[0]["choices"][0][0]
