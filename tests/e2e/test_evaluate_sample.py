"""`grpo evaluate` and `grpo sample` for real, and what a run shows while it trains: held-out eval
rows, sampled completions, TensorBoard."""

import contextlib
import importlib.util
import io
import json
import math
import sys

import pytest

from grpo_cli.commands.evaluation import checkpoints_to_evaluate
from grpo_cli.config import EvaluateConfig, check
from grpo_cli.errors import GrpoError
from grpo_cli.rollout.scoring import maj_at_k, majority, pass_at_k
from helpers import FAST, TIMING, grpo, read_jsonl

SHOWN = ["trainer.save_every=1", "trainer.eval_every=1", "trainer.log_completions_every=1"]
HAS_TENSORBOARD = importlib.util.find_spec("tensorboard") is not None


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """Two steps with a checkpoint, a held-out evaluation and a completions sample at each step
    (and TensorBoard when installed): (run directory, what it printed to stderr)."""
    out = tmp_path_factory.mktemp("run")
    printed = io.StringIO()
    with contextlib.redirect_stderr(printed):
        code = grpo(
            "train",
            f"output_dir={out}",
            *FAST,
            *SHOWN,
            "trainer.trackers=[tensorboard]" if HAS_TENSORBOARD else "trainer.trackers=[]",
            hydra_dir=out / "hydra",
        )
    assert code == 0, printed.getvalue()
    return out, printed.getvalue()


# --- pass@k and maj@k, by hand ------------------------------------------------------------------


@pytest.mark.parametrize(
    "n, c, k, expected",
    [
        (5, 2, 2, 1 - 3 / 10),  # 1 - C(3,2)/C(5,2)
        (10, 3, 4, 1 - 35 / 210),  # 1 - C(7,4)/C(10,4)
        (10, 3, 1, 0.3),  # pass@1 = c/n
        (8, 0, 3, 0.0),  # nothing right
        (3, 3, 1, 1.0),  # everything right
        (4, 1, 4, 1.0),  # k = n: right if any of the n is
        (4, 0, 4, 0.0),
        (6, 2, 5, 1.0),  # n - c < k: every 5-subset of 6 holds one of the 2
    ],
)
def test_pass_at_k_is_the_unbiased_estimator_worked_by_hand(n, c, k, expected):
    assert pass_at_k(n, c, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_agrees_with_the_binomial_formula_and_refuses_k_above_n():
    for n in range(1, 12):
        for c in range(n + 1):
            for k in range(1, n + 1):
                assert pass_at_k(n, c, k) == pytest.approx(1 - math.comb(n - c, k) / math.comb(n, k), abs=1e-12)
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5)  # C(199,100)/C(200,100) = 100/200, no overflow
    with pytest.raises(ValueError):
        pass_at_k(4, 1, 5)


def test_maj_at_k_votes_over_blocks_of_k_answers_by_hand():
    assert majority(["7", "3", "7", None]) == "7"
    assert majority(["3", "7"]) == "3" and majority(["7", "3"]) == "7"  # a tie goes to the answer seen first
    assert majority([None, None, "7"]) == "7" and majority([None, None]) is None  # no answer does not vote
    assert maj_at_k(["7", "3", "7", None], "7", 4) == 1.0
    assert maj_at_k(["3", "3", "7", None], "7", 4) == 0.0
    assert maj_at_k([None, None, None], "7", 3) == 0.0
    # blocks [7, 7] right, [3, 3] wrong, [3, 7] a tie that 3 wins: 1 of 3
    assert maj_at_k(["7", "7", "3", "3", "3", "7"], "7", 2) == pytest.approx(1 / 3)
    assert maj_at_k(["7", "3", "3", "7"], "7", 1) == 0.5  # maj@1 is the share of right samples
    assert maj_at_k(["7", "7", "3", "3", "3"], "7", 2) == 0.5  # the fifth answer fills no block


def test_maj_at_k_refuses_k_below_one_with_its_own_message():
    with pytest.raises(ValueError, match="maj@k needs 1 <= k <= 2 answers, got k=0"):
        maj_at_k(["7", "7"], "7", 0)


# --- grpo evaluate --------------------------------------------------------------------------------


def test_samples_0_scores_greedy_only_whatever_k_is():
    check(EvaluateConfig(samples=0))  # the default k=[1, 4, 8] is not refused
    check(EvaluateConfig(samples=8))
    with pytest.raises(GrpoError, match=r"k=\[1, 4, 8\] asks for pass@k and maj@k from samples=2"):
        check(EvaluateConfig(samples=2))


def test_a_checkpoint_that_yaml_reads_as_a_number_is_a_path():
    """`checkpoint=100` (a directory named 100) arrives from Hydra as an int."""
    assert checkpoints_to_evaluate(100, "base") == [("100", None)]
    assert checkpoints_to_evaluate(("step-3", 7), "base") == [("step-3", 3), ("7", None)]


def test_evaluate_on_a_run_directory_gives_one_row_per_checkpoint_in_step_order_then_final(run, tmp_path, capsys):
    run_dir, _ = run
    code = grpo(
        "evaluate",
        f"checkpoint={run_dir}",
        "data.max_operand=9",
        "data.num_test=20",
        "samples=4",
        "k=[4,1,2]",
        f"output_dir={tmp_path}",
        hydra_dir=tmp_path / "hydra",
    )
    printed = capsys.readouterr()
    assert code == 0, printed.err
    result = json.loads((tmp_path / "eval.json").read_text())
    rows = result["rows"]
    # step-2 holds final/'s weights (the run's last step): scored once, as final/ at step 2
    assert [r["checkpoint"] for r in rows] == [str(run_dir / "checkpoints" / "step-1"), str(run_dir / "final")]
    assert [r["step"] for r in rows] == [1, 2] and result["k"] == [1, 2, 4] and result["num_prompts"] == 20
    for r in rows:
        assert r["pass@1"] == pytest.approx(r["sampled_accuracy"]) == pytest.approx(r["maj@1"])
        assert 0 <= r["pass@1"] <= r["pass@2"] <= r["pass@4"] <= 1 and 0 <= r["maj@4"] <= 1
        assert r["reward/exact_match"] == r["reward_mean"] and 1 <= r["completion_len"] <= 6
        assert 0 <= r["truncated_frac"] <= 1 and 0 <= r["accuracy"] <= 1
    for name in ("step-1", "final", "pass@4", "maj@2"):
        assert name in printed.out
    # why step-2 is left out: final/ holds step 2's weights, and every model sees the same sampling seed, so
    # the two score the same (named one by one, both are scored)
    both = tmp_path / "both"
    assert (
        grpo(
            "evaluate",
            f"checkpoint=[{run_dir / 'checkpoints' / 'step-2'},{run_dir / 'final'}]",
            "data.max_operand=9",
            "data.num_test=20",
            "samples=4",
            "k=[4,1,2]",
            f"output_dir={both}",
            hydra_dir=both / "hydra",
        )
        == 0
    )
    pair = json.loads((both / "eval.json").read_text())["rows"]
    assert (
        {k: v for k, v in pair[0].items() if k not in ("checkpoint", "step")}
        == {k: v for k, v in pair[1].items() if k not in ("checkpoint", "step")}
        == {k: v for k, v in rows[1].items() if k not in ("checkpoint", "step")}
    )


def test_evaluate_takes_a_list_of_models_and_can_score_greedy_only(run, tmp_path):
    run_dir, _ = run
    code = grpo(
        "evaluate",
        f"checkpoint=[{run_dir / 'checkpoints' / 'step-1'},builtin:tiny]",
        "data.max_operand=9",
        "data.num_test=20",
        "samples=0",
        "k=[]",
        "limit=8",
        f"output_dir={tmp_path}",
        hydra_dir=tmp_path / "h",
    )
    assert code == 0
    rows = json.loads((tmp_path / "eval.json").read_text())["rows"]
    assert [(r["checkpoint"], r["step"], r["num_prompts"]) for r in rows] == [
        (str(run_dir / "checkpoints" / "step-1"), 1, 8),
        ("builtin:tiny", None, 8),
    ]
    assert not any(k.startswith(("pass@", "maj@", "sampled")) for k in rows[0])


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["samples=4", "k=[1,8]"], "k=[1, 8] asks for pass@k and maj@k from samples=4"),
        (["checkpoint=DIR"], "is neither a model directory"),
    ],
)
def test_evaluate_mistakes_are_one_sentence_and_exit_2(overrides, message, tmp_path, capsys):
    overrides = [o.replace("DIR", str(tmp_path)) for o in overrides]
    assert grpo("evaluate", *overrides, f"output_dir={tmp_path}", hydra_dir=tmp_path / "h") == 2
    printed = capsys.readouterr()
    assert message in " ".join(printed.err.split()) and "Traceback" not in printed.err


# --- grpo sample ----------------------------------------------------------------------------------


def test_sample_prints_and_writes_scored_completions_for_a_prompt_on_the_command_line(run, tmp_path, capsys):
    run_dir, _ = run
    out = tmp_path / "s.jsonl"
    # prompt="'3+4='" on a shell: Hydra needs the quotes because the value holds "="
    assert (
        grpo("sample", f"checkpoint={run_dir}", "prompt='3+4='", "answer=7", "sampler.group_size=3", f"output={out}")
        == 0
    )
    printed = capsys.readouterr()
    rows = read_jsonl(out)
    assert len(rows) == 3 and all(r["prompt"] == "3+4=" and r["answer"] == "7" for r in rows)
    assert all(r["reward"] == float(r["completion"].strip() == "7") for r in rows)
    assert "3+4=" in printed.out and "reward" in printed.out
    assert f"3 samples per prompt from {run_dir / 'final'}\n" in printed.out  # the path whole, however long


def test_sample_reads_a_prompts_file_of_lines_or_of_jsonl_rows_with_answers(tmp_path, capsys):
    (tmp_path / "p.txt").write_text("1+1=\n\n2+2=\n")
    (tmp_path / "p.jsonl").write_text(
        json.dumps({"prompt": "3+4=", "answer": 7}) + "\n" + json.dumps({"prompt": "5+5="}) + "\n"
    )
    assert (
        grpo("sample", f"prompts_file={tmp_path / 'p.txt'}", "sampler.group_size=2", f"output={tmp_path / 'a.jsonl'}")
        == 0
    )
    rows = read_jsonl(tmp_path / "a.jsonl")
    assert [r["prompt"] for r in rows] == ["1+1=", "1+1=", "2+2=", "2+2="] and not any("reward" in r for r in rows)
    # an answer in the file wins; answer= fills in for the rows without one
    assert (
        grpo(
            "sample",
            f"prompts_file={tmp_path / 'p.jsonl'}",
            "answer=10",
            "sampler.group_size=2",
            f"output={tmp_path / 'b.jsonl'}",
        )
        == 0
    )
    rows = read_jsonl(tmp_path / "b.jsonl")
    assert [(r["prompt"], r["answer"]) for r in rows] == [("3+4=", "7")] * 2 + [("5+5=", "10")] * 2
    assert all(r["reward"] in (0.0, 1.0) for r in rows)
    assert "5+5=" in capsys.readouterr().out


def test_a_prompts_file_row_without_a_prompt_is_named(tmp_path, capsys):
    (tmp_path / "p.jsonl").write_text(json.dumps({"question": "3+4="}) + "\n")
    assert grpo("sample", f"prompts_file={tmp_path / 'p.jsonl'}") == 2
    assert 'has no "prompt" field' in " ".join(capsys.readouterr().err.split())


# --- what a training run shows ------------------------------------------------------------------


def test_eval_every_adds_held_out_rows_that_readers_of_training_rows_pass_by(run):
    run_dir, printed = run
    rows = read_jsonl(run_dir / "metrics.jsonl")
    evals = [r for r in rows if r.get("kind") == "eval"]
    assert [r["step"] for r in evals] == [1, 2]
    for r in evals:
        assert {"eval/accuracy", "eval/sampled_accuracy", "eval/reward_mean", "eval/completion_len"} <= set(r)
        assert "reward_mean" not in r and 0 <= r["eval/accuracy"] <= 1
    assert [r["step"] for r in rows if "reward_mean" in r] == [1, 2]
    assert "step 2 held-out: greedy accuracy" in printed


def test_periodic_evaluation_and_completion_logging_leave_the_training_rows_unchanged(run, tmp_path):
    run_dir, _ = run
    assert (
        grpo(
            "train",
            f"output_dir={tmp_path}",
            *FAST,
            "trainer.eval_every=0",
            "trainer.log_completions_every=0",
            hydra_dir=tmp_path / "h",
        )
        == 0
    )
    training = lambda d: [
        {k: v for k, v in r.items() if k not in TIMING}  # noqa: E731
        for r in read_jsonl(d / "metrics.jsonl")
        if "reward_mean" in r
    ]
    assert training(run_dir) == training(tmp_path)
    assert not (tmp_path / "completions.jsonl").exists()


def test_log_completions_every_writes_completions_jsonl_and_shows_a_few(run):
    run_dir, printed = run
    rows = read_jsonl(run_dir / "completions.jsonl")
    assert [r["step"] for r in rows] == [1] * 8 + [2] * 8  # 2 groups (log_completions_groups) of G = 4
    assert set(rows[0]) == {"step", "prompt", "completion", "answer", "reward", "advantage"}
    for start in range(0, len(rows), 4):
        group = rows[start : start + 4]
        assert len({r["prompt"] for r in group}) == 1
        assert sum(r["advantage"] for r in group) == pytest.approx(0.0, abs=1e-5)  # whitened within the group
        assert all(r["reward"] == float(r["completion"].strip() == r["answer"]) for r in group)
    assert "step 2: completions of" in printed and "advantage" in printed


@pytest.mark.skipif(not HAS_TENSORBOARD, reason="the tensorboard extra is not installed")
def test_tensorboard_gets_every_numeric_metric_as_a_scalar_at_its_step(run):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, _ = run
    assert list(run_dir.glob("events.out.tfevents.*"))
    events = EventAccumulator(str(run_dir))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"reward_mean", "kl", "lr", "reward/exact_match", "eval/accuracy", "eval/sampled_accuracy"} <= tags
    assert "kind" not in tags and "step" not in tags
    assert [e.step for e in events.Scalars("reward_mean")] == [1, 2]
    rows = [r for r in read_jsonl(run_dir / "metrics.jsonl") if "reward_mean" in r]
    assert [e.value for e in events.Scalars("reward_mean")] == pytest.approx([r["reward_mean"] for r in rows])


def test_tensorboard_without_its_extra_is_one_sentence_naming_the_extra(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # what a missing package looks like
    assert (
        grpo("train", f"output_dir={tmp_path}", *FAST, "trainer.trackers=[tensorboard]", hydra_dir=tmp_path / "h") == 2
    )
    err = " ".join(capsys.readouterr().err.split())
    assert "pip install 'grpo-cli[tensorboard]'" in err and "Traceback" not in err
    assert not (tmp_path / "metrics.jsonl").exists()
