"""Generation in a worker process (rollout/worker.py): the same run as in-process when nothing is stale,
rollouts sampled by exactly the weights one update old at trainer.max_staleness=1 with the ratio taken
against them, and a worker that dies, hangs, or is left behind by a killed trainer."""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from grpo_cli.models.loading import load_model
from grpo_cli.run import trainer as trainer_module
from grpo_cli.run.checkpoint import list_checkpoints, load_state
from helpers import ONE_THREAD, SMALL, SMALL_DATA, grid, grpo, metric_rows, padded, wait_for

TINY = [*SMALL, *SMALL_DATA, "trainer.micro_batch_size=8", "trainer.threads=1", "trainer.log_completions_every=0"]


def train(*args):
    return grpo("train", *TINY, *args)


def rows(run: Path, drop=("staleness",)) -> list[dict]:
    return [{k: v for k, v in r.items() if k not in drop} for r in metric_rows(run, timing=False)]


def same_weights(a: Path, b: Path) -> bool:
    wa, wb = load_file(a / "model.safetensors"), load_file(b / "model.safetensors")
    return wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


REWARD = "def score(completions, **kw):\n    return [float(len(c) % 2) for c in completions]\n"
WORKLOADS = {  # each trains the same steps in this process and in a worker at staleness 0
    "full": [],
    "lora": ["model.lora.r=4", "optimizer.lr=3e-3"],
    "tool_use": ["experiment=tool_use", "trainer.prompts_per_step=4", "sampler.group_size=4"],
    "agent": ["experiment=tool_agent", "trainer.prompts_per_step=4", "sampler.group_size=4"],  # its endpoint there
    "dynamic_sampling": ["algo=dapo", "algo.max_refill_rounds=2"],
    "frozen_behaviour": ["algo.behaviour=frozen"],
    "lagged_behaviour": ["algo.behaviour=lagged", "algo.behaviour_refresh=2"],
    "python_reward": ["reward=python", "reward.fn={tmp}/my_reward.py:score", "reward.workers=1"],
    "held_out": ["trainer.eval_before_after=true", "trainer.eval_every=2", "trainer.eval_prompts=8"],
}


@pytest.mark.parametrize(
    "name",
    [
        name if name in ("full", "lora", "held_out") else pytest.param(name, marks=pytest.mark.slow)
        for name in WORKLOADS
    ],
)
def test_a_worker_at_staleness_0_is_bitwise_the_in_process_run(name, tmp_path, monkeypatch):
    """generator.worker=true at max_staleness=0: the whole rollout chain (generation or episodes, rewards,
    dynamic sampling's refills, a behaviour policy's log-probs, the held-out scores) runs in the worker,
    with the weights pushed (all of them, or the LoRA adapter alone) or, for a frozen behaviour, loaded
    there, one step after the other, and the run is the in-process one to the bit: every metrics row and
    the final weights. The trainer then builds no generator of its own (no second engine), unless the
    worker samples a behaviour policy and the policy's held-out scores are taken here."""
    from grpo_cli.run import build as run_module

    built, real = [], run_module.generator_for
    monkeypatch.setattr(run_module, "generator_for", lambda *a, **k: built.append(1) or real(*a, **k))
    (tmp_path / "my_reward.py").write_text(REWARD)
    extra = [a.format(tmp=tmp_path) for a in WORKLOADS[name]]
    assert train(f"output_dir={tmp_path / 'here'}", "trainer.steps=3", *extra) == 0
    assert built == [1]
    assert train(f"output_dir={tmp_path / 'worker'}", "trainer.steps=3", "generator.worker=true", *extra) == 0
    assert built == [1, 1] if "behaviour" in name else built == [1]
    if name == "held_out":
        assert [r["step"] for r in metric_rows(tmp_path / "worker") if r.get("kind") == "eval"] == [0, 2, 3]
    assert rows(tmp_path / "here") == rows(tmp_path / "worker")
    here = [r for r in rows(tmp_path / "here") if "reward_mean" in r]  # the training rows
    assert any(r["reward_std"] > 0 for r in here), "no step had a reward signal: the update was not exercised"
    if name == "tool_use":
        assert any(r["env/tool_calls"] > 0 for r in here), "no episode called a tool"
    if name == "dynamic_sampling":
        assert any(r["dropped_frac"] > 0 for r in here), "no group was dropped, so no refill was drawn"
    if "behaviour" not in name:
        assert [r["staleness"] for r in metric_rows(tmp_path / "worker", training=True)] == [0.0, 0.0, 0.0]
    assert same_weights(tmp_path / "here" / "final", tmp_path / "worker" / "final")


def completion_logp(model, roll, temperature: float) -> list[torch.Tensor]:
    """Each row's completion-token log-probs under `model`, computed here: the row alone, without its
    padding, one plain forward, float64 log-softmax."""
    T, out = roll.completion_len, []
    for i in range(padded(roll)[0].shape[0]):
        keep = padded(roll)[1][i].bool()
        ids = padded(roll)[0][i][keep][None]
        n = int(padded(roll)[2][i].sum())
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0].double() / temperature
        logp = logits[:-1].log_softmax(-1).gather(-1, ids[0, 1:, None])[:, 0]
        out.append(logp[-n:] if n else logp[:0])
        assert int(padded(roll)[2][i, :n].sum()) == n and n <= T
    return out


def test_at_staleness_1_each_update_trains_on_rollouts_of_the_weights_one_update_old(tmp_path, monkeypatch):
    """Step t's rollouts come tagged with version t-2 (the first two with 0, the weights the run starts
    from), their behaviour log-probs are those of checkpoint t-2 (computed here from the saved weights,
    not the trainer's code), and the logged ratio of the first (only) inner pass is the token mean of
    pi_{t-1} / pi_{t-2}, both from the saved checkpoints."""
    seen = {}
    real_step = trainer_module.grpo_step

    def spy(*args, **kwargs):
        row, roll = real_step(*args, **kwargs)
        seen[len(seen) + 1] = (row, roll)
        return row, roll

    monkeypatch.setattr(trainer_module, "grpo_step", spy)
    run = tmp_path / "run"
    assert (
        train(f"output_dir={run}", "trainer.steps=4", "trainer.max_staleness=1", "trainer.save_every=1", "algo.beta=0")
        == 0
    )
    assert [seen[t][1].version for t in (1, 2, 3, 4)] == [0, 0, 1, 2]
    assert [r["staleness"] for r in metric_rows(run)] == [0.0, 1.0, 1.0, 1.0]
    weights = {0: load_model("builtin:tiny")}
    for t in (1, 2, 3):
        weights[t] = load_model(str(run / "checkpoints" / f"step-{t}"))
    assert seen[1][1].old_logp is None  # step 1 is on-policy: the ratio is 1 by construction, as today
    for t in (2, 3, 4):
        row, roll = seen[t]
        behaviour = completion_logp(weights[t - 2], roll, 1.0)
        current = completion_logp(weights[t - 1], roll, 1.0)
        old = grid(roll, roll.old_logp)  # [rows, T] from the rollout's per-token values
        got = [old[i, : len(b)].double() for i, b in enumerate(behaviour)]
        for b, g in zip(behaviour, got):
            torch.testing.assert_close(g, b, atol=1e-5, rtol=0)
        gap = max(float((c - b).abs().max()) for c, b in zip(current, behaviour) if len(b))
        assert gap > 1e-3, "the two versions must differ, or the check above proves nothing"
        ratio = torch.cat([(c - b).exp() for c, b in zip(current, behaviour)])
        assert row["ratio_mean"] == pytest.approx(float(ratio.mean()), rel=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("extra", [[], WORKLOADS["tool_use"]], ids=["single_turn", "tool_use"])
def test_a_staleness_1_run_killed_with_sigkill_resumes_to_the_uninterrupted_run(extra, tmp_path):
    """Each checkpoint holds the scored rollouts sampled ahead for the next step (by the previous update's
    weights; whole episodes for the tool-use demo): a resume trains on them, so a run SIGKILLed after a
    checkpoint and resumed equals one run straight through, to the bit (weights and every metrics row)."""
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    common = ["trainer.steps=8", "trainer.max_staleness=1", "trainer.save_every=2", "algo.beta=0.04", *extra]
    assert train(f"output_dir={straight}", *common) == 0
    kept = load_state(straight / "checkpoints" / "step-2")["source"]["per_rank"][0]
    assert list(kept) == [3] and kept[3]["version"] == 1
    assert (kept[3]["episodes"] is not None) == bool(extra)
    proc = subprocess.Popen(
        [sys.executable, "-m", "grpo_cli.cli", "train", *TINY, f"output_dir={killed}", *common],
        env={**os.environ, **ONE_THREAD},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    assert wait_for(lambda: (killed / "checkpoints" / "step-2").exists() or proc.poll() is not None)
    proc.kill()
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, "the run ended before the kill: nothing was tested"
    assert train(f"output_dir={killed}", *common, "resume=auto") == 0
    assert rows(straight, drop=()) == rows(killed, drop=())
    assert same_weights(straight / "final", killed / "final")


def worker_pid(trainer: subprocess.Popen) -> int | None:
    children = Path(f"/proc/{trainer.pid}/task/{trainer.pid}/children")
    for pid in children.read_text().split() if children.exists() else []:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        if b"grpo_cli.rollout.worker" in cmdline:
            return int(pid)
    return None


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return Path(f"/proc/{pid}/stat").exists() and Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"


def started(run: Path, *args, steps_done: int = 3):
    """A staleness-1 run in a process of its own, once it has written `steps_done` rows: (process, worker pid)."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "grpo_cli.cli",
            "train",
            *TINY,
            f"output_dir={run}",
            "trainer.steps=400",
            "trainer.max_staleness=1",
            "trainer.save_every=1000",
            *args,
        ],
        env={**os.environ, **ONE_THREAD},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert wait_for(
        lambda: (
            (run / "metrics.jsonl").exists()
            and len((run / "metrics.jsonl").read_text().splitlines()) >= steps_done
            or proc.poll() is not None
        )
    )
    assert proc.poll() is None, proc.communicate()
    pid = worker_pid(proc)
    assert pid is not None
    return proc, pid


@pytest.mark.slow
@pytest.mark.parametrize("how", ["kill", "hang"])
def test_a_dead_or_stuck_worker_stops_the_run_with_one_sentence_and_a_checkpoint_that_resumes(how, tmp_path):
    run = tmp_path / "run"
    proc, pid = started(run, "generator.timeout_s=5")
    t0 = time.monotonic()
    os.kill(pid, signal.SIGKILL if how == "kill" else signal.SIGSTOP)
    out, err = proc.communicate(timeout=60)
    took = time.monotonic() - t0
    assert proc.returncode == 2, out[-2000:] + err[-2000:]
    assert "Traceback" not in err and took < 30, err
    why = "was killed by SIGKILL" if how == "kill" else "did not answer within 5 s"
    line = " ".join(err.split())
    assert f"the generation worker {why}" in line and "continue with: grpo train" in line, line
    last = metric_rows(run)[-1]["step"]
    assert [c.name for c in list_checkpoints(run)] == [f"step-{last}"] and f"step-{last} is the newest" in line
    assert wait_for(lambda: not alive(pid), timeout=15), "a stuck worker is killed, not left behind"
    resumed = subprocess.run(
        [
            sys.executable,
            "-m",
            "grpo_cli.cli",
            "train",
            *TINY,
            f"output_dir={run}",
            f"trainer.steps={last + 2}",
            "trainer.max_staleness=1",
            "trainer.save_every=1000",
            "generator.timeout_s=5",
            "resume=auto",
        ],
        env={**os.environ, **ONE_THREAD},
        capture_output=True,
        text=True,
        timeout=300,
    )
    # the trainer.steps override is refused by nothing: only the step count differs
    assert resumed.returncode == 0, resumed.stdout[-2000:] + resumed.stderr[-2000:]
    assert [r["step"] for r in metric_rows(run)] == list(range(1, last + 3))


@pytest.mark.slow
def test_sigterm_stops_trainer_and_worker_after_a_checkpoint_and_sigkill_takes_the_worker_along(tmp_path):
    proc, pid = started(tmp_path / "term")
    os.kill(proc.pid, signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 128 + signal.SIGTERM, out[-2000:] + err[-2000:]
    assert wait_for(lambda: not alive(pid), timeout=15), "the worker outlived its trainer"
    assert list_checkpoints(tmp_path / "term") and "Traceback" not in err, err
    proc, pid = started(tmp_path / "kill")
    proc.kill()
    proc.wait()
    assert wait_for(lambda: not alive(pid), timeout=15), "the worker outlived a SIGKILLed trainer"


def test_rollouts_in_flight_that_a_resume_does_not_take_are_named_in_a_warning():
    """The declared resume policy (source.py): rollouts a checkpoint kept for steps this run does not sample
    ahead (a smaller trainer.max_staleness, or none) are dropped and sampled again, and a warning names
    their steps; steps it should hold and does not are named too. Nothing is dropped silently."""
    from types import SimpleNamespace

    from grpo_cli.models.policies import Policies
    from grpo_cli.rollout.ahead import WorkerSource
    from grpo_cli.rollout.source import LocalSource

    class Worker:
        received: dict = {}

        def restore(self, state):
            self.received = dict(state)

    warned, policies = [], Policies(torch.nn.Linear(1, 1))
    scored = stored()
    LocalSource(None, policies, None, None, warn=warned.append).load_state_dict({3: scored})
    assert len(warned) == 1 and "step(s) 3 " in warned[0] and "dropped" in warned[0]
    algo = SimpleNamespace(behaviour="current", behaviour_refresh=1, dynamic_sampling=False)
    source = WorkerSource(Worker(), policies, algo, max_staleness=1, first_step=3, last_step=8, warn=warned.append)
    source.load_state_dict({3: scored, 4: scored})  # written at max_staleness=2
    assert list(source.worker.received) == [3] and source.asked == 3
    assert "step(s) 4 " in warned[1] and "trainer.max_staleness=1" in warned[1]
    source.load_state_dict({})
    assert "no rollouts sampled ahead for step(s) 3," in warned[2]
    source.load_state_dict({3: scored})
    assert len(warned) == 3, "a checkpoint holding exactly what this run samples ahead needs no word"


def test_a_trainer_killed_while_its_generation_worker_starts_takes_the_worker_along(tmp_path):
    """The worker asks to die with the trainer before it imports torch (procs/launch.py): a trainer SIGKILLed
    right after starting it leaves no worker behind within 3 s (it used to run on for as long as its imports
    took, up to 18 s)."""
    import signal
    import subprocess
    import sys
    import time

    code = (
        "import os, signal, sys\nfrom grpo_cli.procs.subprocesses import Helper\n"
        "h = Helper('grpo_cli.rollout.worker', None, name='the generation worker')\n"
        "print(h.process.pid, flush=True)\nos.kill(os.getpid(), signal.SIGKILL)\n"
    )
    trainer = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    pid = int(trainer.stdout.readline())
    assert trainer.wait(10) == -signal.SIGKILL

    def running() -> bool:
        try:
            return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            return False

    deadline = time.monotonic() + 3
    while running() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not running(), "the generation worker outlived its trainer"


def stored(version=2, **changes) -> dict:
    """A scored rollout as a checkpoint holds it (source.scored_state): one prompt, G = 2, rows of 3 and 2 tokens."""
    state = {
        "prompts": ["1+1="],
        "group_size": 2,
        "tokens": torch.arange(5),
        "lengths": torch.tensor([3, 2]),
        "prompt_lengths": torch.tensor([1, 1]),
        "loss_mask": torch.tensor([0, 1, 1, 0, 1]),
        "sampler_logp": torch.full((5,), -0.5),
        "behaviour_logp": None,
        "version": version,
        "metrics": {},
    }
    return {**state, **changes}


@pytest.mark.parametrize(
    "changes, damage",
    [
        ({"sampler_logp": torch.tensor([0.0, float("nan"), -1.0, 0.0, -1.0])}, "sampler_logp is not finite"),
        ({"tokens": torch.arange(4)}, "4 tokens in (2,) rows for 2 completions"),
        ({"lengths": torch.tensor([5])}, "5 tokens in (1,) rows for 2 completions"),
        ({"loss_mask": torch.ones(3)}, "loss_mask has shape (3,), not (5,)"),
        ({"version": 0}, "sampled with the weights of step 0"),
        ({"tokens": None}, "unreadable: AttributeError"),
        ({"prompts": ["2+2="]}, "it holds other prompts than this run draws for step 3"),
    ],
)
def test_a_damaged_rollout_in_a_checkpoint_is_sampled_again_and_said(changes, damage):
    """Rollouts a checkpoint holds are checked when a resume loads them (they hold the prompts this run draws
    for the step, their token fields line up with their rows, their log-probs are finite, their weights are at most
    trainer.max_staleness behind): a damaged one is
    never trained on; it is dropped and sampled again, with a warning that names the step and the damage."""
    from types import SimpleNamespace

    from grpo_cli.models.policies import Policies
    from grpo_cli.rollout.ahead import WorkerSource

    class Worker:
        def restore(self, state):
            self.received = dict(state)

    warned = []
    order = SimpleNamespace(share=lambda step: SimpleNamespace(prompts=["1+1="] if step == 3 else ["?"]))
    source = WorkerSource(
        Worker(),
        Policies(torch.nn.Linear(1, 1)),
        SimpleNamespace(behaviour="current", behaviour_refresh=1, dynamic_sampling=False),
        max_staleness=1,
        first_step=3,
        last_step=8,
        warn=warned.append,
        prompts=order,
    )
    source.load_state_dict({3: stored()})
    assert list(source.worker.received) == [3] and warned == []
    source.load_state_dict({3: stored(**changes)})
    assert source.worker.received == {} and source.asked == 2
    assert (
        warned[0].startswith(f"the checkpoint's rollout sampled ahead for step 3 is damaged ({damage}")
        and "sampled again" in warned[0]
    ), warned


def test_a_push_groups_small_tensors_of_one_dtype_and_sends_large_ones_alone():
    """transport.buckets: consecutive small tensors of one dtype share a bucket up to the limit; a tensor of
    the limit's size or more, or of another dtype, starts its own (the large ones then land in place)."""
    from grpo_cli.procs.transport import buckets

    f32, bf16 = torch.float32, torch.bfloat16
    layout = [
        ((64,), f32),
        ((64,), f32),
        ((1024, 1024), f32),
        ((64,), f32),
        ((64,), bf16),
        ((100_000,), f32),
        ((100_000,), f32),
        ((100_000,), f32),
    ]
    # 256 + 256 bytes; 4 MiB alone; 256 bytes; another dtype; 400 kB + 400 kB fit 1 MiB, the third does not
    assert buckets(layout, 1.0) == [[0, 1], [2], [3], [4], [5, 6], [7]]


@pytest.mark.parametrize("extra", [[], ["model.lora.r=4", "optimizer.lr=3e-3"]], ids=["full", "lora"])
def test_the_worker_scores_the_kl_reference_and_the_trainer_holds_none(extra, tmp_path, monkeypatch):
    """With a generation worker and algo.beta != 0 (generator.score_reference, the default), each rollout comes
    with the reference's log-probs, computed in the worker from the initial weights (under LoRA, its copy's
    base with the adapter off): equal, token by token, to each row scored alone here from the initial model
    (float64 log-softmax), at every step while the policy moves away; the trainer loads no reference and the
    step scores none. With generator.score_reference=false the trainer scores it, to the same numbers."""
    from grpo_cli.models.policies import Policies

    seen, real_step = [], trainer_module.grpo_step

    def spy(policies, *args, **kwargs):
        row, roll = real_step(policies, *args, **kwargs)
        seen.append((policies.reference, row, roll))
        return row, roll

    monkeypatch.setattr(trainer_module, "grpo_step", spy)
    held, real_init = [], Policies.__init__
    monkeypatch.setattr(Policies, "__init__", lambda self, *a: real_init(self, *a) or held.append(self.held_reference))
    for name, knobs in (("worker", []), ("here", ["generator.score_reference=false"])):
        assert (
            train(
                f"output_dir={tmp_path / name}",
                "trainer.steps=3",
                "trainer.max_staleness=1",
                "algo.beta=0.1",
                *extra,
                *knobs,
            )
            == 0
        )
    initial = load_model("builtin:tiny")
    worker, here = seen[:3], seen[3:]
    assert [r is None for r, _, _ in worker] == [True] * 3 and held[0] is None
    assert all(r is not None for r, _, _ in here) and isinstance(held[1], torch.nn.Module) == (not extra)
    for (_, row, roll), (_, row_here, roll_here) in zip(worker, here):
        expected = completion_logp(initial, roll, 1.0)
        got = grid(roll, roll.ref_logp)
        for i, e in enumerate(expected):
            torch.testing.assert_close(got[i, : len(e)].double(), e, atol=1e-5, rtol=0)
        torch.testing.assert_close(roll.ref_logp, roll_here.ref_logp, atol=1e-6, rtol=0)  # the same rollouts
        assert row["kl"] == pytest.approx(row_here["kl"], rel=1e-4, abs=1e-7)
    assert worker[-1][1]["kl"] > 1e-6, "the policy never moved from the reference: the KL term proves nothing"
    rows_ = metric_rows(tmp_path / "worker", training=True)
    assert all(r["worker/score_s"] > 0 and r["worker/gen_s"] > 0 for r in rows_)


def test_a_checkpoint_rollout_without_the_reference_is_sampled_again_when_the_worker_scores_it():
    """A rollout sampled ahead by a worker that did not score the reference (generator.score_reference=false,
    or a grpo-cli from before) cannot be trained on by a trainer that holds no reference: dropped, sampled
    again, and said."""
    from types import SimpleNamespace

    from grpo_cli.models.policies import Policies
    from grpo_cli.rollout.ahead import WorkerSource

    class Worker:
        def restore(self, state):
            self.received = dict(state)

    warned = []
    algo = SimpleNamespace(behaviour="current", behaviour_refresh=1, dynamic_sampling=False)
    source = WorkerSource(
        Worker(),
        Policies(torch.nn.Linear(1, 1)),
        algo,
        max_staleness=1,
        first_step=3,
        last_step=8,
        warn=warned.append,
        reference=True,
    )
    source.load_state_dict({3: stored(ref_logp=torch.full((5,), -0.7))})
    assert list(source.worker.received) == [3] and warned == []
    source.load_state_dict({3: stored()})
    assert source.worker.received == {} and "carries no KL reference log-probs" in warned[0], warned


def test_the_transport_waits_for_a_late_peer_to_join_but_times_a_push_out():
    """A push's deadline (generator.timeout_s) is not the join's: a worker still loading its model longer than
    that joins, and the weights arrive; then a push no one receives fails within the deadline, as a timeout (the
    worker's handle turns it into one sentence), not after the start's 900 s."""
    import threading
    import time

    from grpo_cli.procs.transport import GlooTransport

    sender, got = GlooTransport(0.5), {}

    def worker():
        time.sleep(1.5)  # loading its model: three deadlines long
        receiver = GlooTransport(0.5, address=sender.address)
        into = torch.zeros(4)
        receiver.receive([into], [((4,), torch.float32)])
        got["weights"], got["receiver"] = into.tolist(), receiver  # alive, and no longer receiving

    thread = threading.Thread(target=worker)
    thread.start()
    sender.send([torch.arange(4.0)])
    thread.join(30)
    assert got["weights"] == [0.0, 1.0, 2.0, 3.0]
    start = time.perf_counter()
    with pytest.raises(RuntimeError, match="(?i)timed out|timeout"):
        sender.send([torch.arange(4.0)])  # the worker no longer answers
    assert time.perf_counter() - start < 10
    sender.close()
