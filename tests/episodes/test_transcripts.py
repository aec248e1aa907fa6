"""What completions.jsonl says an episode was is what the model read: the text decoded from exactly the ids the
update trained on (the prompt, each run of the model's own tokens and of the template's), an episode cut at
env.max_turns or env.max_tokens keeping the environment's last answer (marked, never shown to the model), and
with data=none the observation reset() wrote as the prompt."""

from __future__ import annotations

import pytest
from episode_kit import Scripted, call, small_cfg

from grpo_cli.models.loading import load_tokenizer
from grpo_cli.run import observers
from grpo_cli.run.console import Console
from helpers import read_jsonl

CASES = {  # env settings, data settings, what every logged episode must show
    "cut at max_turns": (dict(factory="trl_env.py:Counter", max_turns=2, max_tokens=400), {}, "turns"),
    # the first call (71 tokens and its end) fits, the counter's rendered answer after it does not
    "cut at max_tokens": (dict(factory="trl_env.py:Counter", max_turns=4, max_tokens=90), {}, "tokens"),
    "data=none": (
        dict(factory="trl_env.py:Doubling", max_turns=3, max_tokens=300),
        dict(name="none", answer_field="_answer", num_train=8, num_test=4),
        None,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
def test_the_logged_episode_decodes_the_trained_sample_s_ids(case, qwen_dir, scripted, tmp_path, monkeypatch):
    from grpo_cli.run.trainer import train

    env, data, cut = CASES[case]
    trained = []  # the rollouts the update trained on, as the observer that logs them saw them
    real = observers.completion_rows
    monkeypatch.setattr(
        observers, "completion_rows", lambda step, roll, *a, **k: trained.append(roll) or real(step, roll, *a, **k)
    )
    Scripted.SCRIPT = [call("increment", step=2), call("increment", step=1), call("read"), "3"]
    if case == "data=none":
        Scripted.SCRIPT = [call("answer", value=4), "done"]
    cfg = small_cfg(tmp_path, qwen_dir, **env)
    for key, value in data.items():
        setattr(cfg.data, key, value)
    train(cfg, tmp_path, Console(progress=False))
    tok = load_tokenizer(str(qwen_dir))
    logged = read_jsonl(tmp_path / "completions.jsonl")
    rolls = {i + 1: roll for i, roll in enumerate(trained)}
    assert len(logged) == 2 * 2 * 2  # 2 steps x 2 groups x G = 2
    for i, row in enumerate(logged):
        roll = rolls[row["step"]]
        k = i % (2 * roll.group_size)  # the row's index in its step's rollout
        start, prompt, length = (int(t[k]) for t in (roll.offsets, roll.prompt_lengths, roll.lengths))
        ids, sampled = roll.tokens[start : start + length].tolist(), roll.loss_mask[start : start + length].tolist()
        assert row["rendered"]["prompt"] == tok.decode(ids[:prompt], skip_special_tokens=False)
        runs, at = row["rendered"]["turns"], prompt
        for run in runs:  # each run: the model's own tokens, or the template's, as the update saw them
            n = next((j for j in range(at, length) if sampled[j] != sampled[at]), length) - at
            assert run["by"] == ("model" if sampled[at] else "template")
            assert run["text"] == tok.decode(ids[at : at + n], skip_special_tokens=False)
            at += n
        assert at == length
        assert len(runs) == 1 if cut == "tokens" else len(runs) >= 3  # the model, the template, the model, ...
        assert row["cut"] == cut
        if cut == "turns":  # no turn left to read the results: the last call is kept, not made, and the cut said
            assert row["messages"][-1]["role"] == "assistant" and row["messages"][-1]["tool_calls"]
            assert row["completion"].endswith("[cut at env.max_turns]")
        if cut == "tokens":  # the environment answered; no room to show it: kept, marked, not in what was read
            assert row["messages"][-1]["role"] == "tool" and row["messages"][-1]["cut"] == "tokens"
            assert "never shown to the model" in row["completion"]
            assert row["messages"][-1]["content"] not in row["rendered"]["turns"][-1]["text"]
        if case == "data=none":
            assert row["prompt"].startswith("What is ") and row["prompt"] == row["observation"]
            assert row["observation"] in row["rendered"]["prompt"]
