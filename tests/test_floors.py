"""The line `grpo train` ends with (grpo_cli/run/floors.py): each phase's share, and the largest against
its floor, checked against numbers worked by hand."""

from __future__ import annotations

import pytest
import torch

from grpo_cli.run import floors
from helpers import FAST, grpo

ROWS = [{"gen_s": 1.0, "env_s": 0.25, "score_s": 0.5, "update_s": 2.0, "push_s": 0.25, "wait_s": 0.5, "completion_len_max": 10,
         "prompt_tokens": 100, "completion_tokens": 50},
        {"gen_s": 1.0, "score_s": 0.5, "update_s": 2.0, "completion_len_max": 30, "prompt_tokens": 100,
         "completion_tokens": 150}]


def test_phase_seconds_split_the_environment_out_of_generation():
    assert floors.phase_seconds(ROWS) == {"generation": 1.75, "environment": 0.25, "scoring": 1.0, "update": 4.0,
                                          "push": 0.25, "wait": 0.5}


def test_floors_by_hand():
    """P = 1e6 parameters of 4e6 bytes, 1 GB/s, 10 GFLOP/s, one extra forward, two passes:
    generation = 10 x 4e6 / 1e9 + 2e6 x 100 / 1e10 = 0.06 (row 1) and 30 x 4e6 / 1e9 + 0.02 = 0.14 (row 2);
    scoring = 2e6 x 150 / 1e10 = 0.03 and 2e6 x 250 / 1e10 = 0.05; update = 2 x 6e6 x 150 / 1e10 = 0.18 and
    2 x 6e6 x 250 / 1e10 = 0.30."""
    got = floors.floor_seconds(ROWS, 10**6, 4e6, 1e9, 1e10, forwards=1, passes=2)
    assert got["generation"] == pytest.approx(0.20) and got["scoring"] == pytest.approx(0.08)
    assert got["update"] == pytest.approx(0.48) and got["environment"] is None and got["push"] is None
    assert got["wait"] is None
    assert floors.floor_seconds(ROWS, 10**6, 4e6, 1e9, 1e10, forwards=0, passes=1)["scoring"] is None


def test_the_line_names_the_largest_phase_and_its_ratio(monkeypatch):
    monkeypatch.setattr(floors, "machine_peaks", lambda device, dtype: (1e9, 1e10))
    line = floors.bottleneck_line(ROWS, 10**6, 4e6, torch.device("cpu"), torch.float32, forwards=1, passes=2)
    # 7.75 s over 2 steps; update 4.0 s against 0.48 s: 8.3x
    assert line.startswith("time: update 52%, generation 23%, scoring 13%, wait 6%, environment 3%, push 3% of 3.88 s per step")
    assert "the largest, update, is 8.3x its floor (2.000 s per step against 0.2400 s at the 1 GB/s and 10 GFLOP/s" in line
    env_bound = [{"gen_s": 3.0, "env_s": 2.5, "update_s": 1.0, "completion_len_max": 1, "prompt_tokens": 1,
                  "completion_tokens": 1}]
    assert "environment is the largest, and has no floor here" in floors.bottleneck_line(
        env_bound, 10**6, 4e6, torch.device("cpu"), torch.float32, forwards=0, passes=1)


def test_a_run_ends_with_the_line_and_its_rows_carry_prompt_tokens(tmp_path, capsys):
    assert grpo("train", *FAST, f"output_dir={tmp_path}") == 0
    captured = capsys.readouterr()
    out = captured.out + captured.err
    line = next((x for x in out.splitlines() if x.startswith("time: ")), out[-3000:])
    assert "its floor" in line and "GFLOP/s measured here" in line
    import json

    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert all(r["prompt_tokens"] > 0 and isinstance(r["prompt_tokens"], int) for r in rows if "reward_mean" in r)


@pytest.mark.parametrize("extra", [[], ["trainer.max_staleness=1"]], ids=["in-process", "worker"])
def test_a_row_s_seconds_is_the_step_s_wall_time_with_every_phase_and_wait_inside_it(extra, tmp_path):
    """With a generation worker the trainer waits for the worker's answers before each push: logged as
    `wait_s`, apart from the push, and inside the step's `seconds` (its wall time), never outside it."""
    import json

    assert grpo("train", *FAST, "trainer.steps=3", f"output_dir={tmp_path}", *extra) == 0
    rows = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    rows = [r for r in rows if "reward_mean" in r]
    assert len(rows) == 3
    for r in rows:
        phases = r["gen_s"] + r["score_s"] + r["update_s"] + r.get("push_s", 0.0) + r.get("wait_s", 0.0)
        assert r["seconds"] >= phases - 1e-6, r
        assert r["tokens_per_s"] == pytest.approx(r["completion_tokens"] / r["seconds"])
    if extra:
        assert all(r["wait_s"] >= 0 and r["push_s"] >= 0 for r in rows)
