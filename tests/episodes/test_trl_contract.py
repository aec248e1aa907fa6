"""TRL's data contract for agents, point by point (TRL 1.16's GRPOTrainer with tools and environments)."""

from __future__ import annotations

import json
import shutil

import pytest
from episode_kit import INPUTS, QWEN_TEMPLATE, Scripted, call, episode_generator, small_cfg

from grpo_cli.config import EnvConfig, SamplerConfig
from grpo_cli.episodes.episode import Episode
from grpo_cli.episodes.kinds import tool_messages
from grpo_cli.errors import GrpoError
from grpo_cli.models.loading import load_model, load_tokenizer
from grpo_cli.run.console import Console
from helpers import grpo, metric_rows, read_jsonl

# Qwen's tool template, but a tool message's content may be a list of parts (text, and an image marker)
PARTS_TEMPLATE = QWEN_TEMPLATE.replace(
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}",
    "{{- '\\n<tool_response>\\n' }}{%- if m.content is string %}{{- m.content }}{%- else %}"
    "{%- for p in m.content %}{%- if p.type == 'text' %}{{- p.text }}{%- else %}{{- '<image>' }}{%- endif %}"
    "{%- endfor %}{%- endif %}{{- '\\n</tool_response>' }}",
)


def tool_episode(model_dir, script: list[str], **env):
    Scripted.SCRIPT = script
    gen, tok, spec = episode_generator(model_dir, EnvConfig(tools=["trl_env.py:look"], **env))
    model = load_model(str(model_dir), device="cpu")
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "x"}], tools=spec.schemas, tokenize=False, add_generation_prompt=True
    )
    return gen.generate(model, [prompt], 1, SamplerConfig(96, temperature=0), columns={"answer": ["0"]}).episodes[
        0
    ], tok


def test_a_tool_result_given_as_content_parts_is_kept_as_parts(qwen_dir, scripted, tmp_path):
    """TRL passes a list result through as the message's content; so does grpo: the transcript keeps the
    parts, the template renders them, and a text part is still bounded by env.max_tokens."""
    parts_dir = tmp_path / "parts"
    shutil.copytree(qwen_dir, parts_dir)
    config = json.loads((parts_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = PARTS_TEMPLATE
    (parts_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (parts_dir / "chat_template.jinja").unlink(missing_ok=True)
    ep, tok = tool_episode(parts_dir, [call("look", thing="cat"), "done"], max_tokens=400)
    tool = ep.messages[1]
    assert tool["content"] == [{"type": "text", "text": "a picture of cat"}, {"type": "image", "url": "file://cat.png"}]
    assert "<tool_response>\na picture of cat<image>\n</tool_response>" in tok.decode(ep.ids)
    assert "[tool look] a picture of cat[image]" in ep.transcript() and ep.non_string == 0

    # a text part longer than env.max_tokens could hold (8 characters a token) is cut; the other parts are kept
    gen, _, _ = episode_generator(parts_dir, EnvConfig(tools=["trl_env.py:look"], max_tokens=400))
    ep = Episode(prompt_ids=[], seed=0)
    (message,) = tool_messages(gen, ep, [{"name": "look", "arguments": {"thing": "cat", "times": 1000}}], ["call00000"])
    text = message["content"][0]["text"]
    assert len(text) < 3300 and text.endswith("... [truncated: 12,800 more characters]")
    assert ep.truncated_results == 1 and message["content"][1] == {"type": "image", "url": "file://cat.png"}


def test_a_template_that_cannot_render_parts_is_one_sentence(qwen_dir, scripted):
    with pytest.raises(GrpoError, match="cannot render a tool result given as a list of content parts"):
        tool_episode(qwen_dir, [call("look", thing="cat"), "done"], max_tokens=400)


def test_an_environment_that_scores_is_the_whole_reward_unless_a_reward_is_named(qwen_dir, scripted, tmp_path):
    """reward=auto (the default) with an environment that has get_reward(): its term alone, as TRL scores with
    an environment_factory and no reward_funcs; the answer column adds nothing. Naming a reward adds it."""
    from grpo_cli.config import RewardConfig
    from grpo_cli.episodes.environments import EnvSpec
    from grpo_cli.rewards import reward_with

    spec = EnvSpec(EnvConfig(factory="trl_env.py:Counter"), str(INPUTS))
    assert list(reward_with(RewardConfig(), spec).terms) == ["Counter"]
    assert list(reward_with(RewardConfig(name="exact_match"), spec).terms) == ["exact_match", "Counter"]
    assert list(reward_with(RewardConfig(name="none"), spec).terms) == ["Counter"]
    tools_only = EnvSpec(EnvConfig(tools=["trl_env.py:add"]), str(INPUTS))
    assert list(reward_with(RewardConfig(), tools_only).terms) == ["exact_match"]  # nothing else scores
    assert list(reward_with(RewardConfig(), None).terms) == ["exact_match"]
    with pytest.raises(
        GrpoError, match="reward=none leaves the scoring to the environment, but there is no env.factory"
    ):
        reward_with(RewardConfig(name="none"), tools_only)


def test_data_none_trains_an_environment_that_writes_its_own_prompts(qwen_dir, scripted, tmp_path):
    """data=none: every prompt is an empty user message, as TRL's placeholder; reset() gets it (and no answer
    column) and its text is the observation; the environment's reward is the only term; each episode,
    held-out ones included, draws its own task."""
    from grpo_cli.registry import load_function
    from grpo_cli.run.trainer import train

    doubling = load_function("trl_env.py:Doubling", str(INPUTS))
    doubling.resets.clear()
    Scripted.SCRIPT = [call("answer", value=4), "done"]
    cfg = small_cfg(tmp_path, qwen_dir, factory="trl_env.py:Doubling", max_turns=2, max_tokens=200)
    cfg.data.name, cfg.data.answer_field, cfg.data.num_train, cfg.data.num_test = "none", "_answer", 8, 4
    cfg.trainer.eval_before_after, cfg.trainer.eval_prompts = True, 4
    train(cfg, tmp_path, Console(progress=False))
    rows = metric_rows(tmp_path, training=True)
    assert len(rows) == 2 and all("reward/Doubling" in r and "reward/exact_match" not in r for r in rows)
    assert all(kwargs == {"prompt": [{"role": "user", "content": ""}]} for kwargs in doubling.resets)
    tok = load_tokenizer(str(qwen_dir))
    asked = [tok.decode(c) for c in Scripted.contexts if tok.decode(c).count("<|im_start|>assistant") == 1]
    assert asked and all("<|im_start|>user\nWhat is " in a and " doubled? Call answer.<|im_end|>" in a for a in asked)
    tasks = {a.split("What is ")[1].split(" doubled")[0] for a in asked}
    # 8 training episodes and 20 held-out ones (4 greedy, 4 x 4 sampled), each its own number; the held-out
    # evaluation after training asks the same 20 as the one before
    assert len(asked) == 8 + 2 * 20 and len(tasks) == 8 + 20


@pytest.mark.parametrize(
    "overrides,message",
    [
        (["data=none"], "data=none has no prompts of its own: an environment's reset() writes each one"),
        (["data=none", "env.factory=x.py:E", "reward=exact_match"], "data=none has no answers for reward exact_match"),
        (["reward=none"], "reward=none leaves the scoring to an environment, and there is none"),
    ],
)
def test_no_data_and_no_reward_mistakes_are_one_sentence_before_any_model_loads(overrides, message, tmp_path, capsys):
    assert grpo("train", f"output_dir={tmp_path}", *overrides) == 2
    assert message in capsys.readouterr().err


def test_a_dict_of_environments_gives_each_row_its_own_with_its_own_tools_and_reward(qwen_dir, scripted, tmp_path):
    """TRL's dict of environment factories: each row's `environment` column picks its environment; its prompt
    shows that environment's tools alone; each class that scores is its own term, scoring its episodes only."""
    from grpo_cli.registry import load_function
    from grpo_cli.run.trainer import train

    rows = [
        {"prompt": f"{i}+1=", "answer": str(i + 1), "environment": "count" if i % 2 else "double"} for i in range(8)
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    load_function("trl_env.py:Doubling", str(INPUTS)).resets.clear()
    Scripted.SCRIPT = [call("answer", value=4), "done"]
    cfg = small_cfg(
        tmp_path / "run",
        qwen_dir,
        factory={"count": "trl_env.py:Counter", "double": "trl_env.py:Doubling"},
        max_turns=2,
        max_tokens=400,
    )
    cfg.data.name, cfg.data.train_file, cfg.data.test_size = "files", str(tmp_path / "rows.jsonl"), 2
    train(cfg, tmp_path / "run", Console(progress=False))
    metrics = metric_rows(tmp_path / "run", training=True)
    assert all({"reward/Counter", "reward/Doubling"} <= r.keys() and "reward/exact_match" not in r for r in metrics)
    tok = load_tokenizer(str(qwen_dir))
    for context in (tok.decode(c) for c in Scripted.contexts if tok.decode(c).count("<|im_start|>assistant") == 1):
        counting = "(start at 0)" in context  # Counter's reset() text; Doubling's asks for a number doubled
        assert counting != ("doubled?" in context)
        assert ('"name": "increment"' in context) == counting and ('"name": "answer"' in context) != counting
    logged = read_jsonl(tmp_path / "run" / "completions.jsonl")
    for r in logged:  # answer() is Doubling's tool: Counter's episodes are told it is not theirs
        doubling = int(r["prompt"].split("+")[0]) % 2 == 0
        assert r["messages"][1]["content"] == ("noted" if doubling else str({"error": "Tool answer not found."}))
    assert {int(r["prompt"].split("+")[0]) % 2 for r in logged} == {0, 1}


def test_several_environments_are_checked_as_one_sentence_each(tmp_path):
    from grpo_cli.episodes.environments import environment

    both = environment(
        EnvConfig(factory={"count": "trl_env.py:Counter", "double": "trl_env.py:Doubling"}, fn_dir=str(INPUTS))
    )
    assert both.kind == "tools" and both.reward_name == "Counter, Doubling"
    assert {s["function"]["name"] for s in both.schemas} == {"increment", "read", "answer"}
    with pytest.raises(
        GrpoError, match="A row's 'environment' is 'chess', not one of env.factory's \\['count', 'double'\\]"
    ):
        both.new({"environment": "chess"})
    with pytest.raises(GrpoError, match="env.factory mixes step environments and tool-calling ones"):
        environment(EnvConfig(factory={"count": "trl_env.py:Counter", "guess": "trl_env.py:Guess"}, fn_dir=str(INPUTS)))


def test_the_python_api_takes_a_dict_of_environment_factories():
    from grpo_cli.api import _env_overrides
    from grpo_cli.commands.compose import compose_config
    from grpo_cli.registry import load_function

    counter, doubling = (load_function(f"trl_env.py:{n}", str(INPUTS)) for n in ("Counter", "Doubling"))
    (override,) = _env_overrides(None, {"count": counter, "double": doubling})
    factory = compose_config("train", [override, "data.chat_template=true"]).env.factory
    assert list(factory) == ["count", "double"]
    assert [load_function(spec) for spec in factory.values()] == [counter, doubling]
