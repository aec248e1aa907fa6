"""Extension in one file: a tool-call format, an environment kind, a generator back-end, a reward, an advantage
estimator and a loss, each written in a file outside the package (tests/inputs/extensions/) and named by
`plugins=[...]`, which imports it before the config is composed and checked; a one-step run then uses it."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from episode_kit import QWEN_TEMPLATE, Scripted, build_qwen_dir, small_cfg

from grpo_cli.config import TrainConfig
from grpo_cli.run.console import Console
from grpo_cli.run.trainer import train
from helpers import FAST, grpo_process, metric_rows, read_jsonl

EXT = Path(__file__).resolve().parents[1] / "inputs" / "extensions"


@pytest.fixture(autouse=True)
def registries_as_they_were():
    """A plugin registers into the package's registries for the life of the process: each test here leaves them,
    and the modules it imported, as it found them, so no other test sees a name it did not register."""
    from grpo_cli.algo.advantages import ADVANTAGES
    from grpo_cli.algo.losses import POLICY_LOSSES
    from grpo_cli.episodes.kinds import ENV_KINDS
    from grpo_cli.episodes.tool_formats import TOOL_FORMATS
    from grpo_cli.generate.base import GENERATORS
    from grpo_cli.rewards import BUILDERS, MAX_VALUE

    tables = [ADVANTAGES, POLICY_LOSSES, ENV_KINDS, TOOL_FORMATS, GENERATORS, BUILDERS, MAX_VALUE]
    saved, modules = [dict(t) for t in tables], set(sys.modules)
    yield
    for table, before in zip(tables, saved):
        table.clear()
        table.update(before)
    for name in set(sys.modules) - modules:
        if str(getattr(sys.modules[name], "__file__", "")).startswith(str(EXT)):
            del sys.modules[name]


def module_of(path: Path):
    """The module `plugins=` imported from `path` (named after the file, whatever the process)."""
    return next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(path))


def tiny_run(tmp_path, plugin: str) -> TrainConfig:
    cfg = TrainConfig(output_dir=str(tmp_path))
    t = cfg.trainer
    t.steps, t.prompts_per_step, t.eval_before_after, t.eval_every, t.progress, t.threads = 1, 2, False, 0, False, 1
    t.log_completions_every, t.log_completions_groups = 1, 2
    cfg.sampler.group_size, cfg.sampler.max_new_tokens = 4, 8
    cfg.data.max_operand, cfg.data.num_test = 9, 20
    cfg.plugins = [str(EXT / plugin)]
    return cfg


def test_a_loss_of_one_s_own_with_its_own_setting(tmp_path):
    cfg = tiny_run(tmp_path, "scaled_loss.py")
    cfg.algo.loss, cfg.algo.loss_args, cfg.algo.beta = "scaled_pg", {"scale": 2.0}, 0.0
    train(cfg, tmp_path, Console(progress=False))
    (row,) = metric_rows(tmp_path, training=True)
    assert row["scaled_pg_weight"] == 2.0 and row["loss"] != 0.0


def test_an_advantage_estimator_of_one_s_own(tmp_path):
    cfg = tiny_run(tmp_path, "rank_advantage.py")
    cfg.algo.advantage = "rank"
    train(cfg, tmp_path, Console(progress=False))
    assert module_of(EXT / "rank_advantage.py").SEEN[-1] == (2, 4)  # [prompts, G]: the step asked it
    # worked by hand: ranks 0, 1.5, 1.5, 3 of scores 0, 1, 1, 2 over k - 1 = 3, centred
    ranked = module_of(EXT / "rank_advantage.py").ranked
    import torch

    out = ranked(torch.tensor([[0.0, 1.0, 1.0, 2.0], [1.0, float("nan"), 1.0, 1.0]]), None)
    assert out.tolist() == [[-1.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]]


def test_a_reward_of_one_s_own(tmp_path):
    cfg = tiny_run(tmp_path, "brevity_reward.py")
    cfg.reward.name = "brevity"
    train(cfg, tmp_path, Console(progress=False))
    assert "reward/brevity" in metric_rows(tmp_path, training=True)[0]
    for s in read_jsonl(tmp_path / "completions.jsonl"):  # min(1, 4 / characters), worked per completion
        assert s["reward"] == pytest.approx(min(1.0, 4 / max(len(s["completion"]), 1)))


def test_a_generator_back_end_of_one_s_own_through_the_cli(tmp_path):
    """`generator=greedy` is an option only once the plugin is imported: the CLI imports plugins first (in a
    fresh process, so nothing imported it before)."""
    run = tmp_path / "run"
    grpo_process(
        "train",
        *FAST,
        f"plugins=[{EXT / 'greedy_generator.py'}]",
        "generator=greedy",
        "trainer.steps=1",
        "trainer.log_completions_every=1",
        f"output_dir={run}",
        check_rc=0,
    )
    rows = read_jsonl(run / "completions.jsonl")
    by_prompt: dict[str, set] = {}
    for r in rows:
        by_prompt.setdefault(r["prompt"], set()).add(r["completion"])
    assert rows and all(len(c) == 1 for c in by_prompt.values())  # greedy: a group's completions are one


@pytest.fixture
def bracket_dir(tmp_path_factory):
    """The agent tests' model, its chat template writing each call as `CALL name {arguments}`."""
    out = build_qwen_dir(tmp_path_factory.mktemp("bracket"))
    template = QWEN_TEMPLATE.replace(
        '\'<tool_call>\\n{"name": "\' + c.function.name + \'", "arguments": \' }}', "'CALL ' + c.function.name + ' ' }}"
    ).replace("{{- '}\\n</tool_call>' }}", "")
    assert "CALL" in template and "<tool_call>" not in template
    config = json.loads((out / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (out / "tokenizer_config.json").write_text(json.dumps(config))
    (out / "chat_template.jinja").unlink(missing_ok=True)
    return out


def test_a_tool_call_format_of_one_s_own(bracket_dir, scripted, tmp_path):
    Scripted.SCRIPT = ['CALL add {"a": 1, "b": 2}', "done"]
    cfg = small_cfg(tmp_path, bracket_dir, tools=["trl_env.py:add"], max_turns=3, max_tokens=300)
    cfg.trainer.steps, cfg.reward.name = 1, "exact_match"
    cfg.plugins = [str(EXT / "bracket_format.py")]  # env.tool_format=auto finds it in the template
    train(cfg, tmp_path, Console(progress=False))
    (row,) = metric_rows(tmp_path, training=True)
    assert row["env/tool_calls"] == 1 and row["env/errors"] == 0  # parsed by the plugin's format, and run
    transcript = read_jsonl(tmp_path / "completions.jsonl")[0]["messages"]
    assert [m["role"] for m in transcript[-3:]] == ["assistant", "tool", "assistant"]
    assert transcript[-2]["content"] == "3"


def test_an_environment_kind_of_one_s_own(tmp_path):
    cfg = tiny_run(tmp_path, "guess_kind.py")
    cfg.env.factory, cfg.env.fn_dir, cfg.env.max_turns, cfg.env.max_tokens = "guess_kind.py:Guess", str(EXT), 2, 64
    train(cfg, tmp_path, Console(progress=False))
    (row,) = metric_rows(tmp_path, training=True)
    assert "reward/Guess" in row and row["env/turns"] >= 1  # the kind's reward is the environment's term
    assert module_of(EXT / "guess_kind.py").Guess.replies  # the partner read the model's turns
    for s in read_jsonl(tmp_path / "completions.jsonl"):
        assert s["reward"] in (0.0, 1.0)


def test_a_plugin_that_is_not_there_is_one_sentence(tmp_path, capsys):
    from helpers import grpo

    assert grpo("train", "plugins=[no_such_plugin.py]", f"output_dir={tmp_path / 'run'}") == 2
    err = capsys.readouterr().err
    assert "plugins='no_such_plugin.py': there is no file" in err and "Traceback" not in err
    assert not (tmp_path / "run").exists()


def test_a_builder_receives_settings_fixed_at_the_edge(tmp_path):
    """The run's config is frozen once checked: a reward's builder that tries to change its settings is refused,
    and so is a change to the run's config after the run."""
    from dataclasses import FrozenInstanceError

    plugin = tmp_path / "meddling_reward.py"
    plugin.write_text(
        "from grpo_cli.rewards import register_reward\n"
        "SEEN = []\n"
        "def build(cfg):\n"
        "    try:\n"
        "        cfg.weights = [2.0]\n"
        "    except Exception as e:\n"
        "        SEEN.append(type(e).__name__)\n"
        "    return lambda batch: [0.0] * len(batch.completions)\n"
        "register_reward('meddling', build, max_value=1.0)\n"
    )
    cfg = tiny_run(tmp_path / "run", "brevity_reward.py")
    cfg.plugins, cfg.reward.name = [str(plugin)], "meddling"
    train(cfg, tmp_path / "run", Console(progress=False))
    assert module_of(plugin).SEEN == ["FrozenInstanceError"]
    with pytest.raises(FrozenInstanceError):
        cfg.trainer.steps = 2
