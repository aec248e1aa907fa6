"""Checkpoints you can trust: exact resume, kills at any moment, graceful stops, sweeps."""

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_cli.cli import main
from grpo_cli.run.checkpoint import experiment_diff, list_checkpoints, load_state
from grpo_cli.run.console import MetricsLog
from grpo_cli.run.stopping import GracefulStop
from helpers import ONE_THREAD, SMALL, SMALL_DATA, grpo, metric_rows, wait_for

TINY = [*SMALL, *SMALL_DATA, "trainer.micro_batch_size=8"]


def train(*args):
    return grpo("train", *TINY, *args)


def grpo_process(*args, **kwargs):
    """A training run left running in a process of its own (to be signalled): its output as it comes."""
    env = {**os.environ, **ONE_THREAD, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(
        [sys.executable, "-m", "grpo_cli.cli", "train", *TINY, *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        **kwargs,
    )


def rows(run: Path) -> list[dict]:
    return metric_rows(run, timing=False)


def assert_same_tensors(a, b):
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b)
    elif isinstance(a, dict):
        assert a.keys() == b.keys()
        for k in a:
            assert_same_tensors(a[k], b[k])
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b)
        for x, y in zip(a, b):
            assert_same_tensors(x, y)
    else:
        assert a == b


def test_resume_reproduces_uninterrupted_run_bitwise(tmp_path):
    """4 steps straight == 2 steps, stop, resume=auto to 4: weights, optimizer state and metrics rows."""
    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    extra = ["algo.beta=0.04", "algo.num_iterations=2"]  # reference and old log-probs both in play
    assert train(f"output_dir={straight}", "trainer.steps=4", *extra) == 0
    assert train(f"output_dir={resumed}", "trainer.steps=2", *extra) == 0
    assert train(f"output_dir={resumed}", "trainer.steps=4", "resume=auto", *extra) == 0
    a, b = load_file(straight / "final" / "model.safetensors"), load_file(resumed / "final" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    sa, sb = load_state(straight / "checkpoints" / "step-4"), load_state(resumed / "checkpoints" / "step-4")
    assert_same_tensors(sa["optimizer"], sb["optimizer"])
    assert_same_tensors(sa["scheduler"], sb["scheduler"])
    assert rows(straight) == rows(resumed) and [r["step"] for r in rows(resumed)] == [1, 2, 3, 4]
    assert sb.keys() >= {"policies", "optimizer", "scheduler", "source", "rng"}  # the run's parts, each by name


def test_resume_auto_without_a_checkpoint_starts_fresh_and_resume_path_continues_that_run(tmp_path):
    assert train(f"output_dir={tmp_path / 'a'}", "trainer.steps=1", "resume=auto") == 0
    assert [r["step"] for r in rows(tmp_path / "a")] == [1]
    # resume=PATH without output_dir continues in the checkpoint's own run directory, and the directory Hydra
    # made for the command (runs/<time>) is not left behind, empty; nor by a mistake found once the command
    # started (a damaged checkpoint); a run's own directory stays
    shutil.copytree(tmp_path / "a", tmp_path / "bad")
    (tmp_path / "bad" / "checkpoints" / "step-1" / "model.safetensors").write_bytes(b"damaged")
    old = os.getcwd()
    os.chdir(tmp_path)
    try:
        assert train(f"resume={tmp_path / 'a' / 'checkpoints' / 'step-1'}", "trainer.steps=2") == 0
        assert [r["step"] for r in rows(tmp_path / "a")] == [1, 2]
        assert train(f"resume={tmp_path / 'bad' / 'checkpoints' / 'step-1'}") == 2
        assert (tmp_path / "runs").is_dir() and not any((tmp_path / "runs").iterdir())
        assert train("trainer.steps=1") == 0
        assert [(d / "metrics.jsonl").exists() for d in (tmp_path / "runs").iterdir()] == [True]
        # a directory named with hydra.run.dir, or the working directory `grpo sample` runs in, stays
        assert (
            grpo("train", *TINY, f"resume={tmp_path / 'bad' / 'checkpoints' / 'step-1'}", hydra_dir=tmp_path / "mine")
            == 2
        )
        assert (tmp_path / "mine").is_dir()
        (tmp_path / "here").mkdir()
        os.chdir(tmp_path / "here")
        assert grpo("sample", "checkpoint=builtin:tiny", "prompt='1+2='", "greedy=true") == 0
        assert (tmp_path / "here").is_dir() and not any((tmp_path / "here").iterdir())
    finally:
        os.chdir(old)


def test_rows_written_after_the_last_checkpoint_are_redone_not_duplicated(tmp_path):
    assert train(f"output_dir={tmp_path}", "trainer.steps=3", "trainer.save_every=2") == 0
    import shutil

    shutil.rmtree(tmp_path / "checkpoints" / "step-3")  # as if killed after row 3, before its checkpoint
    assert train(f"output_dir={tmp_path}", "trainer.steps=4", "resume=auto") == 0
    assert [r["step"] for r in rows(tmp_path)] == [1, 2, 3, 4]


def test_changing_the_experiment_on_resume_is_refused_with_the_differences_listed(tmp_path):
    assert train(f"output_dir={tmp_path}", "trainer.steps=1") == 0
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli.cli",
            "train",
            *TINY,
            f"output_dir={tmp_path}",
            "trainer.steps=2",
            "resume=auto",
            "algo.beta=0",
            "optimizer.lr=1e-3",
        ],
        capture_output=True,
        text=True,
    )
    assert out.returncode == 2
    text = " ".join((out.stdout + out.stderr).split())  # rich may wrap long lines
    assert "algo.beta: 0.04 -> 0.0" in text and "optimizer.lr: 0.0003 -> 0.001" in text
    assert "Traceback" not in text


def test_where_and_in_what_batches_the_reward_model_runs_may_change_on_resume():
    saved = {"reward": {"model_path": "rm", "model_device": "cpu", "model_batch_size": 8}}
    moved = {"reward": {"model_path": "rm", "model_device": "cuda:1", "model_batch_size": 64}}
    assert experiment_diff(saved, moved) == []
    assert experiment_diff(saved, {"reward": {**moved["reward"], "model_path": "other"}}) == [
        "reward.model_path: 'rm' -> 'other'"
    ]


def test_a_half_written_last_metrics_row_from_a_kill_is_dropped_on_resume(tmp_path):
    log = MetricsLog(tmp_path / "metrics.jsonl")
    log.write({"step": 1, "reward_mean": 0.5})
    log.write({"step": 2, "reward_mean": 0.75})
    with open(log.path, "a") as f:
        f.write('{"step": 3, "rew')  # killed in mid-write
    log.truncate(5)
    assert log.read() == [{"step": 1, "reward_mean": 0.5}, {"step": 2, "reward_mean": 0.75}]
    assert log.path.read_text().endswith("}\n")
    log.path.write_text('{"step": 1}\n{"st\n{"step": 3}\n')  # a broken row in the middle is not a kill
    with pytest.raises(json.JSONDecodeError):
        log.read()


def test_keep_last_prunes_old_checkpoints_only_after_a_new_one_is_complete(tmp_path):
    assert train(f"output_dir={tmp_path}", "trainer.steps=4", "trainer.save_every=1", "trainer.keep_last=2") == 0
    assert [p.name for p in list_checkpoints(tmp_path)] == ["step-3", "step-4"]
    assert (tmp_path / "checkpoints" / "latest").read_text().strip() == "step-4"


@pytest.mark.slow
def test_sigkill_at_any_point_even_mid_save_leaves_only_complete_checkpoints_and_resume_finishes(tmp_path):
    run, steps = tmp_path / "run", 8
    args = [f"output_dir={run}", f"trainer.steps={steps}", "trainer.save_every=1", "resume=auto"]
    ckpts = run / "checkpoints"
    kill_points = [
        ("while a checkpoint is being written", lambda: ckpts.is_dir() and any(ckpts.glob(".tmp-step-*"))),
        ("right after a checkpoint landed", lambda: len(list_checkpoints(run)) >= 3),
        (
            "mid-training",
            lambda: (run / "metrics.jsonl").exists() and len((run / "metrics.jsonl").read_text().splitlines()) >= 5,
        ),
    ]
    for what, ready in kill_points:
        proc = grpo_process(*args)
        assert wait_for(lambda: ready() or proc.poll() is not None), what
        if proc.poll() is None:
            caught_mid_save = any(ckpts.glob(".tmp-step-*"))
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            if what.startswith("while"):
                assert caught_mid_save, "the kill did not land inside a checkpoint write"
        for ckpt in list_checkpoints(run):  # whatever survived is complete and loadable
            assert load_state(ckpt)["step"] == int(ckpt.name.split("-")[1])
            assert load_file(ckpt / "model.safetensors")
    proc = grpo_process(*args)
    assert proc.wait(timeout=300) == 0, proc.stdout.read()
    assert [r["step"] for r in rows(run)] == list(range(1, steps + 1))
    assert list_checkpoints(run)[-1].name == f"step-{steps}"


def test_sigterm_finishes_the_step_saves_a_checkpoint_and_exits_143(tmp_path):
    proc = grpo_process(f"output_dir={tmp_path}", "trainer.steps=200", "trainer.save_every=1000")
    assert wait_for(
        lambda: (
            (tmp_path / "metrics.jsonl").exists() and len((tmp_path / "metrics.jsonl").read_text().splitlines()) >= 2
        )
    )
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=120) == 128 + signal.SIGTERM
    last_row = rows(tmp_path)[-1]["step"]
    assert [p.name for p in list_checkpoints(tmp_path)] == [f"step-{last_row}"]
    out = proc.stdout.read()
    assert last_row < 200 and "checkpoint saved" in out and "SIGTERM: finishing this step" in out, out
    # the line says how to continue: the same overrides, this directory, resume=auto
    again = " ".join(out.split("continue with: ", 1)[1].split())  # rich may wrap the line in a narrow terminal
    assert again.startswith("grpo train ") and "trainer.steps=200 trainer.save_every=1000" in again, out
    assert again.endswith(f"output_dir={tmp_path} resume=auto"), again


def test_the_first_signal_is_announced_off_the_thread_it_interrupted():
    """The handler interrupts the main thread anywhere, here while it holds a lock the announcement
    also needs (as rich's import of its emoji table once was): run in the handler, the announcement
    could not take the lock (an ImportError then, a deadlock with a plain Lock); on its own thread it
    waits until the main thread lets go."""
    lock, got, done, before = threading.Lock(), [], threading.Event(), signal.getsignal(signal.SIGTERM)

    def announce(signum):
        took = lock.acquire(timeout=5)
        got.append((signum, threading.current_thread() is threading.main_thread(), took))
        if took:
            lock.release()
        done.set()

    with GracefulStop(announce) as stop:
        with lock:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)  # the handler runs in this thread, between these bytecodes, with the lock held
            assert stop.signum == signal.SIGTERM and not done.is_set()
        assert done.wait(10)
    assert got == [(signal.SIGTERM, False, True)]
    assert signal.getsignal(signal.SIGTERM) is before  # the previous handler is back


@pytest.mark.slow
def test_a_2x2_multirun_writes_four_jobs_and_a_summary(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli.cli",
            "train",
            "-m",
            *TINY,
            "trainer.steps=1",
            "algo.beta=0,0.04",
            "optimizer.lr=1e-3,3e-3",
            f"hydra.sweep.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    for job in range(4):
        assert len(rows(tmp_path / str(job))) == 1
    import csv

    summary = list(csv.DictReader(open(tmp_path / "sweep.csv")))
    assert len(summary) == 4 and all(r["status"] == "done" for r in summary)
    combos = {
        (o["algo.beta"], o["optimizer.lr"])
        for o in (dict(kv.split("=", 1) for kv in r["overrides"].split()) for r in summary)
    }
    assert combos == {("0", "0.001"), ("0", "0.003"), ("0.04", "0.001"), ("0.04", "0.003")}
    assert "sweep: 4 jobs" in out.stdout


@pytest.mark.slow
def test_a_failed_sweep_job_is_reported_and_does_not_stop_the_others(tmp_path):
    """A job that fails while it runs (here: its model is missing) is a row of the table; the rest run."""
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli.cli",
            "train",
            "-m",
            *TINY,
            "trainer.steps=1",
            "model.path=/nonexistent/model,builtin:tiny",
            f"hydra.sweep.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 2
    import csv

    summary = list(csv.DictReader(open(tmp_path / "sweep.csv")))
    assert [r["status"] for r in summary] == ["failed", "done"]
    assert "model.path=/nonexistent/model does not exist" in summary[0]["error"]
    assert len(rows(tmp_path / "1")) == 1


def test_a_sweep_with_a_bad_value_in_one_combination_stops_before_any_job_runs(tmp_path):
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli.cli",
            "train",
            "-m",
            *TINY,
            "trainer.steps=1",
            "sampler.group_size=4,1",
            f"hydra.sweep.dir={tmp_path}",
        ],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert out.returncode == 2 and "sampler.group_size must be at least 2 (got 1)" in out.stderr
    assert not list(tmp_path.iterdir())  # no job ran


def test_a_sweep_job_that_crashes_with_a_bug_ends_the_sweep_with_its_trace_and_no_summary(
    tmp_path, monkeypatch, capsys
):
    """Unlike a user mistake (a failed row in the table, exit 2), a bug keeps its trace: Hydra re-raises
    it once the batch has run, so there is no sweep table or sweep.csv, and the exit code is Hydra's 1."""
    from grpo_cli.run import build as run

    def bug(cfg):
        raise RuntimeError("a bug in grpo_cli")

    monkeypatch.setattr(run, "check", bug)  # fails before anything is loaded
    with pytest.raises(SystemExit) as e:
        main(["train", "-m", *TINY, "trainer.steps=1", "trainer.seed=0,1", f"hydra.sweep.dir={tmp_path}"])
    assert e.value.code == 1
    err = capsys.readouterr().err
    assert "Traceback" in err and "RuntimeError: a bug in grpo_cli" in err
    assert not (tmp_path / "sweep.csv").exists()
