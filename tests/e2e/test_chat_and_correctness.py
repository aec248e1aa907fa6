"""A chat model end to end (sample and evaluate prompt it exactly as training did), accuracy judged by
the user's own reward, the note for a real model left on the built-in settings, and a hub that cannot
be reached."""

import re
import time
from types import SimpleNamespace

import pytest
import torch

from grpo_cli.config import RewardConfig
from grpo_cli.generate.hf import HFGenerator
from grpo_cli.rewards import Judge, build_reward
from grpo_cli.rollout.scoring import Draws, greedy_scores, pass_at_k, sampled_scores
from helpers import grpo

# One step with held-out scoring on: what a chat run prints and writes.
ONE_STEP = [
    "trainer.steps=1",
    "trainer.prompts_per_step=4",
    "sampler.group_size=2",
    "trainer.progress=false",
    "data.max_operand=9",
    "data.num_test=6",
    "trainer.eval_prompts=6",
]


@pytest.fixture
def prompt_ids(monkeypatch):
    """Every prompt HFGenerator.generate is asked for, as the token ids it feeds the model."""
    seen = []
    original = HFGenerator.generate

    def spy(self, model, prompts, *args, **kwargs):
        seen.append([tuple(ids) for ids in self.encode(list(prompts))])
        return original(self, model, prompts, *args, **kwargs)

    monkeypatch.setattr(HFGenerator, "generate", spy)
    return seen


def test_sample_and_evaluate_prompt_a_chat_model_with_the_ids_training_used(chat_dir, tmp_path, prompt_ids, capsys):
    from grpo_cli.models.loading import load_tokenizer

    run = tmp_path / "run"
    assert (
        grpo(
            "train",
            f"model.path={chat_dir}",
            f"output_dir={run}",
            *ONE_STEP,
            "data.chat_template=true",
            "data.system_prompt=1",
            "trainer.log_completions_every=0",
        )
        == 0
    )
    training = {ids for call in prompt_ids for ids in call}
    held_out = set(prompt_ids[0])  # the first call: the held-out evaluation before training (greedy)
    prompt_ids.clear()

    # evaluate the trained run with no data settings: the saved ones (chat template, system prompt) apply
    assert grpo("evaluate", f"checkpoint={run}/final", "samples=0", f"output_dir={tmp_path / 'eval'}") == 0
    assert "using the data, sampler, reward, env settings saved with" in capsys.readouterr().err
    assert set(prompt_ids[0]) == held_out and held_out <= training
    prompt_ids.clear()

    # sample a typed prompt: rendered with the same chat template and system prompt as training
    assert grpo("sample", f"checkpoint={run}", "prompt=3+4") == 0
    tok = load_tokenizer(str(chat_dir))
    want = tok.apply_chat_template(
        [{"role": "system", "content": "1"}, {"role": "user", "content": "3+4"}],
        tokenize=True,
        add_generation_prompt=True,
        return_dict=False,
    )
    assert prompt_ids[0] == [tuple(want)]
    # a training prompt typed by hand gives exactly the ids training gave it
    prompt_ids.clear()
    assert grpo("sample", f"checkpoint={run}", "prompt=2+5") == 0
    text = tok.apply_chat_template(
        [{"role": "system", "content": "1"}, {"role": "user", "content": "2+5="}],
        tokenize=False,
        add_generation_prompt=True,
    )
    assert tok(text, add_special_tokens=False)["input_ids"] != list(prompt_ids[0][0])  # "2+5" is not "2+5="
    prompt_ids.clear()
    assert grpo("sample", f"checkpoint={run}", "prompt='2+5='") == 0
    assert list(prompt_ids[0][0]) == tok(text, add_special_tokens=False)["input_ids"]


class Rolls:
    """A generator that returns fixed completions: the scoring, not the model, is under test."""

    def __init__(self, completions):
        self.completions = completions

    def generate(self, model, prompts, group_size, sampling, seeds=None):
        n = len(prompts) * group_size
        out = self.completions[:n]
        return SimpleNamespace(
            completions=out,
            sampled_tokens=lambda: torch.full((n,), 2),
            truncated=torch.zeros(n, dtype=torch.bool),
            completion_ids=lambda: [[1, 2]] * n,
            episodes=None,
        )


@pytest.fixture
def python_reward(tmp_path, monkeypatch):
    (tmp_path / "my_reward.py").write_text(
        "def score(completions, **kwargs):\n    return [1.0 if c.startswith('good') else 0.25 for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    cfg = RewardConfig(name="python", fn="my_reward:score")
    return cfg, build_reward(cfg)


def test_a_python_reward_with_maximum_1_decides_accuracy_pass_at_k_and_maj_at_k(python_reward):
    cfg, reward = python_reward
    judge = Judge(cfg, reward)
    assert judge.label == "reward >= 1"
    # prompt 0 (answer 7): 3 of 4 completions score 1, though only the last says 7
    # prompt 1 (answer 2): 1 of 4 scores 1
    completions = ["good 5", "good 1", "good 1", "bad 7", "bad 3", "bad 3", "good 2", "bad 4"]
    sampler = SimpleNamespace(max_new_tokens=2, temperature=1.0, top_p=1.0, top_k=0)
    got = sampled_scores(
        Rolls(completions), None, ["p0", "p1"], ["7", "2"], reward, judge, Draws(4, sampler, ks=(1, 2, 4))
    )
    assert got["sampled_accuracy"] == pytest.approx(4 / 8)
    assert got["pass@1"] == pytest.approx((3 / 4 + 1 / 4) / 2)
    assert got["pass@2"] == pytest.approx((1.0 + (1 - 3 / 6)) / 2)  # 1 - C(3,2)/C(4,2) for prompt 1
    assert got["pass@2"] == pytest.approx((pass_at_k(4, 3, 2) + pass_at_k(4, 1, 2)) / 2)
    # maj@4: prompt 0 votes 1 (twice) and it was judged correct; prompt 1 votes 3, scored 0.25
    assert got["maj@4"] == pytest.approx(0.5)
    greedy = greedy_scores(Rolls(["good 5", "bad 2"]), None, ["p0", "p1"], ["7", "2"], reward, judge, max_new_tokens=2)
    assert greedy["accuracy"] == 0.5 and greedy["reward_mean"] == pytest.approx((1 + 0.25) / 2)


def test_correct_follows_a_threshold_a_max_reward_attribute_or_the_answer_rule(python_reward, tmp_path):
    cfg, reward = python_reward
    assert Judge(RewardConfig(name="python", fn=cfg.fn, correct_threshold=0.2), reward)(
        [0.25, 0.1], ["", ""], ["", ""]
    ) == [True, False]
    answer_rule = Judge(RewardConfig(name="python", fn=cfg.fn, correct="answer"), reward)
    assert (
        answer_rule(["x", "x"], ["bad 7", "good 5"], ["7", "7"]) == [True, False] and "last_number" in answer_rule.label
    )
    (tmp_path / "five.py").write_text(
        "def score(completions, **kw):\n    return [5.0] * len(completions)\nscore.max_reward = 5.0\n"
    )
    five = RewardConfig(name="python", fn="five:score")
    assert Judge(five, build_reward(five)).label == "reward >= 5"
    combo = RewardConfig(name="combo", terms=["exact_match", "format"], weights=[1.0, 0.5])
    assert Judge(combo, build_reward(combo)).label == "reward >= 1.5"


def test_a_real_model_path_on_the_built_in_settings_gets_one_note_and_a_preset_does_not(tiny_dir):
    from grpo_cli.commands.compose import compose_config
    from grpo_cli.run.build import builtin_settings_note

    plain = compose_config("train", [f"model.path={tiny_dir}"])
    note = builtin_settings_note(plain)
    assert (
        note and "sampler.max_new_tokens=6" in note and "optimizer.lr=0.0003" in note and "experiment=instruct" in note
    )
    assert builtin_settings_note(compose_config("train", [f"model.path={tiny_dir}", "experiment=instruct"])) is None
    assert builtin_settings_note(compose_config("train", [])) is None  # the built-in model itself


def test_a_hub_id_that_cannot_be_reached_fails_in_seconds_with_one_sentence(monkeypatch, capsys):
    import grpo_cli.models.hub as hub

    monkeypatch.setenv("HF_ENDPOINT", "https://hub.invalid")
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", "https://hub.invalid")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(hub, "_HUB_STATE", None)
    start = time.monotonic()
    code = grpo("train", "model.path=nobody/not-cached-model", "trainer.progress=false")
    err = capsys.readouterr().err
    assert code == 2 and time.monotonic() - start < 10, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "cannot be reached" in errors[0] and "HF_HUB_OFFLINE=1" in errors[0]
    said = [line for line in err.splitlines() if not re.match(r"^\s*\d+\.\ds ", line)]  # the start's phase lines aside
    assert "Traceback" not in err and len(said) <= 2, err  # no retry storm of warnings


def test_completion_logs_show_the_user_s_prompt_and_the_exact_reward(chat_dir, tmp_path, monkeypatch, capsys):
    import json

    (tmp_path / "tenth.py").write_text(
        "def score(completions, **kw):\n    return [0.1 if '1' in c else 0.7 for c in completions]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    run = tmp_path / "run"
    assert (
        grpo(
            "train",
            f"model.path={chat_dir}",
            f"output_dir={run}",
            *ONE_STEP,
            "data.chat_template=true",
            "data.system_prompt=9",
            "reward=python",
            "reward.fn=tenth:score",
            "trainer.log_completions_every=1",
            "trainer.eval_before_after=false",
        )
        == 0
    )
    rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
    assert rows and all(r["reward"] in (0.1, 0.7) for r in rows)  # not 0.10000000149011612
    assert all(not r["prompt"].startswith("9+") and r["prompt"].endswith("=") for r in rows)  # no system prompt
    assert "completions of '9+" not in capsys.readouterr().err


def test_evaluate_shows_progress_per_model_and_batch_outside_a_terminal(tmp_path):
    import subprocess
    import sys

    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli",
            "evaluate",
            "checkpoint=[builtin:tiny,builtin:tiny]",
            "limit=8",
            "batch_size=4",
            "samples=2",
            "k=[1,2]",
            f"output_dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
    )
    assert out.returncode == 0, out.stderr
    for line in (
        "model 1/2: builtin:tiny",
        "model 1/2 greedy: 0/8",
        "model 1/2 greedy: 8/8",
        "model 2/2 sampled x2: 8/8",
        "(correct: reward >= 1)",
    ):
        assert line in out.stderr, out.stderr


def test_a_reward_function_written_for_trl_runs_unchanged_and_none_means_no_score(tmp_path, monkeypatch):
    import json

    # The shape of TRL's documented custom rewards: completion_ids, dataset columns via kwargs, None = no score.
    (tmp_path / "trl_style.py").write_text(
        "def reward_len(prompts, completions, completion_ids, **kwargs):\n"
        "    assert all(isinstance(ids, list) and ids for ids in completion_ids)\n"
        "    return [None if i % 2 == 0 else 0.5 + len(ids) for i, ids in enumerate(completion_ids)]\n"
        "def uses_answer(prompts, completions, answer, **kwargs):\n"
        "    return [float(c.strip() == a) for c, a in zip(completions, answer)]\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    for fn in ("trl_style:reward_len", "trl_style:uses_answer"):
        run = tmp_path / fn.split(":")[1]
        assert (
            grpo(
                "train",
                f"output_dir={run}",
                *ONE_STEP,
                "trainer.eval_before_after=false",
                "reward=python",
                f"reward.fn={fn}",
                "trainer.log_completions_every=1",
            )
            == 0
        )
        rows = [json.loads(line) for line in (run / "completions.jsonl").read_text().splitlines()]
        if fn.endswith("reward_len"):  # None is no score (null, advantage 0); the others as returned
            assert [r["reward"] is None for r in rows] == [i % 2 == 0 for i in range(len(rows))], rows
            assert all(r["advantage"] == 0.0 for r in rows[0::2])
            assert all(r["reward"] >= 1.5 for r in rows[1::2])
        else:
            assert all(r["reward"] == float(r["completion"].strip() == r["answer"]) for r in rows)
