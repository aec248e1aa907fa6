"""The line `grpo train` ends with (grpo_cli/run/floors.py): each phase's share, and the largest against
its floor, checked against numbers worked by hand."""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

from grpo_cli.run import floors, probe
from helpers import FAST, grpo

ROWS = [
    {
        "gen_s": 1.0,
        "env/seconds": 0.25,
        "score_s": 0.5,
        "update_s": 2.0,
        "push_s": 0.25,
        "wait_s": 0.5,
        "completion_len_max": 10,
        "prompt_tokens": 100,
        "completion_tokens": 50,
    },
    {
        "gen_s": 1.0,
        "score_s": 0.5,
        "update_s": 2.0,
        "completion_len_max": 30,
        "prompt_tokens": 100,
        "completion_tokens": 150,
    },
]


def test_phase_seconds_split_the_environment_out_of_generation():
    assert floors.phase_seconds(ROWS) == {
        "generation": 1.75,
        "environment": 0.25,
        "scoring": 1.0,
        "update": 4.0,
        "push": 0.25,
        "wait": 0.5,
    }


def test_floors_by_hand():
    """P = 1e6 parameters of 4e6 bytes, 1 GB/s, 10 GFLOP/s, one extra forward, two passes:
    generation = 10 x 4e6 / 1e9 + 2e6 x 100 / 1e10 = 0.06 (row 1) and 30 x 4e6 / 1e9 + 0.02 = 0.14 (row 2), the
    weights' reads longer than the decoded tokens' 2e6 x 50 / 1e10 = 0.01 and 2e6 x 150 / 1e10 = 0.03;
    scoring = 2e6 x 150 / 1e10 = 0.03 and 2e6 x 250 / 1e10 = 0.05; update = 2 x 6e6 x 150 / 1e10 = 0.18 and
    2 x 6e6 x 250 / 1e10 = 0.30."""
    got = floors.floor_seconds(ROWS, 10**6, 4e6, 1e9, 1e10, forwards=1, passes=2)
    assert got["generation"] == pytest.approx(0.20) and got["scoring"] == pytest.approx(0.08)
    assert got["update"] == pytest.approx(0.48) and got["environment"] is None and got["push"] is None
    assert got["wait"] is None
    assert floors.floor_seconds(ROWS, 10**6, 4e6, 1e9, 1e10, forwards=0, passes=1)["scoring"] is None
    # G = 4 samples share each prompt's prefill: 0.04 + 0.02 / 4 and 0.12 + 0.02 / 4
    assert floors.floor_seconds(ROWS, 10**6, 4e6, 1e9, 1e10, 1, 2, group_size=4)["generation"] == pytest.approx(0.17)
    # Decoding 2,000 tokens in 10 steps computes 2e6 x 2,000 / 1e10 = 0.4 s, more than the 0.04 s its 10 reads of
    # the weights take: the compute-bound floor, plus the prefill's 0.02.
    wide = {"completion_len_max": 10, "prompt_tokens": 100, "completion_tokens": 2000}
    assert floors.floor_seconds([wide], 10**6, 4e6, 1e9, 1e10, 1, 2)["generation"] == pytest.approx(0.42)
    # Sampled in bf16 at 4e10 FLOP/s: 2e6 x 2,000 / 4e10 = 0.1 s and the prefill 0.005; the update keeps 1e10
    bf16 = floors.floor_seconds([wide], 10**6, 2e6, 1e9, 1e10, 1, 2, sample_flops=4e10)
    assert bf16["generation"] == pytest.approx(0.105) and bf16["update"] == pytest.approx(2 * 6e6 * 2100 / 1e10)


def test_ranks_each_compute_their_share_of_the_summed_tokens():
    """Two data-parallel ranks: the row's tokens are the two ranks' sum, each rank computing half at its own
    peaks. test_floors_by_hand's row 2 (100 prompt and 150 completion tokens): scoring 2e6 x 125 / 1e10 = 0.025,
    update 2 x 6e6 x 125 / 1e10 = 0.15, generation max(30 x 4e6 / 1e9, 2e6 x 75 / 1e10) + 2e6 x 50 / 1e10 =
    0.12 + 0.01; a rollout's gen_floor_s is already one rank's, kept as it is."""
    got = floors.floor_seconds([ROWS[1]], 10**6, 4e6, 1e9, 1e10, forwards=1, passes=2, ranks=2)
    assert got["scoring"] == pytest.approx(0.025) and got["update"] == pytest.approx(0.15)
    assert got["generation"] == pytest.approx(0.13)
    rolled = floors.floor_seconds([{**ROWS[1], "gen_floor_s": 0.07}], 10**6, 4e6, 1e9, 1e10, 1, 2, ranks=2)
    assert rolled["generation"] == pytest.approx(0.07)
    halves = floors.StepFloors(10**6, 4e6, 1e9, 1e10, forwards=1, passes=2, ranks=2).efficiency(ROWS[1])
    assert halves["efficiency/update"] == pytest.approx(0.15 / 2.0)


def test_a_run_that_samples_in_bf16_takes_generation_s_floor_at_bf16_s_peak(monkeypatch):
    """generator.weights=bf16 in an fp32 run: generation reads bf16 weights and computes at bf16's FLOP/s."""
    from types import SimpleNamespace

    from grpo_cli.models.precision import Precision

    peaks = {torch.float32: (2e10, 1e11), torch.bfloat16: (2e10, 3e11)}
    monkeypatch.setattr(floors, "cached_peaks", lambda device, dtype: peaks[dtype])
    policy = torch.nn.Linear(100, 10)  # 1,010 parameters
    cfg = SimpleNamespace(
        generator=SimpleNamespace(weights="bf16"),
        sampler=SimpleNamespace(group_size=4),
        algo=SimpleNamespace(beta=0.0, num_iterations=1),
    )
    monkeypatch.setattr(floors, "reference_in_worker", lambda cfg: False)
    got = floors.StepFloors.of(cfg, policy, Precision("fp32"))
    assert (got.weight_bytes, got.flops, got.sample_flops) == (2020, 1e11, 3e11)
    cfg.generator.weights = "full"
    got = floors.StepFloors.of(cfg, policy, Precision("fp32"))
    assert (got.weight_bytes, got.flops, got.sample_flops) == (4040, 1e11, None)


HAND = floors.StepFloors(params=10**6, weight_bytes=4e6, bandwidth=1e9, flops=1e10, forwards=1, passes=2)


def test_each_row_s_efficiency_is_its_phases_floor_over_their_seconds():
    """test_floors_by_hand's floors over the rows' seconds. Row 2: generation 0.14 / 1.0, scoring 0.05 / 0.5,
    update 0.30 / 2.0. Row 1 comes from a generation worker (it has wait_s): the update's alone, 0.18 / 2.0.
    No scoring floor without an extra forward."""
    assert HAND.efficiency(ROWS[1]) == pytest.approx(
        {"efficiency/generation": 0.14, "efficiency/scoring": 0.10, "efficiency/update": 0.15}
    )
    assert HAND.efficiency(ROWS[0]) == pytest.approx({"efficiency/update": 0.09})
    no_forward = floors.StepFloors(10**6, 4e6, 1e9, 1e10, forwards=0, passes=1)
    assert set(no_forward.efficiency(ROWS[1])) == {"efficiency/generation", "efficiency/update"}


def test_a_worker_s_rows_take_generation_and_scoring_from_what_the_worker_measured():
    """Row 1 with the worker's own seconds: generation 0.06 over 0.6 - 0.25 s of environment = 0.35 s; scoring,
    the worker scoring the KL reference (one forward), 0.03 / 0.3; the update 0.18 / 2.0 as before. A worker
    that scores nothing has no scoring floor."""
    row = {**ROWS[0], "worker/gen_s": 0.6, "worker/score_s": 0.3}
    scoring_worker = replace(HAND, worker_forwards=1)
    assert scoring_worker.efficiency(row) == pytest.approx(
        {"efficiency/generation": 0.06 / 0.35, "efficiency/scoring": 0.1, "efficiency/update": 0.09}
    )
    assert set(replace(HAND, worker_forwards=0).efficiency(row)) == {"efficiency/generation", "efficiency/update"}


def test_the_peaks_are_probed_once_per_machine_and_cached(tmp_path, monkeypatch):
    calls = []
    monkeypatch.setenv("GRPO_CLI_CACHE", str(tmp_path))
    monkeypatch.setattr(floors, "_PROBED", {})
    monkeypatch.setattr(probe, "machine_peaks", lambda device, dtype: calls.append(dtype) or (2e9, 3e10))
    assert floors.cached_peaks(torch.device("cpu"), torch.float32) == (2e9, 3e10)
    assert floors.cached_peaks(torch.device("cpu"), torch.float32) == (2e9, 3e10)
    assert floors.cached_peaks(torch.device("cpu"), torch.bfloat16) == (2e9, 3e10)
    assert calls == [torch.float32, torch.bfloat16]  # once per dtype
    (tmp_path / "peaks.json").write_text("not json")  # a damaged (or unwritable) cache: this process remembers
    assert floors.cached_peaks(torch.device("cpu"), torch.float32) == (2e9, 3e10) and len(calls) == 2
    monkeypatch.setattr(floors, "_PROBED", {})  # the next process probes again
    assert floors.cached_peaks(torch.device("cpu"), torch.float32) == (2e9, 3e10) and len(calls) == 3


def test_the_bandwidth_probe_reads_twice_the_last_level_cache(tmp_path, monkeypatch):
    """Smaller, its reads would come from the cache, not the memory the weights are read from each decode step."""
    for index, size in (("index0", "48K"), ("index2", "2048K"), ("index3", "32768K"), ("index4", "odd")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "size").write_text(size + "\n")
    assert probe.last_level_cache(tmp_path) == 32 << 20
    assert probe.last_level_cache(tmp_path / "absent") == 32 << 20  # not Linux: a common size
    for cache, size in ((32 << 20, 64 << 20), (8 << 20, 64 << 20), (96 << 20, 192 << 20), (1 << 30, 256 << 20)):
        monkeypatch.setattr(probe, "last_level_cache", lambda cache=cache: cache)
        assert probe.probe_bytes(torch.device("cpu")) == size


def test_the_line_names_the_largest_phase_and_its_ratio():
    line = floors.bottleneck_line(ROWS, HAND)
    # 7.75 s over 2 steps; update 4.0 s against 0.48 s: 8.3x
    assert line.startswith(
        "time: update 52%, generation 23%, scoring 13%, wait 6%, environment 3%, push 3% of 3.88 s per step"
    )
    assert (
        "the largest, update, is 8.3x its floor, efficiency 0.12 (2.000 s per step against 0.2400 s at the 1 GB/s "
        "and 10 GFLOP/s"
    ) in line
    gen_bound = [dict(ROWS[0], gen_s=9.0)]  # sampled in bf16 (generator.weights=bf16): its floor is at bf16's peak
    assert "and 10 GFLOP/s measured" in floors.bottleneck_line(gen_bound, HAND)
    assert "and 40 GFLOP/s (bf16) measured" in floors.bottleneck_line(gen_bound, replace(HAND, sample_flops=4e10))
    env_bound = [
        {
            "gen_s": 3.0,
            "env/seconds": 2.5,
            "update_s": 1.0,
            "completion_len_max": 1,
            "prompt_tokens": 1,
            "completion_tokens": 1,
        }
    ]
    assert "environment is the largest, and has no floor here" in floors.bottleneck_line(env_bound, HAND)


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
    assert all(0 < r["efficiency/update"] < 1.5 for r in rows)
    # with a worker the trainer's gen_s is a wait: generation's efficiency is taken from the worker's own seconds
    assert all(0 < r["efficiency/generation"] < 1.5 for r in rows)
    if extra:
        assert all(r["worker/gen_s"] > 0 for r in rows)


def test_the_benchmark_table_sums_floors_and_seconds_by_hand():
    """scripts/bench_floors.py: two rows, update 2 s at efficiency 0.5 and 1 s at 0.25: floors 1.0 + 0.25 over 3 s
    of update is 0.42 over the run, 1.5 s and 0.625 s per step; generation has no efficiency (a worker's rows)."""
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(
        "bench_floors", Path(__file__).parents[2] / "scripts" / "bench_floors.py"
    )
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    rows = [
        {"gen_s": 1.0, "update_s": 2.0, "seconds": 3.5, "efficiency/update": 0.5, "wait_s": 0.0},
        {"gen_s": 1.0, "update_s": 1.0, "seconds": 2.5, "efficiency/update": 0.25, "wait_s": 0.0},
    ]
    lines = bench.table(rows)
    assert lines[1].split() == ["generation", "1.000", "-", "-"]
    assert lines[3].split() == ["update", "1.500", "0.625", "0.42"]
    assert lines[4].split() == ["step", "(wall)", "3.000"]


PROBE = """
import json, torch
from grpo_cli.models.runtime import returned_when_freed, reuse_freed_memory
from grpo_cli.run.probe import machine_peaks, probe_bytes
def anon():
    return next(int(l.split()[1]) for l in open("/proc/self/status") if l.startswith("RssAnon")) / 1024
applied, grown = reuse_freed_memory(), {}
for name in ("returned", "kept"):  # returned first: the kept heap's holes would otherwise hide its cost
    before = anon()
    if name == "returned":
        with returned_when_freed():
            machine_peaks(torch.device("cpu"), torch.float32)
    else:
        machine_peaks(torch.device("cpu"), torch.float32)
    grown[name] = anon() - before
print(json.dumps({"applied": applied, "probe": probe_bytes(torch.device("cpu")) / 2**20, **grown}))
"""


@pytest.mark.skipif(
    platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
    reason="the probe's buffers are returned through glibc's mallopt; this is not Linux with glibc",
)
def test_the_machine_probe_leaves_no_memory_behind():
    """The probe reads a buffer it wrote first, at least 64 MiB. Under reuse_freed_memory (the kept heap) it would
    stay in the process's memory for the whole run, and in its peak: measured, as the control, it does (which
    also shows its pages were written: a buffer never written reads as the kernel's zero page, one page in
    cache, not memory); probed as a run probes (returned_when_freed), it goes back to the kernel."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    out = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    grown = json.loads(out.stdout.strip().splitlines()[-1])
    assert grown["applied"]
    assert grown["kept"] >= 0.95 * grown["probe"], grown  # MiB: the control keeps the probe's whole buffer
    assert grown["returned"] < 8, grown


def _rollout(lengths, prompt_lengths, loss_mask, group_size, weight=None):
    from grpo_cli.samples.rollout import Rollout

    return Rollout(
        prompts=["p"] * (len(lengths) // group_size),
        group_size=group_size,
        tokens=torch.zeros(sum(lengths), dtype=torch.long),
        lengths=torch.tensor(lengths),
        prompt_lengths=torch.tensor(prompt_lengths),
        loss_mask=torch.tensor(loss_mask),
        truncated=torch.zeros(len(lengths), dtype=torch.bool),
        weight=None if weight is None else torch.tensor(weight, dtype=torch.float32),
    )


def test_the_decode_roofline_by_hand():
    """Two rows after 3-token contexts sample 4 and 2 tokens: the first of each from the prefill, then steps 1-3.
    Weights 100 bytes, 10 bytes a position, 1 byte/s: step 1 reads 100 + 10 x (4 + 4) = 180 (both rows live), step 2
    100 + 10 x 5 = 150 and step 3 100 + 10 x 6 = 160 (the first row alone): 490. At 10 FLOPs a token and 1 FLOP/s
    with nothing to read, the rows' live steps (2 + 1 + 1) x 10 = 40. The longer of the two, step by step."""
    contexts, lengths = torch.tensor([3, 3]), torch.tensor([4, 2])
    assert floors.decode_floor(contexts, lengths, 100, 10, 1, 1, 1) == pytest.approx(490)
    assert floors.decode_floor(contexts, lengths, 0, 0, 1, 10, 1) == pytest.approx(40)
    assert floors.decode_floor(contexts, lengths, 15, 0, 1, 10, 1) == pytest.approx(20 + 15 + 15)  # mixed bounds
    assert floors.decode_floor(contexts, torch.tensor([1, 1]), 100, 10, 1, 1, 1) == 0.0  # all from the prefill


def test_the_decode_roofline_equals_a_step_by_step_count():
    """Against a plain loop over steps and rows, on random contexts and lengths."""
    g = torch.Generator().manual_seed(0)
    for _ in range(20):
        n = int(torch.randint(1, 12, (1,), generator=g))
        contexts, lengths = torch.randint(1, 50, (n,), generator=g), torch.randint(1, 40, (n,), generator=g)
        weight_bytes, kv_bytes, bandwidth, token_flops, flops = 1e6, 4e3, 1e9, 2e6, 5e9
        total = 0.0
        for j in range(1, int(lengths.max())):
            live = [r for r in range(n) if lengths[r] > j]
            reads = (weight_bytes + kv_bytes * sum(int(contexts[r]) + j for r in live)) / bandwidth
            total += max(reads, len(live) * token_flops / flops)
        assert floors.decode_floor(
            contexts, lengths, weight_bytes, kv_bytes, bandwidth, token_flops, flops
        ) == pytest.approx(total, rel=1e-12)


def test_an_episode_s_turns_are_its_runs_of_sampled_tokens():
    """Row 0: a 2-token prompt, 3 sampled, 2 from the environment, 2 sampled; row 1: a 2-token prompt, 1 sampled.
    A rank's padding row (weight 0) has none."""
    roll = _rollout([9, 3], [2, 2], [0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1], 2)
    contexts, lengths, turns = floors.sampled_runs(roll)
    assert contexts.tolist() == [2, 7, 2] and lengths.tolist() == [3, 2, 1] and turns.tolist() == [0, 1, 0]
    padded = _rollout(
        [9, 3, 3, 3], [2, 2, 2, 2], [0, 0, 1, 1, 1, 0, 0, 1, 1, 0, 0, 1, 0, 0, 1, 0, 0, 1], 2, weight=[1, 1, 0, 0]
    )
    assert floors.sampled_runs(padded)[1].tolist() == [3, 2, 1]
    # back to back, the last token of one row and the first of the next are two runs
    contexts, lengths, turns = floors.sampled_runs(_rollout([2, 2], [1, 1], [0, 1, 0, 1], 2))
    assert lengths.tolist() == [1, 1] and turns.tolist() == [0, 0]


def test_a_step_s_generation_floor_comes_from_its_rollout():
    """The first test's rows (G = 2, one prompt of 3 tokens): decode 490 plus the prompt's prefill once, 2 x 1 x 3
    FLOPs at 1 FLOP/s: 496. The row carries it, and its efficiency is 496 over its generation seconds."""
    roll = _rollout([7, 5], [3, 3], [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1], 2)
    step = floors.StepFloors(
        params=1, weight_bytes=100, bandwidth=1, flops=1, forwards=0, passes=1, group_size=2, kv_bytes=10
    )
    assert step.generation_floor(roll) == pytest.approx(496)
    row = {"gen_s": 992.0, "update_s": 1.0, "prompt_tokens": 6, "completion_tokens": 6, "completion_len_max": 4}
    got = step.efficiency(row, roll)
    assert got["gen_floor_s"] == pytest.approx(496) and got["efficiency/generation"] == pytest.approx(0.5)
    assert floors.floor_seconds([{**row, **got}], 1, 100, 1, 1, 0, 1)["generation"] == pytest.approx(496)
    # A second turn (2 tokens after 9 of context: 4 sampled and 2 of the environment's) decodes apart from the
    # first: one step, reading 100 + 10 x 10
    episodes = _rollout([11, 5], [3, 3], [0, 0, 0, 1, 1, 1, 1, 0, 0, 1, 1, 0, 0, 0, 1, 1], 2)
    assert step.generation_floor(episodes) == pytest.approx(496 + 200)


def test_the_keys_and_values_a_position_takes_come_from_the_config():
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=32,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config)
    assert floors.kv_bytes_per_position(model, 4) == 2 * 2 * 2 * 16 * 4  # layers x (k, v) x kv heads x head size
    config.head_dim = 8
    assert floors.kv_bytes_per_position(model, 2) == 2 * 2 * 2 * 8 * 2
    assert floors.kv_bytes_per_position(torch.nn.Linear(2, 2), 4) == 0.0  # no config: weights only
    wrapper = torch.nn.Module()  # a DDP-wrapped policy holds the model as .module
    wrapper.module = model
    assert floors.kv_bytes_per_position(wrapper, 2) == 2 * 2 * 2 * 8 * 2


def test_the_generation_floor_is_the_slowest_rank_s_as_its_seconds_are():
    """A row's gen_s is the slowest rank's; its floor is then the largest rank's too (all_max), not this rank's
    rollout's: 496 here, 700 on another rank, so 700 over 1,400 s. A rank with no rows still joins the collective."""
    roll = _rollout([7, 5], [3, 3], [0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 1, 1], 2)
    step = floors.StepFloors(
        params=1, weight_bytes=100, bandwidth=1, flops=1, forwards=0, passes=1, group_size=2, kv_bytes=10
    )
    row = {"gen_s": 1400.0, "update_s": 1.0, "prompt_tokens": 6, "completion_tokens": 6, "completion_len_max": 4}
    seen = []

    def other_rank_700(value):
        seen.append(value)
        return max(value, 700.0)

    got = step.efficiency(row, roll, other_rank_700)
    assert seen == [pytest.approx(496)]
    assert got["gen_floor_s"] == 700.0 and got["efficiency/generation"] == pytest.approx(0.5)
    assert step.efficiency(row, roll, lambda v: v)["gen_floor_s"] == pytest.approx(496)  # one process: its own
    assert step.efficiency(row, None, lambda v: (seen.append(v), 700.0)[1])["gen_floor_s"] == 700.0
    assert seen[-1] == -1.0  # this rank had no rollout: it still called the collective
    assert "gen_floor_s" not in step.efficiency(row, None, lambda v: v)


def test_the_machine_probe_draws_nothing_from_the_run_s_generator():
    """A run probes the machine once and caches the peaks: were the probe to draw from torch's global generator,
    a run's LoRA initialisation (and so every number after it) would depend on whether the cache was there."""
    from grpo_cli.run.probe import machine_peaks

    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    machine_peaks(torch.device("cpu"), torch.float32)
    assert torch.equal(torch.rand(3), expected)
