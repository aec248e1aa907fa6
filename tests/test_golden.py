"""Golden trajectories: the first training rows of four runs, pinned as recorded on a 2-core AMD EPYC
(AVX2), one thread, held-out scoring off (it draws no training randomness):
- `default`: the default run (`grpo train`), recorded on 2026-11-23;
- `tool_use`: the tool-use demo (`experiment=tool_use`: multi-turn episodes with a calculator), 4 prompts a
  step, and `staleness_1`: the default run with generation in a worker process one update behind
  (`trainer.max_staleness=1`), both recorded on 2026-11-25 before the rollout stage moved into its own
  package, as the safety net of that move;
- `default_padded`: the default run with `trainer.packing=false` (the padded forward), recorded on 2026-11-25
  before rollouts became flat rows with one packer. On the recording machine every number of these rows,
  and the final weights, came out bit for bit the same after that change;
- `default_unshared`: the default run with `trainer.shared_prompts=false` (each prompt computed G times, as
  when `default` was recorded, before prompts were shared): `default`'s rows;
- `default_recompute`: the default run with `model.recompute_pointwise=true` (off by default on the tiny
  model): `default`'s rows, since the recompute gives the same gradients bit for bit.
An equality test compares two code paths, so a change that moves both sides passes it; these fail when
any number of the pinned runs moves.

Tolerance: rewards, token counts and the zero-variance share exactly (they are counts, and sampling is
seeded per group); the rest to 1e-5 relative (1e-7 absolute), room for another CPU's float summation
order. A change that must move these numbers says which and why, and re-records them
(`python tests/test_golden.py` prints the rows)."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import grpo_process, metric_rows

COMMON = ["train", "trainer.threads=1", "trainer.progress=false", "trainer.eval_before_after=false", "trainer.eval_every=0"]
WORKLOADS = {
    "default": [*COMMON, "trainer.steps=5"],
    "tool_use": [*COMMON, "experiment=tool_use", "trainer.steps=3", "trainer.prompts_per_step=4",
                 "trainer.log_completions_every=0"],
    "staleness_1": [*COMMON, "trainer.steps=4", "trainer.max_staleness=1"],
    "default_padded": [*COMMON, "trainer.steps=5", "trainer.packing=false"],
    "default_unshared": [*COMMON, "trainer.steps=5", "trainer.shared_prompts=false"],
    "default_recompute": [*COMMON, "trainer.steps=5", "model.recompute_pointwise=true"],
}
EXACT = ("step", "reward_mean", "completion_tokens", "zero_var_frac")
CLOSE = ("reward_std", "loss", "kl", "grad_norm", "entropy")
EXTRA = {"default": (), "tool_use": ("env/tool_calls", "env/turns"), "staleness_1": ("ratio_mean", "staleness"),
         "default_padded": ("padding_frac",), "default_unshared": (), "default_recompute": ()}
GOLDEN = {
    "default": [
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
    ],
    "tool_use": [
        {"step": 1, "reward_mean": 0.0, "completion_tokens": 620, "zero_var_frac": 1.0, "reward_std": 0.0, "loss": 0.0,
         "kl": 0.0, "grad_norm": 0.0, "entropy": 0.2830053021830897, "env/tool_calls": 0.21875, "env/turns": 1.21875},
        {"step": 2, "reward_mean": 0.21875, "completion_tokens": 901, "zero_var_frac": 0.5, "reward_std": 0.41339864235384227,
         "loss": 1.4901161193847656e-08, "kl": 0.0, "grad_norm": 0.4991166293621063, "entropy": 0.16366875211353704,
         "env/tool_calls": 0.34375, "env/turns": 1.34375},
        {"step": 3, "reward_mean": 0.09375, "completion_tokens": 416, "zero_var_frac": 0.5, "reward_std": 0.2914805954090255,
         "loss": 5.857646465301514e-05, "kl": 0.0004909991358335202, "grad_norm": 0.8442478775978088,
         "entropy": 0.3914812894967886, "env/tool_calls": 0.125, "env/turns": 1.125},
    ],
    "default_padded": [  # the default run with trainer.packing=false: the padded forward, to the bit here
        {"step": 1, "reward_mean": 0.51953125, "completion_tokens": 760, "zero_var_frac": 0.0625, "reward_std": 0.49961838464315694, "loss": -2.3283064365386963e-09, "kl": 0.0, "grad_norm": 0.9011357426643372, "entropy": 0.43226227007414164, "padding_frac": 0.041666666666666664},
        {"step": 2, "reward_mean": 0.49609375, "completion_tokens": 760, "zero_var_frac": 0.09375, "reward_std": 0.49998474097809975, "loss": 5.322648212313652e-05, "kl": 0.0012950715461843892, "grad_norm": 0.7075716257095337, "entropy": 0.4422290701615183, "padding_frac": 0.059027777777777776},
        {"step": 3, "reward_mean": 0.546875, "completion_tokens": 753, "zero_var_frac": 0.0625, "reward_std": 0.4977978850648122, "loss": 0.00018153851851820946, "kl": 0.004557107232639673, "grad_norm": 0.5580087900161743, "entropy": 0.46994243485044196, "padding_frac": 0.062065972222222224},
        {"step": 4, "reward_mean": 0.5703125, "completion_tokens": 768, "zero_var_frac": 0.03125, "reward_std": 0.49503146601377773, "loss": 0.0002956376411020756, "kl": 0.007390799233689904, "grad_norm": 0.7336628437042236, "entropy": 0.4054175913333893, "padding_frac": 0.03125},
        {"step": 5, "reward_mean": 0.55859375, "completion_tokens": 765, "zero_var_frac": 0.15625, "reward_std": 0.49655490377292366, "loss": 0.0006410649511963129, "kl": 0.01583812423780853, "grad_norm": 0.637715756893158, "entropy": 0.41080696255553, "padding_frac": 0.126171875},
    ],
    "staleness_1": [  # step 1 is the default run's (nothing is stale yet); from step 2 on the sampler lags one update
        {"step": 1, "reward_mean": 0.51953125, "completion_tokens": 760, "zero_var_frac": 0.0625,
         "reward_std": 0.49961838464315694, "loss": -2.3283064365386963e-09, "kl": 0.0, "grad_norm": 0.9011357426643372,
         "entropy": 0.43226227007414164, "ratio_mean": 1.0, "staleness": 0.0},
        {"step": 2, "reward_mean": 0.47265625, "completion_tokens": 760, "zero_var_frac": 0.09375,
         "reward_std": 0.4992517594720498, "loss": -0.012478347169235349, "kl": 0.0013454141585450424,
         "grad_norm": 0.7064539790153503, "entropy": 0.44223412965473374, "ratio_mean": 1.0003048143888775, "staleness": 1.0},
        {"step": 3, "reward_mean": 0.515625, "completion_tokens": 752, "zero_var_frac": 0.03125,
         "reward_std": 0.49975579974123363, "loss": -0.012130876537412405, "kl": 0.004738025922090449,
         "grad_norm": 0.5881026387214661, "entropy": 0.4695352189084317, "ratio_mean": 1.0002778438811606, "staleness": 1.0},
        {"step": 4, "reward_mean": 0.53515625, "completion_tokens": 768, "zero_var_frac": 0.03125,
         "reward_std": 0.4987625066962607, "loss": -0.01006966782733798, "kl": 0.007458925635243456,
         "grad_norm": 0.6741356253623962, "entropy": 0.4061363736788432, "ratio_mean": 0.9997841715812683, "staleness": 1.0},
    ],
}
GOLDEN["default_unshared"] = GOLDEN["default"]  # each prompt computed G times: the rows recorded before sharing
GOLDEN["default_recompute"] = GOLDEN["default"]  # norms and MLPs recomputed in the backward: bitwise the same gradients


def workload_rows(name: str, out: Path) -> list[dict]:
    grpo_process(*WORKLOADS[name], f"output_dir={out}", timeout=300, check_rc=0)
    return metric_rows(out, training=True)


@pytest.mark.parametrize("name", list(WORKLOADS))
def test_a_pinned_runs_first_rows_are_the_recorded_ones(name, tmp_path):
    rows = workload_rows(name, tmp_path / "run")
    assert len(rows) == len(GOLDEN[name])
    for row, want in zip(rows, GOLDEN[name]):
        assert {k: row[k] for k in EXACT} == {k: want[k] for k in EXACT}
        for k in CLOSE + EXTRA[name]:
            assert row[k] == pytest.approx(want[k], rel=1e-5, abs=1e-7), (name, row["step"], k)


if __name__ == "__main__":
    import sys
    import tempfile

    for name in sys.argv[1:] or WORKLOADS:
        with tempfile.TemporaryDirectory() as d:
            print(name)
            for r in workload_rows(name, Path(d) / "run"):
                print("   ", {k: r[k] for k in EXACT + CLOSE + EXTRA[name]})
