"""data=reasoning_gym: reasoning-gym's procedural problems as rows, held out from a seed the training problems
never use, and scored by the task's own score_answer (reward=auto)."""

from __future__ import annotations

import sys

import pytest

from grpo_cli.commands.compose import compose_config
from grpo_cli.data.reasoning_gym import ITEM
from grpo_cli.data.tasks import load_data
from grpo_cli.errors import GrpoError
from grpo_cli.rewards import Batch, reward_with
from helpers import grpo, read_jsonl

rg = pytest.importorskip("reasoning_gym", reason="data=reasoning_gym needs reasoning-gym: pip install reasoning-gym")

RG = ["data=reasoning_gym", "data.task=basic_arithmetic", "data.size=40", "data.num_test=10", "data.seed=3"]


def test_problems_are_the_task_s_and_the_held_out_ones_come_from_seeds_training_never_uses():
    cfg = compose_config("train", RG)
    data = load_data(cfg.data)
    train = rg.create_dataset("basic_arithmetic", size=40, seed=3)
    assert data["train"]["prompt"] == [e["question"] for e in train]
    assert data["train"]["answer"] == [str(e["answer"]) for e in train]
    held_out = rg.create_dataset("basic_arithmetic", size=10, seed=43)  # problem i comes from seed + i
    assert set(data["test"]["prompt"]) <= {e["question"] for e in held_out}
    assert not set(data["test"]["prompt"]) & set(data["train"]["prompt"])
    options = compose_config("train", [*RG, "data.options={min_terms:4,max_terms:4}"])
    assert all(p.count(" ") >= 6 for p in load_data(options.data)["train"]["prompt"])  # four terms, three signs


def test_reward_auto_is_the_task_s_score_answer_on_the_tagged_answer():
    cfg = compose_config("train", RG)
    rows = load_data(cfg.data)["train"]
    reward = reward_with(cfg.reward, None, cfg.data.name)
    assert list(reward.terms) == ["reasoning_gym"]
    answers, items = rows["answer"][:4], rows[ITEM][:4]
    completions = [
        f"so <answer>{answers[0]}</answer>",  # right
        f"<answer>{int(answers[1]) + 1}</answer>",  # wrong
        answers[2],  # right, but not in the tags: no answer
        f"<answer> {answers[3]} </answer>",
    ]
    batch = Batch(rows["prompt"][:4], completions, answers, columns={ITEM: items})
    problems = rg.create_dataset("basic_arithmetic", size=40, seed=3)
    expected = [problems.score_answer(rg.utils.extract_answer(c), problems[i]) for i, c in enumerate(completions)]
    assert reward.terms["reasoning_gym"](batch) == expected
    assert expected[0] == 1.0 and expected[1] < 1.0 and expected[2] == 0.0


def test_two_steps_train_and_the_logged_rewards_are_score_answer_on_the_logged_completions(tmp_path):
    out = tmp_path / "run"
    args = [*RG, "trainer.steps=2", "trainer.eval_before_after=false", "trainer.log_completions_every=1"]
    assert grpo("train", f"output_dir={out}", "trainer.log_completions_groups=4", "trainer.threads=1", *args) == 0
    problems = rg.create_dataset("basic_arithmetic", size=40, seed=3)
    by_question = {e["question"]: e for e in problems}
    logged = read_jsonl(out / "completions.jsonl")
    assert len(logged) >= 8
    for row in logged:
        entry = by_question[row["prompt"]]
        assert row["reward"] == problems.score_answer(rg.utils.extract_answer(row["completion"]), entry)


def test_an_unknown_task_wrong_options_and_a_missing_package_are_one_sentence(monkeypatch):
    from grpo_cli.data import reasoning_gym as module

    with pytest.raises(GrpoError, match="basic_arithmetic"):
        load_data(compose_config("train", [*RG, "data.task=basic_arithmetc"]).data)
    with pytest.raises(GrpoError, match="refuses data.options"):
        load_data(compose_config("train", [*RG, "data.options={min_terms:9,max_terms:2}"]).data)
    module.dataset.cache_clear()
    monkeypatch.setitem(sys.modules, "reasoning_gym", None)
    with pytest.raises(GrpoError, match=r"pip install 'grpo-cli\[reasoning-gym\]'"):
        load_data(compose_config("train", RG).data)
