"""The golden trajectory: the first five training rows of the default run (`grpo train`, one thread,
held-out scoring off, which draws no training randomness) pinned as recorded on 2026-11-23 on a 2-core
AMD EPYC (AVX2). An equality test compares two code paths, so a change that moves both sides passes
it; this one fails when any number of the default run moves.

Tolerance: rewards, token counts and the zero-variance share exactly (they are counts, and sampling is
seeded per group); the rest to 1e-5 relative (1e-7 absolute), room for another CPU's float summation
order. A change that must move these numbers says which and why, and re-records them
(`python tests/test_golden.py` prints the rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import grpo_process, metric_rows

COMMAND = ["train", "trainer.threads=1", "trainer.progress=false", "trainer.steps=5", "trainer.eval_before_after=false",
           "trainer.eval_every=0"]
EXACT = ("step", "reward_mean", "completion_tokens", "zero_var_frac")
CLOSE = ("reward_std", "loss", "kl", "grad_norm", "entropy")
GOLDEN = [
    dict(step=1, reward_mean=0.51953125, completion_tokens=760, zero_var_frac=0.0625, reward_std=0.49961838464315694,
         loss=-2.3283064365386963e-09, kl=0.0, grad_norm=0.9011357426643372, entropy=0.43226227007414164),
    dict(step=2, reward_mean=0.49609375, completion_tokens=760, zero_var_frac=0.09375, reward_std=0.49998474097809975,
         loss=5.322648212313652e-05, kl=0.0012950715461843892, grad_norm=0.7075716257095337, entropy=0.4422290701615183),
    dict(step=3, reward_mean=0.546875, completion_tokens=753, zero_var_frac=0.0625, reward_std=0.4977978850648122,
         loss=0.00018153851851820946, kl=0.004557107232639673, grad_norm=0.5580087900161743, entropy=0.46994243485044196),
    dict(step=4, reward_mean=0.5703125, completion_tokens=768, zero_var_frac=0.03125, reward_std=0.49503146601377773,
         loss=0.0002956376411020756, kl=0.007390799233689904, grad_norm=0.7336628437042236, entropy=0.4054175913333893),
    dict(step=5, reward_mean=0.55859375, completion_tokens=765, zero_var_frac=0.15625, reward_std=0.49655490377292366,
         loss=0.0006410649511963129, kl=0.01583812423780853, grad_norm=0.637715756893158, entropy=0.41080696255553),
]


def default_run_rows(out: Path) -> list[dict]:
    grpo_process(*COMMAND, f"output_dir={out}", timeout=300, check_rc=0)
    return metric_rows(out)


def test_the_default_runs_first_rows_are_the_recorded_ones(tmp_path):
    rows = default_run_rows(tmp_path / "run")
    assert len(rows) == len(GOLDEN)
    for row, want in zip(rows, GOLDEN):
        assert {k: row[k] for k in EXACT} == {k: want[k] for k in EXACT}
        for k in CLOSE:
            assert row[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), (row["step"], k)


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        for r in default_run_rows(Path(d) / "run"):
            print({k: r[k] for k in EXACT + CLOSE})
