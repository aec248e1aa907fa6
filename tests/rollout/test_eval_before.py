"""trainer.eval_before_at=end: the first step starts at once, and the scores before training, measured after
the last step on the initial weights loaded again, are those the run measures first (same weights, same
draws); training is untouched."""

import pytest

from helpers import FAST, TIMING, grpo, read_jsonl

RUN = [
    *FAST[:1],
    "trainer.steps=3",
    *FAST[1:],
    "trainer.eval_before_after=true",
    "trainer.eval_prompts=12",
    "trainer.eval_every=0",
    "trainer.save_every=100",
]


def run_and_read(tmp_path, name, capsys, *extra):
    out = tmp_path / name
    assert grpo("train", f"output_dir={out}", *RUN, *extra) == 0
    printed = capsys.readouterr()
    return read_jsonl(out / "metrics.jsonl"), printed.out + printed.err


@pytest.mark.parametrize("extra", [[], ["model.lora.r=4", "optimizer.lr=3e-3"]], ids=["full", "lora"])
def test_the_scores_before_training_measured_at_the_end_equal_those_measured_first(tmp_path, capsys, extra):
    first_rows, first_out = run_and_read(tmp_path, "start", capsys, *extra)
    end_rows, end_out = run_and_read(tmp_path, "end", capsys, "trainer.eval_before_at=end", *extra)
    evals = lambda rows: {r["step"]: r for r in rows if r.get("kind") == "eval"}  # noqa: E731
    assert set(evals(first_rows)) == set(evals(end_rows)) == {0, 3}
    assert evals(end_rows)[0] == evals(first_rows)[0]  # exactly: the same weights and the same seeded draws
    assert evals(end_rows)[3] == evals(first_rows)[3]

    def training(rows):
        return [{k: v for k, v in r.items() if k not in TIMING} for r in rows if "reward_mean" in r]

    assert training(end_rows) == training(first_rows)
    # the first step starts before any held-out scoring when deferred, after it otherwise
    assert end_out.index("step 1") < end_out.index("before training (the initial weights")
    assert first_out.index("before training: greedy") < first_out.index("step 1")
    assert "greedy_accuracy_before" in end_out  # the summary has both ends


def test_a_generation_worker_measures_first_with_one_sentence(tmp_path, capsys):
    rows, out = run_and_read(tmp_path, "worker", capsys, "trainer.eval_before_at=end", "trainer.max_staleness=1")
    assert "trainer.eval_before_at=end needs the in-process hf generator" in out
    assert out.index("before training: greedy") < out.index("step 1")
    assert [r["step"] for r in rows if r.get("kind") == "eval"] == [0, 3]


def test_a_wrong_value_is_one_sentence(tmp_path, capsys):
    assert grpo("train", f"output_dir={tmp_path}", *RUN, "trainer.eval_before_at=later") == 2
    assert "trainer.eval_before_at='later' must be one of start, end" in capsys.readouterr().err
