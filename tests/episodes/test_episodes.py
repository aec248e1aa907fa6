"""Multi-turn episodes (grpo_cli/episodes/driver.py): token-exact trajectories, environment tokens outside the
loss, one forward per episode, TRL-style tools and environments unchanged, failures as observations.

Most tests drive a small random Llama whose tokenizer and chat template follow Qwen2.5's tool format
(`<tool_call>` JSON, tool results in a user turn as `<tool_response>`), with `<tool_call>` and
`</tool_call>` as added tokens as in Qwen's vocabulary: so a turn generated character by character
(as a model may) re-tokenises to *other* ids, and only a trainer that keeps the generated ids passes.
What the model "generates" comes from a scripted generator registered like any plugin, so each
turn's ids are known exactly."""

from __future__ import annotations

import json
import math

import pytest
import torch
from episode_kit import INPUTS, Scripted, call, char_ids, episode_generator, small_cfg

from grpo_cli.algo.objective import policy_loss
from grpo_cli.config import EnvConfig, SamplerConfig, TrainConfig
from grpo_cli.episodes.driver import with_env
from grpo_cli.episodes.environments import EnvSpec
from grpo_cli.episodes.tool_formats import parse_hermes
from grpo_cli.generate.base import make_generator
from grpo_cli.generate.hf import HFGenerator
from grpo_cli.models.loading import load_model, load_tokenizer
from grpo_cli.registry import load_function
from grpo_cli.run.console import Console
from helpers import flat_inputs, grpo, metric_rows, padded, read_jsonl, token_logprobs


def test_hermes_calls_are_parsed_and_malformed_ones_are_errors_not_exceptions():
    content, calls = parse_hermes('think <tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>')
    assert content == "think" and calls == [{"name": "add", "arguments": {"a": 1}}]
    _, calls = parse_hermes(
        '<tool_call>{"name": "f", "arguments": "{\\"x\\": 2}"}</tool_call>'
    )  # arguments as a JSON string
    assert calls == [{"name": "f", "arguments": {"x": 2}}]
    for bad in (
        "<tool_call>{not json}</tool_call>",
        '<tool_call>{"arguments": {}}</tool_call>',
        '<tool_call>{"name": "f", "arguments": 3}</tool_call>',
        '<tool_call>{"name": "f"',
    ):
        (only,) = parse_hermes(bad)[1]
        assert only["error"].startswith("malformed tool call"), bad
    assert parse_hermes("just an answer: 5") == ("just an answer: 5", [])


def test_an_episode_is_the_generated_ids_with_the_rendered_environment_ids_spliced_in(qwen_dir, scripted):
    """Independent construction: render the whole conversation with the chat template, cut out the text
    between the two assistant turns, tokenize that alone; the trajectory must be the prompt's ids, turn 1's
    generated ids, those environment ids and turn 2's generated ids, exactly, with the action mask on
    the generated ones. Re-tokenising the text would give other ids (</tool_call> is one added token)."""
    Scripted.SCRIPT = [call("add", a=2, b=3), "5"]
    gen, tok, spec = episode_generator(qwen_dir, EnvConfig(tools=["trl_env.py:add"]))
    model = load_model(str(qwen_dir), device="cpu")
    user = [{"role": "user", "content": "2+3?"}]
    prompt = tok.apply_chat_template(user, tools=spec.schemas, tokenize=False, add_generation_prompt=True)
    roll = gen.generate(model, [prompt], 1, SamplerConfig(128, temperature=0))

    (ep,) = roll.episodes
    assert (
        ep.messages
        == [
            {
                "role": "assistant",
                "content": "",
                "tool_calls": [
                    {"type": "function", "id": "call00000", "function": {"name": "add", "arguments": {"a": 2, "b": 3}}}
                ],
            },
            {"role": "tool", "name": "add", "tool_call_id": "call00000", "content": "5"},
            {"role": "assistant", "content": "5"},
        ]
        and ep.turns == 2
        and ep.tool_calls == 1
        and ep.cut is None
    )
    whole = tok.apply_chat_template(user + ep.messages, tools=spec.schemas, tokenize=False)
    turn1, turn2 = Scripted.SCRIPT[0] + "<|im_end|>", "5<|im_end|>"
    between = whole[len(prompt) + len(turn1) : whole.rindex(turn2)]
    assert between == "\n<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
    env_ids = tok(between, add_special_tokens=False)["input_ids"]
    t1, t2 = char_ids(tok, Scripted.SCRIPT[0]) + [1], char_ids(tok, "5") + [1]
    prompt_ids = tok(prompt, add_special_tokens=False)["input_ids"]

    seq = padded(roll)[0][0][padded(roll)[1][0].bool()].tolist()
    assert seq == prompt_ids + t1 + env_ids + t2
    T = roll.completion_len
    assert padded(roll)[2][0, : len(seq) - len(prompt_ids)].tolist() == [1] * len(t1) + [0] * len(env_ids) + [1] * len(
        t2
    )
    assert padded(roll)[2][0].sum() == len(t1) + len(t2) and T == len(t1) + len(env_ids) + len(t2)
    assert seq != tok(whole.rstrip("\n"), add_special_tokens=False)["input_ids"]  # what re-tokenising would train on
    assert roll.completions == ["5"]  # what built-in rewards read: the final answer
    # turn 2 was generated from exactly the ids above, not from re-rendered text
    assert Scripted.contexts[-1] == prompt_ids + t1 + env_ids


def test_environment_tokens_get_no_gradient_and_model_tokens_do(qwen_dir, scripted):
    """d loss / d logits through the policy loss on an episode's action mask: exactly zero at every position
    that predicts an environment token, non-zero at every position predicting a model token."""
    Scripted.SCRIPT = [call("add", a=2, b=3), "5"]
    gen, tok, spec = episode_generator(qwen_dir, EnvConfig(tools=["trl_env.py:add"]))
    model = load_model(str(qwen_dir), device="cpu")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "2+3?"}], tools=spec.schemas, tokenize=False, add_generation_prompt=True
    )
    roll = gen.generate(model, [prompt, prompt], 2, SamplerConfig(128, temperature=0))
    T = roll.completion_len
    logits = model(input_ids=padded(roll)[0], attention_mask=padded(roll)[1]).logits[:, -T - 1 : -1].detach()
    logits.requires_grad_(True)
    logp = logits.log_softmax(-1).gather(-1, padded(roll)[0][:, -T:, None]).squeeze(-1)
    advantages = torch.tensor([1.0, -1.0, 0.5, -0.5])
    loss, _ = policy_loss(
        flat_inputs(
            logp,
            logp.detach() - 0.1,
            advantages,
            padded(roll)[2],
            clip_eps=0.2,
            beta=0.04,
            ref_logp=logp.detach() + 0.2,
        )
    )
    loss.backward()
    per_position = logits.grad.abs().sum(-1)  # [B, T]
    env = (padded(roll)[2] == 0) & padded(roll)[1][:, -T:].bool()
    assert env.sum() > 0 and (per_position[env] == 0).all()
    assert (per_position[padded(roll)[2].bool()] > 0).all()


def test_contexts_shared_by_several_rows_are_prefilled_once_and_continue_as_if_alone():
    """complete() with the same context on several rows (a group's first turn) prefills it once and copies
    its cache: each row's continuation, seeded by its own seed, equals that context continued alone."""
    from grpo_cli.config import SamplerConfig

    tok, model = load_tokenizer("builtin:tiny"), load_model("builtin:tiny", device="cpu")
    a, b = tok("12+34=")["input_ids"], tok("7+8=")["input_ids"]
    gen, batches = HFGenerator(tok), []
    # every forward embeds its ids once, the model's own and a direct decode step's
    model.get_input_embeddings().register_forward_pre_hook(lambda module, args: batches.append(args[0].shape))
    for sampling in (SamplerConfig(8, temperature=0), SamplerConfig(8, temperature=1.0)):
        batches.clear()
        together = gen.complete(model, [a, a, b, a], sampling, [1, 2, 3, 4], with_logprobs=True)
        assert batches[0] == (2, len(a)) and batches[1][0] == 4  # the prefill: a and b once; then every row
        alone = [
            gen.complete(model, [c], sampling, [s], with_logprobs=True)[0] for c, s in zip([a, a, b, a], [1, 2, 3, 4])
        ]
        assert [ids for ids, _, _ in together] == [ids for ids, _, _ in alone]
        for (_, lp, _), (_, lp_alone, _) in zip(together, alone):
            assert lp == pytest.approx(lp_alone, abs=1e-5)
    assert len({tuple(ids) for ids, _, _ in together}) > 1  # the seeds differ, so do the samples


def test_a_two_turn_episode_scored_in_one_forward_equals_each_turn_scored_after_its_own_prefix(qwen_dir, scripted):
    Scripted.SCRIPT = [call("add", a=12, b=30), "the sum is 42"]
    gen, tok, spec = episode_generator(qwen_dir, EnvConfig(tools=["trl_env.py:add"]))
    model = load_model(str(qwen_dir), device="cpu")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "12+30?"}], tools=spec.schemas, tokenize=False, add_generation_prompt=True
    )
    roll = gen.generate(model, [prompt], 1, SamplerConfig(128, temperature=0))
    T = roll.completion_len
    with torch.no_grad():
        one, _ = token_logprobs(model, padded(roll)[0], padded(roll)[1], T)
    seq = padded(roll)[0][0].tolist()
    action = padded(roll)[2][0].tolist()
    P = padded(roll)[0].shape[1] - T
    turns, current = [], []
    for t, a in enumerate(action):  # runs of model tokens
        if a:
            current.append(t)
        elif current:
            turns.append(current)
            current = []
    turns.append(current)
    assert len(turns) == 2
    for positions in turns:
        prefix = seq[: P + positions[0]]
        ids = torch.tensor([prefix + [seq[P + t] for t in positions]])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].float()
        expected = [logits[len(prefix) - 1 + k].log_softmax(-1)[seq[P + t]].item() for k, t in enumerate(positions)]
        torch.testing.assert_close(one[0, positions], torch.tensor(expected), atol=2e-5, rtol=0)


def test_a_trl_tool_list_and_environment_class_train_unchanged(qwen_dir, scripted, tmp_path):
    """Counter (tests/inputs/trl_env.py) as TRL's environment_factory, add as a standalone tool: reset() text
    joins the prompt, both methods are tools, get_reward() is a reward term named Counter (weight 1), and the
    whole transcript reaches completions.jsonl; the episodes' environment calls are counted."""
    from grpo_cli.run.trainer import train

    Scripted.SCRIPT = [call("increment", step=3), call("read"), call("add", a=1, b=2), "done"]
    load_function("trl_env.py:Counter", str(INPUTS)).prompts.clear()
    cfg = small_cfg(
        tmp_path, qwen_dir, tools=["trl_env.py:add"], factory="trl_env.py:Counter", max_turns=4, max_tokens=400
    )
    cfg.reward.name = (
        "exact_match"  # named, so it adds to the environment's reward (reward=auto would be Counter's alone)
    )
    train(cfg, tmp_path, Console(progress=False))
    rows = metric_rows(tmp_path, training=True)
    assert len(rows) == 2
    for r in rows:
        assert r["env/turns"] == 4 and r["env/tool_calls"] == 3 and r["env/tool_use_frac"] == 1.0
        assert r["env/errors"] == 0 and r["env/timeouts"] == 0 and r["env/cut_turns_frac"] == 0
        assert "reward/Counter" in r and "reward/exact_match" in r
        assert r["reward_mean"] == pytest.approx(r["reward/Counter"] + r["reward/exact_match"])
    logged = read_jsonl(tmp_path / "completions.jsonl")
    assert len(logged) == 2 * 2 * 2
    for row in logged:
        roles = [m["role"] for m in row["messages"]]
        assert roles == ["assistant", "tool", "assistant", "tool", "assistant", "tool", "assistant"]
        assert [m["content"] for m in row["messages"] if m["role"] == "tool"] == ["counter is 3", "3", "3"]
        assert row["reward"] == float(row["answer"] == "3") + 0.0  # Counter: value 3 == answer; "done" has no number
        assert "[tool increment] counter is 3" in row["completion"]
    # reset() got the prompt as the user wrote it; its text went onto the user's message
    counter = load_function("trl_env.py:Counter", str(INPUTS))
    assert len(counter.prompts) == 8 and all(p.endswith("=") and "<|im_start|>" not in p for p in counter.prompts)
    first = Scripted.contexts[0]
    assert " (start at 0)<|im_end|>" in load_tokenizer(str(qwen_dir)).decode(first)
    # each turn's distinct contexts, whole: what the generator prefills (a group's identical first turns once)
    assert sum(r["multiturn/prefill_tokens"] for r in rows) == sum(
        sum(map(len, set(map(tuple, call)))) for call in Scripted.calls
    )
    assert len(Scripted.contexts) == 2 * 4 * 4 and len(Scripted.calls) == 2 * 4  # 2 steps x 4 episodes x 4 turns
    assert len(set(map(tuple, Scripted.calls[0]))) == 2  # the first turn: 2 prompts x G=2, prefilled twice, not 4 times


def test_tools_that_raise_hang_or_return_non_strings_leave_the_run_going_and_are_counted(qwen_dir, scripted, tmp_path):
    from grpo_cli.run.trainer import train

    Scripted.SCRIPT = [
        call("broken", x=1)
        + "\n"
        + call("slow", x=1)
        + "\n"
        + call("numbers", n=3)
        + "\n"
        + call("nope")
        + "\n<tool_call>{oops</tool_call>\n"
        + call("quits", x=1)
        + "\n"
        + call("fetch", key="k"),
        "5",
    ]
    cfg = small_cfg(
        tmp_path,
        qwen_dir,
        tools=["trl_env.py:broken", "trl_env.py:slow", "trl_env.py:numbers", "trl_env.py:quits", "trl_env.py:fetch"],
        timeout_s=0.3,
        max_tokens=1000,
    )
    cfg.trainer.steps, cfg.sampler.max_new_tokens = 1, 600
    train(cfg, tmp_path, Console(progress=False))
    (r,) = metric_rows(tmp_path, training=True)
    assert r["env/tool_calls"] == 7 and r["env/errors"] == 4 and r["env/timeouts"] == 1 and r["env/non_string"] == 1
    assert r["env/turns"] == 2 and r["env/call_seconds"] >= 0.3 * 4  # each of 4 episodes waited out the slow tool
    assert 0.3 <= r["env/seconds"] < r["env/call_seconds"]  # concurrently: the phase's wall time, not the sum
    tool_messages = [
        m["content"] for m in read_jsonl(tmp_path / "completions.jsonl")[0]["messages"] if m["role"] == "tool"
    ]
    assert tool_messages[0] == str({"error": "cannot handle 1"})  # TRL's wording
    assert tool_messages[1] == str({"error": "timed out after 0.3 s"})
    assert tool_messages[2] == "[0, 1, 2]"
    assert tool_messages[3] == str({"error": "Tool nope not found."})
    assert tool_messages[4].startswith("{'error': ") and "malformed tool call" in tool_messages[4]
    assert tool_messages[5] == str({"error": "called sys.exit(1)"})  # a tool cannot end the run
    assert tool_messages[6] == "value of k"  # an async tool is awaited


def test_a_step_environment_plays_turns_until_done_on_plain_prompts(qwen_dir, scripted, tmp_path):
    """Guess: each turn's text goes to step(); "higher"/"lower" come back as the next user message; the
    rewards of the steps are the Guess term; an episode that never gets it right is cut at max_turns."""
    gen, tok, spec = episode_generator(qwen_dir, EnvConfig(factory="trl_env.py:Guess", max_turns=3))
    assert spec.kind == "step" and spec.reward_name == "Guess"
    model = load_model(str(qwen_dir), device="cpu")
    Scripted.SCRIPT = ["10", "20", "7"]
    prompt = tok.apply_chat_template([{"role": "user", "content": "guess"}], tokenize=False, add_generation_prompt=True)
    roll = gen.generate(model, [prompt, prompt], 1, SamplerConfig(16, temperature=0), columns={"answer": ["7", "99"]})
    right, never = roll.episodes
    assert [m["content"] for m in right.messages] == ["10", "lower", "20", "lower", "7"]
    assert right.reward == 1.0 and right.cut is None and right.turns == 3
    assert never.reward == 0.0 and never.cut == "turns" and roll.truncated.tolist() == [False, True]


def test_episodes_are_seeded_so_environments_that_draw_random_numbers_repeat(qwen_dir, scripted):
    Scripted.SCRIPT = [call("read"), "0"]
    gen, tok, spec = episode_generator(qwen_dir, EnvConfig(factory="trl_env.py:Counter"))
    model = load_model(str(qwen_dir), device="cpu")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "x"}], tools=spec.schemas, tokenize=False, add_generation_prompt=True
    )
    salts = [
        [
            ep.environment.salt
            for ep in gen.generate(
                model, [prompt], 3, SamplerConfig(32), [11], columns={"answer": ["0"], "_user_prompt": ["x"]}
            ).episodes
        ]
        for _ in range(2)
    ]
    assert salts[0] == salts[1] and len(set(salts[0])) == 3  # the same per episode, different between episodes


@pytest.mark.parametrize(
    "override,message",
    [
        ("env.tools=[missing.py:f]", "env.tools=missing.py:f: there is no file"),
        ("env.max_turns=0", "env.max_turns=0 must be >= 1"),
        ("env.timeout_s=0", "env.timeout_s=0.0 must be > 0"),
        ("env.tool_format=json", "env.tool_format='json' must be one of auto, schema, qwen3_coder, glm, hermes"),
    ],
)
def test_env_mistakes_are_one_sentence_before_any_model_loads(override, message, tmp_path, capsys):
    assert grpo("train", f"output_dir={tmp_path}", "data.chat_template=true", override) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_tools_without_the_chat_template_and_an_environment_without_reset_are_refused(tmp_path, capsys):
    assert grpo("train", f"output_dir={tmp_path / 'a'}", f"env.fn_dir={INPUTS}", "env.tools=[trl_env.py:add]") == 2
    assert "env.tools needs the chat template" in capsys.readouterr().err
    (tmp_path / "envs.py").write_text("class NoReset:\n    def look(self) -> str:\n        return 'x'\n")
    assert (
        grpo(
            "train",
            f"output_dir={tmp_path / 'b'}",
            f"env.fn_dir={tmp_path}",
            "env.factory=envs.py:NoReset",
            "data.chat_template=true",
            "model.path=builtin:tiny-tools",
        )
        == 2
    )
    assert "NoReset has no reset method" in capsys.readouterr().err
    (tmp_path / "tools.py").write_text("def f(x):\n    return x\n")
    assert (
        grpo(
            "train",
            f"output_dir={tmp_path / 'c'}",
            f"env.fn_dir={tmp_path}",
            "env.tools=[tools.py:f]",
            "data.chat_template=true",
            "model.path=builtin:tiny-tools",
        )
        == 2
    )
    err = capsys.readouterr().err
    assert "'f' cannot be shown to the model as a tool" in err and "Traceback" not in err


TOOL_RUN = [
    "experiment=tool_use",
    "trainer.prompts_per_step=4",
    "sampler.group_size=4",
    "trainer.micro_batch_size=8",
    "trainer.eval_before_after=false",
    "trainer.eval_every=0",
    "trainer.progress=false",
    "trainer.log_completions_every=1",
    "algo.num_iterations=2",
    "trainer.threads=1",
]


def test_the_tool_use_demo_resumes_bitwise_and_is_evaluated_and_sampled_as_episodes(tmp_path, capsys):
    """4 steps straight == 2 steps then resume=auto to 4 (weights and metrics rows, the calculator's episodes
    included); `grpo evaluate` of the run reports turns and tool use; `grpo sample` prints the transcript."""
    from safetensors.torch import load_file

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    assert grpo("train", f"output_dir={straight}", "trainer.steps=4", *TOOL_RUN) == 0
    assert grpo("train", f"output_dir={resumed}", "trainer.steps=2", *TOOL_RUN) == 0
    assert grpo("train", f"output_dir={resumed}", "trainer.steps=4", "resume=auto", *TOOL_RUN) == 0
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(resumed / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    rows = metric_rows(straight, timing=False)
    assert rows == metric_rows(resumed, timing=False) and [r["step"] for r in rows] == [1, 2, 3, 4]
    assert all(r["env/tool_calls"] > 0 and r["env/turns"] > 1 for r in rows)
    logged = read_jsonl(straight / "completions.jsonl")
    calls = [r for r in logged if r["tool_calls"]]
    assert calls and all("[tool add]" in r["completion"] and r["messages"][1]["role"] == "tool" for r in calls)
    for r in calls:  # the tool's result is the sum of the arguments the model wrote
        args = r["messages"][0]["tool_calls"][0]["function"]["arguments"]
        assert r["messages"][1]["content"] == str(args["a"] + args["b"])
    capsys.readouterr()

    assert (
        grpo(
            "evaluate",
            f"checkpoint={straight}/final",
            "limit=20",
            "samples=2",
            "k=[1,2]",
            f"output_dir={tmp_path / 'eval'}",
        )
        == 0
    )
    (row,) = json.loads((tmp_path / "eval" / "eval.json").read_text())["rows"]
    assert {"turns", "tool_use_frac", "tool_calls", "accuracy", "pass@2"} <= row.keys() and row["turns"] >= 1
    assert (
        grpo(
            "sample",
            f"checkpoint={straight}/final",
            "prompt='347+589='",
            "answer=936",
            "sampler.group_size=3",
            f"output={tmp_path / 's.jsonl'}",
        )
        == 0
    )
    out = capsys.readouterr().out
    samples = read_jsonl(tmp_path / "s.jsonl")
    assert len(samples) == 3 and all("messages" in s and "turns" in s for s in samples)
    assert "[assistant]" in out  # the transcript, a line per message
    for s in samples:  # the reward is the final answer's
        assert s["reward"] == float(s["messages"][-1]["content"].strip() == "936")


def test_the_docs_tools_and_environment_run_as_written(tmp_path, monkeypatch):
    """docs/how-to/tools.md: its my_tools.py (a TRL tool and a TRL environment class) trains one step as it is,
    on the built-in tool model (the page's commands name a hub model, which this machine cannot fetch)."""
    from pathlib import Path

    text = (Path(__file__).resolve().parents[2] / "docs" / "how-to" / "tools.md").read_text()
    code = text[text.index("cat > my_tools.py <<'EOF2'") :].split("\n", 1)[1].split("\nEOF2\n", 1)[0]
    (tmp_path / "my_tools.py").write_text(code + "\n")
    monkeypatch.chdir(tmp_path)
    assert (
        grpo(
            "train",
            "experiment=tool_use",
            "env.tools=[my_tools.py:multiply]",
            "env.factory=my_tools.py:Counter",
            "output_dir=run",
            *TOOL_RUN,
            "trainer.steps=1",
        )
        == 0
    )
    (row,) = metric_rows(tmp_path / "run", training=True)
    assert "reward/Counter" in row and "env/turns" in row


@pytest.mark.parametrize(
    "extra",
    [["model.lora.r=4", "optimizer.lr=3e-3"], ["algo.behaviour=lagged", "algo.behaviour_refresh=2"]],
    ids=["lora", "lagged-behaviour"],
)
def test_episodes_train_under_lora_and_off_policy(extra, tmp_path):
    """LoRA (the reference is the base with the adapter off) and a lagged behaviour policy (its log-probs
    recomputed over whole episodes) both train the tool demo; the behaviour KL is measured on model tokens."""
    assert grpo("train", f"output_dir={tmp_path}", *TOOL_RUN, "trainer.steps=3", *extra) == 0
    rows = metric_rows(tmp_path, training=True)
    assert len(rows) == 3 and all(r["env/tool_calls"] > 0 and math.isfinite(r["loss"]) for r in rows)
    assert all(math.isfinite(r["kl_behaviour"]) and r["kl_behaviour"] >= 0 for r in rows)
    if "model.lora.r=4" in extra:
        assert (tmp_path / "final" / "adapter" / "adapter_config.json").exists()


def test_episodes_longer_than_the_model_s_positions_are_warned_about_before_training(tmp_path, capsys):
    """builtin:tiny-tools has 256 positions; a longest prompt of 8 tokens plus env.max_tokens=300 does not fit."""
    assert (
        grpo(
            "train",
            f"output_dir={tmp_path}",
            *TOOL_RUN,
            "trainer.steps=1",
            "env.max_tokens=300",
            "data.num_train=50",
            "data.num_test=10",
        )
        == 0
    )
    err = capsys.readouterr().err
    assert "plus env.max_tokens=300 exceeds the model's 256 positions; lower env.max_tokens to 248 or less." in err
    assert (
        grpo(
            "train",
            f"output_dir={tmp_path / 'fits'}",
            *TOOL_RUN,
            "trainer.steps=1",
            "data.num_train=50",
            "data.num_test=10",
        )
        == 0
    )
    assert "exceeds the model's" not in capsys.readouterr().err


def test_a_50_mb_tool_result_is_cut_before_it_is_rendered_or_tokenized(qwen_dir, scripted, tmp_path):
    """Tokenizing a 50 MB result took more than 8 GiB before; it is cut to what env.max_tokens could hold (8
    characters a token), with a marker, and counted: the step takes under 2 s more and 200 MB more at most."""
    import resource
    import time

    (tmp_path / "big.py").write_text(
        'def big(n: int) -> str:\n    """A long text.\n\n    Args:\n        n: its length\n'
        '    """\n    return "x" * n\n'
    )
    tok = load_tokenizer(str(qwen_dir))
    settings = TrainConfig().generator
    settings.name = "scripted"
    spec = EnvSpec(EnvConfig(tools=["big.py:big"], max_tokens=256), str(tmp_path))
    gen = with_env(
        make_generator(settings, tok, chat_template=True, precision=None, device="cpu"), spec, tok, chat_template=True
    )
    model = load_model(str(qwen_dir), device="cpu")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "go"}], tools=spec.schemas, tokenize=False, add_generation_prompt=True
    )
    seconds, episodes = [], []
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    for n in (10, 50_000_000):
        Scripted.SCRIPT = [call("big", n=n), "ok"]
        start = time.perf_counter()
        (ep,) = gen.generate(model, [prompt], 1, SamplerConfig(128, temperature=0)).episodes
        seconds.append(time.perf_counter() - start)
        episodes.append(ep)
    grown_mib = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - peak) / 1024
    small, huge = episodes
    assert small.truncated_results == 0 and small.messages[1]["content"] == "x" * 10
    assert huge.truncated_results == 1 and huge.cut == "tokens"  # 2 KB of x's is more than 256 character tokens
    assert len(huge.ids) <= 256 and len(huge.messages) == 1  # the result never entered the episode
    assert gen.bounded(small, "y" * 3000) == "y" * 2048 + "... [truncated: 952 more characters]"
    assert seconds[1] - seconds[0] < 2.0, seconds
    assert grown_mib < 200, f"{grown_mib:.0f} MiB more at the peak"
