"""torchrun: DDP and FSDP2 on gloo (2 CPU processes, the tiny model, one thread each) give the run one
process gives; signals and deaths stop every rank; checkpoints resume exactly. Every launch has a
timeout, so no test can hang the suite."""

import os
import signal
import subprocess
import sys
import time
import warnings

import pytest
import torch
from ranks import start_ranks, torchrun
from safetensors.torch import load_file

from helpers import SMALL, SMALL_DATA, grpo, metric_rows, read_jsonl

pytestmark = pytest.mark.slow  # torchrun ranks in processes of their own: make test-slow

# optimizer.eps=1e-6: AdamW's first steps move a weight by ~lr * g / |g|, so a gradient at rounding level
# (1e-12) whose sign differs between two correct summation orders would move its weight by +-lr; an eps
# well above rounding noise makes such a gradient move it by ~0, and the runs comparable to 1e-5.
SHORT = [
    *SMALL,
    *SMALL_DATA,
    "trainer.micro_batch_size=8",
    "trainer.log_completions_every=0",
    "algo.beta=0.04",
    "optimizer.eps=1e-6",
]


def one_process(out, *args):
    assert grpo("train", f"output_dir={out}", *SHORT, *args) == 0


def rows(run) -> list[dict]:
    """Metrics rows without timings, and without the layout facts, which depend on how the rows are split
    (not results): padding_frac, the share of padding in each rank's padded layout, micro_batch_positions,
    the largest micro-batch a rank formed, and forward_tokens, the tokens its forwards computed with each
    prompt shared (absent from a padded run)."""
    layout = ("padding_frac", "micro_batch_positions", "forward_tokens")
    return [{k: v for k, v in r.items() if k not in layout} for r in metric_rows(run, timing=False)]


def weights(path):
    return load_file(path / "model.safetensors")


def assert_same_run(a, b, atol):
    """Weights within `atol`; each metrics row's rewards equal, everything else within `atol` (relative)."""
    wa, wb = weights(a / "final"), weights(b / "final")
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wa[k], wb[k], atol=atol, rtol=0, msg=k)
    for ra, rb in zip(rows(a), rows(b), strict=True):
        assert ra.keys() == rb.keys()
        assert ra["reward_mean"] == rb["reward_mean"] and ra["accuracy"] == rb["accuracy"]  # the same completions
        for k in ra:
            assert ra[k] == pytest.approx(rb[k], rel=1e-3, abs=1e-5), k


@pytest.mark.parametrize(
    "strategy,extra,atol",
    [
        ("ddp", [], 1e-5),
        ("fsdp", [], 1e-5),
        ("fsdp", ["model.lora.r=4", "optimizer.lr=3e-3"], 1e-4),
        ("fsdp", ["model.recompute_pointwise=true"], 1e-5),
    ],
    ids=["ddp", "fsdp", "fsdp-lora", "fsdp-recompute"],
)
def test_two_ranks_match_one_process_on_the_same_global_batch(strategy, extra, atol, tmp_path):
    """Tolerance: the same maths summed in another order (2 micro-batches on one process, 1 per rank, and
    the all-reduce), so the weights agree to 1e-5 after 3 steps; the sampled completions are identical.
    Under LoRA final/ is the merged model and final/adapter the adapter, from the gathered shards; at
    lr 3e-3 (10x the default, so three steps move the adapter visibly) the same rounding moves the
    weights 10x further: 1e-4 (measured 3e-5). With the norms and MLPs recomputed in the backward
    (model.recompute_pointwise, forced on for the tiny model), FSDP2 gathers each layer's shards again for the
    recompute, and the run still equals one process's."""
    one_process(tmp_path / "one", "trainer.steps=3", *extra)
    out = torchrun(
        [f"output_dir={tmp_path / 'two'}", *SHORT, "trainer.steps=3", f"trainer.strategy={strategy}", *extra]
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert_same_run(tmp_path / "one", tmp_path / "two", atol=atol)
    # The rows' tokens are both ranks' sum, each rank computing half: the update's floor (its efficiency times
    # its seconds) is half one process's, at the same one-thread peaks.
    floors = [
        [
            r["efficiency/update"] * r["update_s"]
            for r in read_jsonl(tmp_path / run / "metrics.jsonl")
            if "update_s" in r
        ]
        for run in ("one", "two")
    ]
    assert len(floors[0]) == 3 and floors[1] == pytest.approx([f / 2 for f in floors[0]], rel=1e-6)
    if any(e.startswith("model.lora") for e in extra):
        a = load_file(tmp_path / "one" / "final" / "adapter" / "adapter_model.safetensors")
        b = load_file(tmp_path / "two" / "final" / "adapter" / "adapter_model.safetensors")
        assert a.keys() == b.keys() and a
        for k in a:
            torch.testing.assert_close(a[k], b[k], atol=atol, rtol=0, msg=k)
    assert not (tmp_path / "two" / "checkpoints" / ".tmp-step-3").exists()


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_two_ranks_each_with_a_generation_worker_at_staleness_1_match_one_process(strategy, tmp_path):
    """One worker per rank samples that rank's share a step ahead; the pushes carry each rank's whole
    model (FSDP2 gathers its shards). The run equals one process with one worker, to the tolerance above."""
    one_process(tmp_path / "one", "trainer.steps=3", "trainer.max_staleness=1")
    out = torchrun(
        [
            f"output_dir={tmp_path / 'two'}",
            *SHORT,
            "trainer.steps=3",
            f"trainer.strategy={strategy}",
            "trainer.max_staleness=1",
        ]
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert [r["staleness"] for r in rows(tmp_path / "two")] == [0.0, 1.0, 1.0]
    assert_same_run(tmp_path / "one", tmp_path / "two", atol=1e-5)


def test_packed_token_budget_micro_batches_on_two_ranks_match_one_padded_process(tmp_path):
    """Two DDP ranks, each packing its rows into micro-batches of at most 40 tokens (as many on both ranks),
    against one process with padded micro-batches of 8 rows: the same run, tolerance as above."""
    one_process(tmp_path / "one", "trainer.steps=3", "trainer.packing=false")
    out = torchrun(
        [
            f"output_dir={tmp_path / 'two'}",
            *SHORT,
            "trainer.steps=3",
            "trainer.strategy=ddp",
            "trainer.packing=true",
            "trainer.max_tokens_per_micro_batch=40",
        ]
    )
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert_same_run(tmp_path / "one", tmp_path / "two", atol=1e-5)


@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_tool_episodes_on_two_ranks_match_one_process(strategy, tmp_path):
    """experiment=tool_use: each rank runs its own prompts' episodes (calculator calls included), seeded by
    the prompt's place in the global batch, so two ranks sample the episodes one process samples and the
    update is the same; tolerance as above."""
    args = ["experiment=tool_use", "trainer.steps=2"]
    one_process(tmp_path / "one", *args)
    out = torchrun([f"output_dir={tmp_path / 'two'}", *SHORT, *args, f"trainer.strategy={strategy}"])
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    assert_same_run(tmp_path / "one", tmp_path / "two", atol=1e-5)
    assert all(r["env/tool_calls"] > 0 for r in rows(tmp_path / "two"))  # the episodes did call the tool


def test_a_two_rank_checkpoint_resumes_on_two_ranks_exactly_even_after_kill_9(tmp_path):
    straight = torchrun([f"output_dir={tmp_path / 'straight'}", *SHORT, "trainer.steps=4", "trainer.save_every=1"])
    assert straight.returncode == 0, straight.stderr[-3000:]
    procs, logs = start_ranks(
        [f"output_dir={tmp_path / 'killed'}", *SHORT, "trainer.steps=4", "trainer.save_every=1"], log_dir=tmp_path
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "killed" / "checkpoints" / "step-2").exists():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
            open(f).read()[-2000:] for f in logs
        ]
        time.sleep(0.05)
    for p in procs:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    resumed = torchrun(
        [f"output_dir={tmp_path / 'killed'}", *SHORT, "trainer.steps=4", "trainer.save_every=1", "resume=auto"]
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    a, b = weights(tmp_path / "straight" / "final"), weights(tmp_path / "killed" / "final")
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert rows(tmp_path / "straight") == rows(tmp_path / "killed")


def test_sigterm_to_one_rank_stops_both_after_one_checkpoint_with_the_stop_code(tmp_path):
    procs, logs = start_ranks(
        [f"output_dir={tmp_path}", *SHORT, "trainer.steps=200", "trainer.save_every=1000"], log_dir=tmp_path
    )
    deadline = time.monotonic() + 120
    while not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text().strip():
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), [
            open(f).read()[-2000:] for f in logs
        ]
        time.sleep(0.05)
    procs[1].send_signal(signal.SIGTERM)
    codes = [p.wait(timeout=120) for p in procs]
    assert codes == [143, 143], [open(f).read()[-2000:] for f in logs]
    saved = sorted(p.name for p in (tmp_path / "checkpoints").iterdir() if p.name.startswith("step-"))
    assert len(saved) == 1 and int(saved[0].split("-")[1]) < 200
    assert "stopped by SIGTERM" in open(logs[0]).read()


def test_a_rank_that_dies_makes_the_other_exit_with_one_sentence_not_hang(tmp_path):
    procs, logs = start_ranks([f"output_dir={tmp_path}", *SHORT, "trainer.steps=200"], log_dir=tmp_path)
    deadline = time.monotonic() + 120
    while not (tmp_path / "metrics.jsonl").exists() or not (tmp_path / "metrics.jsonl").read_text().strip():
        assert time.monotonic() < deadline, open(logs[0]).read()[-2000:]
        time.sleep(0.05)
    os.killpg(procs[1].pid, signal.SIGKILL)
    code = procs[0].wait(timeout=90)
    text = open(logs[0]).read()
    assert code == 1, text[-2000:]
    assert "error: rank 0: another rank stopped" in text and "Traceback" not in text


def test_prompts_per_step_must_divide_by_the_world_size(tmp_path):
    out = torchrun([f"output_dir={tmp_path}", *SHORT, "trainer.prompts_per_step=3", "trainer.steps=1"])
    assert out.returncode != 0
    assert "trainer.prompts_per_step=3 must divide by the 2 processes" in out.stdout + out.stderr


def test_dynamic_sampling_runs_on_two_ranks_with_a_global_quota(tmp_path):
    out = torchrun([f"output_dir={tmp_path}", *SHORT, "algo=dapo", "trainer.steps=3"])
    assert out.returncode == 0, out.stderr[-3000:]
    assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3]


def test_python_dash_m_grpo_cli_is_the_cli():
    out = subprocess.run(
        [sys.executable, "-m", "grpo_cli", "train", "--cfg", "job"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0 and "prompts_per_step" in out.stdout


def test_an_fsdp_checkpoint_resumes_on_another_world_size_and_matches(tmp_path):
    """torch.distributed.checkpoint reshards the model and AdamW state from 2 ranks to 1 process; the
    prompts and completions of each step depend on the seed alone, so the run continues unchanged."""
    straight = torchrun([f"output_dir={tmp_path / 'straight'}", *SHORT, "trainer.steps=3", "trainer.strategy=fsdp"])
    assert straight.returncode == 0, straight.stderr[-3000:]
    first = torchrun([f"output_dir={tmp_path / 'moved'}", *SHORT, "trainer.steps=2", "trainer.strategy=fsdp"])
    assert first.returncode == 0, first.stderr[-3000:]
    assert (tmp_path / "moved" / "checkpoints" / "step-2" / "dcp").is_dir()
    with warnings.catch_warnings(record=True) as seen:  # one process loads the shards as one, without a notice
        warnings.simplefilter("always")
        one_process(tmp_path / "moved", "trainer.steps=3", "resume=auto")
    assert not [w for w in seen if "torch.distributed is disabled" in str(w.message)], [str(w.message) for w in seen]
    assert_same_run(tmp_path / "straight", tmp_path / "moved", atol=1e-5)


def test_a_ddp_checkpoint_is_refused_under_fsdp_with_one_sentence(tmp_path):
    one_process(tmp_path, "trainer.steps=1")
    out = torchrun([f"output_dir={tmp_path}", *SHORT, "trainer.steps=2", "trainer.strategy=fsdp", "resume=auto"])
    assert out.returncode != 0
    assert "was written without FSDP, so its optimizer state cannot be sharded" in out.stdout + out.stderr
