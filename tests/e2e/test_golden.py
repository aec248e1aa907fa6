"""Golden trajectories: the first training rows of six runs, pinned as recorded on a 2-core AMD EPYC (AVX2),
one thread, held-out scoring off (it draws no training randomness), at commit e1482e9, the last before the loss
ran on flat tokens (with the grid it replaced, every pass scored [rows, T] rectangles):
- `default`: the default run (`grpo train`);
- `tool_use`: the tool-use demo (`experiment=tool_use`: multi-turn episodes with a calculator), 4 prompts a step;
- `staleness_1`: the default run with generation in a worker process one update behind (`trainer.max_staleness=1`);
- `default_padded`: `trainer.packing=false` (the padded forward, the golden comparison's setting);
- `default_unshared`: `trainer.shared_prompts=false` (each prompt computed G times);
- `default_recompute`: `model.recompute_pointwise=true` (off by default on the tiny model).
An equality test compares two code paths, so a change that moves both sides passes it; these fail when any
number of the pinned runs moves.

Tolerance: rewards, token counts and the zero-variance share exactly (they are counts, and sampling is seeded per
group); the rest to 1e-6 relative, or 1e-7 absolute for a loss that is a near-cancelling sum (the tool-use
demo's flat-token loss summed its tokens in another order: 5.8628e-05 against 5.8578e-05 at step 3, with the same
gradient norm to the bit). A change that must move these numbers says which and why, and re-records them
(`python tests/e2e/test_golden.py` prints the rows). The entropy column was re-recorded at the commit that took
the logged entropy on shifted logits with a precise sum (1-3.5e-6 relative, the old formula's error; the
other columns are e1482e9's), on a 2-core AMD EPYC with AVX-512."""

from __future__ import annotations

from pathlib import Path

import pytest

from helpers import grpo_process, metric_rows

COMMON = [
    "train",
    "trainer.threads=1",
    "trainer.progress=false",
    "trainer.eval_before_after=false",
    "trainer.eval_every=0",
]
WORKLOADS = {
    "default": [*COMMON, "trainer.steps=5"],
    "tool_use": [
        *COMMON,
        "experiment=tool_use",
        "trainer.steps=3",
        "trainer.prompts_per_step=4",
        "trainer.log_completions_every=0",
    ],
    "staleness_1": [*COMMON, "trainer.steps=4", "trainer.max_staleness=1"],
    "default_padded": [*COMMON, "trainer.steps=5", "trainer.packing=false"],
    "default_unshared": [*COMMON, "trainer.steps=5", "trainer.shared_prompts=false"],
    "default_recompute": [*COMMON, "trainer.steps=5", "model.recompute_pointwise=true"],
}
EXACT = ("step", "reward_mean", "completion_tokens", "zero_var_frac")
CLOSE = ("reward_std", "loss", "kl", "grad_norm", "entropy")
EXTRA = {
    "default": (),
    "tool_use": ("env/tool_calls", "env/turns"),
    "staleness_1": ("ratio_mean", "staleness"),
    "default_padded": ("padding_frac",),
    "default_unshared": (),
    "default_recompute": (),
}
GOLDEN = {
    "default": [
        {
            "step": 1,
            "reward_mean": 0.51953125,
            "completion_tokens": 760,
            "zero_var_frac": 0.0625,
            "reward_std": 0.49961838464315694,
            "loss": -2.3283064365386963e-09,
            "kl": 0.0,
            "grad_norm": 0.9011359214782715,
            "entropy": 0.43226215964869447,
        },
        {
            "step": 2,
            "reward_mean": 0.49609375,
            "completion_tokens": 760,
            "zero_var_frac": 0.09375,
            "reward_std": 0.49998474097809975,
            "loss": 5.322648212313652e-05,
            "kl": 0.0012950678012872998,
            "grad_norm": 0.7075716853141785,
            "entropy": 0.4422289697747481,
        },
        {
            "step": 3,
            "reward_mean": 0.546875,
            "completion_tokens": 753,
            "zero_var_frac": 0.0625,
            "reward_std": 0.4977978850648122,
            "loss": 0.0001815357245504856,
            "kl": 0.004557105095421334,
            "grad_norm": 0.5580088496208191,
            "entropy": 0.4699424855104322,
        },
        {
            "step": 4,
            "reward_mean": 0.5703125,
            "completion_tokens": 768,
            "zero_var_frac": 0.03125,
            "reward_std": 0.49503146601377773,
            "loss": 0.0002956376411020756,
            "kl": 0.00739079643972218,
            "grad_norm": 0.7336627840995789,
            "entropy": 0.40541738271713257,
        },
        {
            "step": 5,
            "reward_mean": 0.55859375,
            "completion_tokens": 765,
            "zero_var_frac": 0.15625,
            "reward_std": 0.49655490377292366,
            "loss": 0.0006410649511963129,
            "kl": 0.01583812267951716,
            "grad_norm": 0.6377158761024475,
            "entropy": 0.4108067531211703,
        },
    ],
    "tool_use": [
        {
            "step": 1,
            "reward_mean": 0.0,
            "completion_tokens": 620,
            "zero_var_frac": 1.0,
            "reward_std": 0.0,
            "loss": 0.0,
            "kl": 0.0,
            "grad_norm": 0.0,
            "entropy": 0.2830054252378402,
            "env/tool_calls": 0.21875,
            "env/turns": 1.21875,
        },
        {
            "step": 2,
            "reward_mean": 0.21875,
            "completion_tokens": 901,
            "zero_var_frac": 0.5,
            "reward_std": 0.41339864235384227,
            "loss": 1.4901161193847656e-08,
            "kl": 0.0,
            "grad_norm": 0.4991167187690735,
            "entropy": 0.16366885372589485,
            "env/tool_calls": 0.34375,
            "env/turns": 1.34375,
        },
        {
            "step": 3,
            "reward_mean": 0.09375,
            "completion_tokens": 416,
            "zero_var_frac": 0.5,
            "reward_std": 0.2914805954090255,
            "loss": 5.857832729816437e-05,
            "kl": 0.0004910113146671882,
            "grad_norm": 0.8442468047142029,
            "entropy": 0.3914813995361328,
            "env/tool_calls": 0.125,
            "env/turns": 1.125,
        },
    ],
    "staleness_1": [  # step 1 is the default run's (nothing is stale yet); from step 2 on the sampler lags one update
        {
            "step": 1,
            "reward_mean": 0.51953125,
            "completion_tokens": 760,
            "zero_var_frac": 0.0625,
            "reward_std": 0.49961838464315694,
            "loss": -2.3283064365386963e-09,
            "kl": 0.0,
            "grad_norm": 0.9011359214782715,
            "entropy": 0.43226215964869447,
            "ratio_mean": 1.0,
            "staleness": 0.0,
        },
        {
            "step": 2,
            "reward_mean": 0.47265625,
            "completion_tokens": 760,
            "zero_var_frac": 0.09375,
            "reward_std": 0.4992517594720498,
            "loss": -0.01247831853106618,
            "kl": 0.0013454112959535498,
            "grad_norm": 0.7064538598060608,
            "entropy": 0.4422340493453176,
            "ratio_mean": 1.0003047742341693,
            "staleness": 1.0,
        },
        {
            "step": 3,
            "reward_mean": 0.515625,
            "completion_tokens": 752,
            "zero_var_frac": 0.03125,
            "reward_std": 0.49975579974123363,
            "loss": -0.012130912626162171,
            "kl": 0.004738023782030065,
            "grad_norm": 0.5881026387214661,
            "entropy": 0.46953526963578895,
            "ratio_mean": 1.0002778641721035,
            "staleness": 1.0,
        },
        {
            "step": 4,
            "reward_mean": 0.53515625,
            "completion_tokens": 768,
            "zero_var_frac": 0.03125,
            "reward_std": 0.4987625066962607,
            "loss": -0.01006966340355575,
            "kl": 0.0074589146533980966,
            "grad_norm": 0.6741356253623962,
            "entropy": 0.40613630414009094,
            "ratio_mean": 0.9997841914494833,
            "staleness": 1.0,
        },
    ],
    "default_padded": [  # the default run with trainer.packing=false: the padded forward
        {
            "step": 1,
            "reward_mean": 0.51953125,
            "completion_tokens": 760,
            "zero_var_frac": 0.0625,
            "reward_std": 0.49961838464315694,
            "loss": -2.3283064365386963e-09,
            "kl": 0.0,
            "grad_norm": 0.9011358022689819,
            "entropy": 0.4322621194939864,
            "padding_frac": 0.041666666666666664,
        },
        {
            "step": 2,
            "reward_mean": 0.49609375,
            "completion_tokens": 760,
            "zero_var_frac": 0.09375,
            "reward_std": 0.49998474097809975,
            "loss": 5.322648212313652e-05,
            "kl": 0.0012950742911351355,
            "grad_norm": 0.7075715661048889,
            "entropy": 0.4422289798134252,
            "padding_frac": 0.059027777777777776,
        },
        {
            "step": 3,
            "reward_mean": 0.546875,
            "completion_tokens": 753,
            "zero_var_frac": 0.0625,
            "reward_std": 0.4977978850648122,
            "loss": 0.00018153665587306023,
            "kl": 0.004557108657451898,
            "grad_norm": 0.5580088496208191,
            "entropy": 0.4699424855104322,
            "padding_frac": 0.062065972222222224,
        },
        {
            "step": 4,
            "reward_mean": 0.5703125,
            "completion_tokens": 768,
            "zero_var_frac": 0.03125,
            "reward_std": 0.49503146601377773,
            "loss": 0.0002956376411020756,
            "kl": 0.0073907938785851,
            "grad_norm": 0.7336629629135132,
            "entropy": 0.40541742245356244,
            "padding_frac": 0.03125,
        },
        {
            "step": 5,
            "reward_mean": 0.55859375,
            "completion_tokens": 765,
            "zero_var_frac": 0.15625,
            "reward_std": 0.49655490377292366,
            "loss": 0.0006410649511963129,
            "kl": 0.015838131405948815,
            "grad_norm": 0.637715756893158,
            "entropy": 0.4108067431481056,
            "padding_frac": 0.126171875,
        },
    ],
    "default_unshared": [  # each prompt computed G times
        {
            "step": 1,
            "reward_mean": 0.51953125,
            "completion_tokens": 760,
            "zero_var_frac": 0.0625,
            "reward_std": 0.49961838464315694,
            "loss": -2.3283064365386963e-09,
            "kl": 0.0,
            "grad_norm": 0.9011358618736267,
            "entropy": 0.4322621194939864,
        },
        {
            "step": 2,
            "reward_mean": 0.49609375,
            "completion_tokens": 760,
            "zero_var_frac": 0.09375,
            "reward_std": 0.49998474097809975,
            "loss": 5.322648212313652e-05,
            "kl": 0.001295071918713419,
            "grad_norm": 0.7075715065002441,
            "entropy": 0.4422289396587171,
        },
        {
            "step": 3,
            "reward_mean": 0.546875,
            "completion_tokens": 753,
            "zero_var_frac": 0.0625,
            "reward_std": 0.4977978850648122,
            "loss": 0.00018153665587306023,
            "kl": 0.004557105807827447,
            "grad_norm": 0.5580088496208191,
            "entropy": 0.4699425057744283,
        },
        {
            "step": 4,
            "reward_mean": 0.5703125,
            "completion_tokens": 768,
            "zero_var_frac": 0.03125,
            "reward_std": 0.49503146601377773,
            "loss": 0.00029563717544078827,
            "kl": 0.007390798263562222,
            "grad_norm": 0.7336629033088684,
            "entropy": 0.4054173727830251,
        },
        {
            "step": 5,
            "reward_mean": 0.55859375,
            "completion_tokens": 765,
            "zero_var_frac": 0.15625,
            "reward_std": 0.49655490377292366,
            "loss": 0.0006410649511963129,
            "kl": 0.015838130938461405,
            "grad_norm": 0.6377156972885132,
            "entropy": 0.41080669328278185,
        },
    ],
}
# norms and MLPs recomputed in the backward: less memory, the very same numbers as the default run
GOLDEN["default_recompute"] = GOLDEN["default"]


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
            assert row[k] == pytest.approx(want[k], rel=1e-6, abs=1e-7), (name, row["step"], k, row[k], want[k])


if __name__ == "__main__":
    import sys
    import tempfile

    for name in sys.argv[1:] or WORKLOADS:
        with tempfile.TemporaryDirectory() as d:
            print(name)
            for r in workload_rows(name, Path(d) / "run"):
                print("   ", {k: r[k] for k in EXACT + CLOSE + EXTRA[name]})
