"""Rewards that cannot hurt the run: `None` is no score (left out of its group's statistics, as TRL
does), and rewards scored in worker processes (`reward.workers`) survive a completion that loops
forever, crashes its interpreter or eats its memory: that completion scores None, is counted, and the
run goes on, unless more than `reward.max_failed_fraction` of a step failed."""

import math
import time

import pytest
import torch

from grpo_cli.algo.objective import group_advantages
from grpo_cli.config import RewardConfig
from grpo_cli.errors import GrpoError
from grpo_cli.rewards import build_reward
from helpers import grpo_process, read_jsonl

NAN = math.nan
ONE_STEP = [
    "trainer.steps=1",
    "trainer.prompts_per_step=2",
    "sampler.group_size=4",
    "trainer.progress=false",
    "trainer.eval_before_after=false",
    "trainer.eval_every=0",
    "trainer.log_completions_every=1",
    "trainer.log_completions_groups=2",
    "data.max_operand=9",
    "data.num_test=6",
]


# ------------------------------------------------------------------ None: no score, as in TRL 1.16


def test_a_none_reward_is_left_out_of_its_group_with_trls_advantages():
    # TRL 1.16 (sample std, nan-aware mean, advantage 0 for the unscorable) on [None, 1, 0, 1]:
    # mean 2/3, std sqrt(1/3) = 0.5774, so (1 - 2/3) / 0.5774 = 0.5774 and (0 - 2/3) / 0.5774 = -1.1547.
    rewards = torch.tensor([[NAN, 1.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
    got = group_advantages(rewards, std="sample")
    assert torch.allclose(got[0], torch.tensor([0.0, 0.5774, -1.1547, 0.5774], dtype=torch.float64), atol=1e-4)
    assert got[1].abs().max() == 0
    # Population std (the default) by hand: var = ((1/3)^2 * 2 + (2/3)^2) / 3 = 2/9.
    sigma = math.sqrt(2 / 9)
    want = [0.0, (1 / 3) / sigma, (-2 / 3) / sigma, (1 / 3) / sigma]
    assert torch.allclose(group_advantages(rewards)[0], torch.tensor(want, dtype=torch.float64), atol=1e-6)
    assert torch.allclose(
        group_advantages(rewards, scale="none")[0],
        torch.tensor([0.0, 1 / 3, -2 / 3, 1 / 3], dtype=torch.float64),
        atol=1e-12,
    )


def test_a_group_left_with_under_two_scores_contributes_nothing():
    rewards = torch.tensor([[NAN, NAN, 1.0, NAN], [NAN] * 4, [2.0, NAN, 0.0, NAN]], dtype=torch.float64)
    got = group_advantages(rewards)
    assert got[:2].abs().max() == 0  # one score, or none: no signal
    assert torch.allclose(got[2], torch.tensor([1.0, 0.0, -1.0, 0.0], dtype=torch.float64), atol=1e-6)


def test_under_batch_scale_the_batch_sigma_counts_only_scored_rewards():
    rewards = torch.tensor([[NAN, 1.0, 0.0, 1.0], [3.0, 1.0, NAN, NAN]], dtype=torch.float64)
    scored = [1.0, 0.0, 1.0, 3.0, 1.0]  # by hand: the batch's five scores, around their mean
    mean = sum(scored) / 5
    sigma = math.sqrt(sum((x - mean) ** 2 for x in scored) / 5)
    want = [[0.0, (1 / 3) / sigma, (-2 / 3) / sigma, (1 / 3) / sigma], [1.0 / sigma, -1.0 / sigma, 0.0, 0.0]]
    assert torch.allclose(group_advantages(rewards, scale="batch"), torch.tensor(want, dtype=torch.float64), atol=1e-6)


def test_without_none_the_advantages_are_unchanged():
    torch.manual_seed(0)
    rewards = torch.rand(16, 8, dtype=torch.float64)
    centred = rewards - rewards.mean(1, keepdim=True)
    want = centred / torch.sqrt(centred.pow(2).mean(1, keepdim=True) + 1e-12)
    assert torch.allclose(group_advantages(rewards), want, atol=1e-12)


def test_a_step_with_none_scores_logs_trls_reward_mean_and_advantages(tmp_path):
    """[None, 1, 0, 1] and [0, 1, 0, 0] through a whole training step: the logged reward mean is over the
    seven scored completions (3/7, TRL's 0.4286; counting None as 0 gave 3/8), the unscored one is null
    with advantage 0, and with algo.std=sample the advantages are TRL's."""
    (tmp_path / "fixed.py").write_text(
        "def score(completions, **kw):\n"
        "    return [[None, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0][i % 8] for i in range(len(completions))]\n"
    )
    run = tmp_path / "run"
    proc = grpo_process(
        "train",
        f"output_dir={run}",
        *ONE_STEP,
        "reward=python",
        "reward.fn=fixed.py:score",
        "algo.std=sample",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    row = [r for r in read_jsonl(run / "metrics.jsonl") if "reward_mean" in r][0]
    assert row["reward_mean"] == pytest.approx(3 / 7) and row["reward_none_frac"] == pytest.approx(1 / 8)
    rows = read_jsonl(run / "completions.jsonl")
    assert [r["reward"] for r in rows] == [None, 1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 0.0]
    trl = [0.0, 0.5774, -1.1547, 0.5774, -0.4999, 1.4997, -0.4999, -0.4999]  # TRL 1.16's, worked as above
    assert [r["advantage"] for r in rows] == pytest.approx(trl, abs=1e-3)


def test_under_combo_none_is_per_term_and_a_completion_no_term_scored_has_no_score(tmp_path):
    (tmp_path / "terms.py").write_text(
        "def f(completions, **kw):\n    return [None if i % 2 == 0 else 1.0 for i in range(len(completions))]\n"
        "def g(completions, **kw):\n    return [None if i % 4 == 0 else 10.0 for i in range(len(completions))]\n"
    )
    reward = build_reward(
        RewardConfig(name="python", fn=["terms.py:f", "terms.py:g"], weights=[1.0, 0.5], fn_dir=str(tmp_path))
    )
    total, terms = reward.score(["p"] * 4, ["a", "b", "c", "d"], ["x"] * 4)
    assert math.isnan(total[0])  # neither term scored it
    assert total[1:] == [1.0 + 5.0, 5.0, 1.0 + 5.0]  # the terms that scored, weighted (TRL's nansum)
    assert math.isnan(terms["f"][2]) and terms["g"][2] == 10.0


# ------------------------------------------------------------------ worker processes with deadlines

FAILING = '''import ctypes, os, time

def once(name):
    """True for the first completion, of all workers', to ask for `name`."""
    try:
        os.close(os.open(os.path.join(os.environ["MARKS"], name), os.O_CREAT | os.O_EXCL))
        return True
    except FileExistsError:
        return False

def score(completions, **kw):
    modes = os.environ.get("MODES", "").split(",")
    out = []
    for c in completions:
        mode = next((m for m in modes if m and once(m)), None)
        if mode == "sleep":
            time.sleep(10**6)
        elif mode == "segfault":
            ctypes.string_at(0)
        elif mode == "exit":
            os._exit(7)
        elif mode == "memory":
            hoard = []  # bytes(n) maps zeroed pages without touching them: the address space, not the
            while True:  # machine's memory or its time, runs out (bytearray(n) wrote 1 GiB: 2 s under load)
                hoard.append(bytes(2**26))
        elif mode == "raise":
            raise ValueError("the verifier broke")
        out.append(float(len(c) % 2))
    return out
'''


def failing_reward(tmp_path, modes: str, monkeypatch, **settings):
    (tmp_path / "failing.py").write_text(FAILING)
    marks = tmp_path / "marks"
    marks.mkdir(exist_ok=True)
    monkeypatch.setenv("MARKS", str(marks))
    monkeypatch.setenv("MODES", modes)
    cfg = RewardConfig(
        name="python",
        fn="failing.py:score",
        fn_dir=str(tmp_path),
        workers=2,
        timeout_s=2.0,
        worker_memory_gib=1.0,
        **settings,
    )
    return build_reward(cfg)


def test_a_completion_that_hangs_crashes_or_eats_memory_scores_none_and_the_rest_are_scored(tmp_path, monkeypatch):
    reward = failing_reward(tmp_path, "sleep,segfault,exit,memory", monkeypatch, max_failed_fraction=0.5)
    completions = [f"answer {i}" + "x" * i for i in range(10)]
    start = time.monotonic()
    total, _ = reward.score(["p"] * 10, completions, ["1"] * 10)
    took = time.monotonic() - start
    reward.close()
    why = sorted(f.why for f in reward.failed)
    assert len(reward.failed) == 4 and sum(math.isnan(t) for t in total) == 4
    assert any("timed out after 2 s" in w for w in why), why
    assert any("SIGSEGV" in w for w in why) and any("exited with code 7" in w for w in why), why
    assert any("ran out of memory" in w for w in why), why
    scored = [i for i, t in enumerate(total) if not math.isnan(t)]
    assert all(total[i] == float(len(completions[i]) % 2) for i in scored)  # the rest as in-process
    assert took < 2.0 + 15.0, f"one deadline and a few worker restarts, not a hang: {took:.1f} s"
    # The pool is whole again: the next batch is scored in full.
    total, _ = reward.score(["p"] * 4, completions[:4], ["1"] * 4)
    reward.close()
    assert not reward.failed and not any(math.isnan(t) for t in total)


def test_more_failures_than_the_fraction_stop_with_one_sentence(tmp_path, monkeypatch):
    reward = failing_reward(tmp_path, "exit", monkeypatch, max_failed_fraction=0.1)
    with pytest.raises(
        GrpoError,
        match=r"could not score 1 of 4 completions, more than reward.max_failed_fraction=0.1"
        r": completion \d \('.*'\) its worker exited with code 7",
    ):
        reward.score(["p"] * 4, ["a", "b", "c", "d"], ["1"] * 4)
    reward.close()


def test_a_reward_that_raises_in_a_worker_stops_at_once_naming_the_completion(tmp_path, monkeypatch):
    reward = failing_reward(tmp_path, "raise", monkeypatch)
    with pytest.raises(GrpoError, match=r"Reward 'python' raised ValueError: the verifier broke on completion \d "):
        reward.score(["p"] * 4, ["a", "b", "c", "d"], ["1"] * 4)
    reward.close()


def test_a_training_run_with_a_hanging_and_a_crashing_completion_finishes_and_counts_them(tmp_path):
    (tmp_path / "failing.py").write_text(FAILING)
    (tmp_path / "marks").mkdir()
    run = tmp_path / "run"
    env = {"MARKS": str(tmp_path / "marks"), "MODES": "sleep,segfault"}
    start = time.monotonic()
    proc = grpo_process(
        "train",
        f"output_dir={run}",
        *ONE_STEP,
        "reward=python",
        "reward.fn=failing.py:score",
        "reward.workers=2",
        "reward.timeout_s=3",
        "reward.max_failed_fraction=0.3",
        cwd=tmp_path,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    assert time.monotonic() - start < 120
    row = [r for r in read_jsonl(run / "metrics.jsonl") if "reward_mean" in r][0]
    assert row["reward_failed_frac"] == pytest.approx(2 / 8) and row["reward_none_frac"] == pytest.approx(2 / 8)
    assert sum(r["reward"] is None for r in read_jsonl(run / "completions.jsonl")) == 2
    assert (run / "final" / "config.json").exists()

    marks = tmp_path / "marks2"
    marks.mkdir()
    proc = grpo_process(
        "train",
        f"output_dir={tmp_path / 'stopped'}",
        *ONE_STEP,
        "reward=python",
        "reward.fn=failing.py:score",
        "reward.workers=2",
        "reward.timeout_s=3",
        cwd=tmp_path,
        env={"MARKS": str(marks), "MODES": "segfault,exit"},
    )
    assert proc.returncode == 2
    error = proc.stderr.strip().splitlines()[-1]
    assert "could not score 2 of 8 completions, more than reward.max_failed_fraction=0.1" in error, proc.stderr
    assert "Traceback" not in proc.stderr
