"""`grpo train`: the GRPO loop (docs/math.md, "The algorithm"), read top to bottom. Each step:
1. draw this rank's prompts (whole groups);
2. sample G completions per prompt, score them, whiten the rewards within each group, compute the
   log-probabilities the config needs and run mu clipped updates (step.grpo_step);
3. advance the schedule and refresh the lagged policies;
4. log the metrics (and a sample of completions);
5. score the held-out prompts every trainer.eval_every steps;
6. save a checkpoint every trainer.save_every steps, at the end, and on SIGTERM / Ctrl-C.

With trainer.max_staleness > 0 (or generator.worker) a generation worker samples the coming steps'
rollouts while step 2 runs, and the weights are pushed to it after each update (rollout_worker.py).

Building the run and finishing it live in run.py; under torchrun every rank runs this same loop on
its share of each step's prompts (distributed.py does the communicating, rank 0 the writing).
"""

from __future__ import annotations

import signal
import time
from contextlib import closing, nullcontext
from pathlib import Path

from grpo_cli.console import Console
from grpo_cli.distributed import SINGLE, Dist
from grpo_cli.errors import GrpoError
from grpo_cli.health import Health, stop_run
from grpo_cli.rollout_worker import WorkerDied
from grpo_cli.run import Run, finish_run, start_run
from grpo_cli.step import completion_rows, grpo_step, shown_group
from grpo_cli.stopping import GracefulStop, Stopped


def train(cfg, run_dir: Path, console: Console, dist: Dist = SINGLE, command: str | None = None) -> dict:
    """The whole run, on this rank. Returns the summary printed at the end."""
    run = start_run(cfg, Path(run_dir), console, dist, command)
    t = cfg.trainer
    watch, start = Watch(t, console), time.perf_counter()
    health = Health(cfg, console.warn, t.health)  # every rank sees the same reduced rows, so all stop together

    def announce(signum: int) -> None:
        console.warn(f"{signal.Signals(signum).name}: finishing this step and saving a checkpoint "
                     "(press Ctrl-C again to stop at once)")

    overlap = run.overlap  # generation in a worker process, sampling ahead (rollout_worker.py), or None
    # The reward's and the generator's worker processes end with the run, however it ends.
    with closing(run.reward_fn), closing(overlap) if overlap else nullcontext():
        with console.training(t.steps, start=run.first_step - 1, log_every=t.log_every), GracefulStop(announce) as stop:
            for step in range(run.first_step, t.steps + 1):
                run.policy.train()
                batch = run.prompts.share(step)  # 1.
                try:
                    if overlap:
                        overlap.before(step)  # ask the worker for the steps up to step + max_staleness
                    row, roll = grpo_step(run.policies.roles(), overlap.worker if overlap else run.generator,  # 2.
                                          run.optimizer, batch, run.reward_fn, run.settings, precision=run.precision,
                                          refill=run.prompts.refill(step), dist=dist)
                except WorkerDied as e:
                    raise worker_stop(run, step - 1, e) from None
                lost = None
                if overlap:
                    try:  # the worker samples the coming steps with this update
                        row["push_s"] = overlap.after(step, run.policy)
                    except WorkerDied as e:
                        lost = e  # the step is done: its row is written, then the run stops
                    row["staleness"] = float(step - 1 - roll.version)  # updates between sampler and policy
                watch.updates(step, row)
                lr = run.scheduler.get_last_lr()[0]  # 3.
                run.scheduler.step()
                run.policies.refresh(step)
                row = {"step": step, **row, "lr": lr}
                unhealthy = health.check(step, row)  # adds health/<rule> to the row
                log_step(run, step, row, roll)  # 4.
                if t.eval_every and step % t.eval_every == 0:  # 5.
                    run.held_out.during(step)
                if lost:
                    raise worker_stop(run, step, lost) from None
                signum = int(dist.all_max(stop.signum or 0))  # 6. a signal to any rank stops every rank, together
                if step % t.save_every == 0 or step == t.steps or signum or unhealthy:
                    run.save(step)
                if signum:
                    raise Stopped(signum, step, resume_command(command, run.run_dir))
                if unhealthy:  # trainer.health=stop
                    raise stop_run(unhealthy, resume_command(command, run.run_dir))
        return finish_run(run, time.perf_counter() - start)


def worker_stop(run: Run, done: int, e: WorkerDied) -> GrpoError:
    """The run's answer to a dead or stuck generation worker: a checkpoint of the last finished step
    (with the rollouts received for later steps), then one sentence. Under torchrun the other ranks are
    elsewhere in the step (a save is collective), so this rank names the newest checkpoint and exits, and
    its exit takes the others down."""
    from grpo_cli.checkpoint import list_checkpoints

    if done >= run.first_step and run.dist.world_size == 1:
        run.save(done)
    kept = list_checkpoints(run.run_dir)
    if kept:
        where = f"{kept[-1].name} is the newest checkpoint; continue with: {resume_command(run.command, run.run_dir)}"
    else:
        where = "no checkpoint was written yet; start the run again"
    return GrpoError(f"Training stopped at step {done + 1}: {e}; {where}.")


def resume_command(command: str | None, run_dir: Path) -> str:
    """The command that continues this run where it stopped: the same overrides, this directory, resume=auto."""
    import shlex

    kept = [a for a in (command or "grpo train").split()[2:]
            if not a.startswith(("output_dir=", "resume=", "hydra.run.dir=", "overwrite="))]
    return shlex.join(["grpo", "train", *kept, f"output_dir={run_dir}", "resume=auto"])


def log_step(run: Run, step: int, row: dict, roll) -> None:
    """The metrics row (every trainer.log_every steps and the last), the console line, and every
    trainer.log_completions_every steps (and the last) a sample of completions to completions.jsonl and the
    screen."""
    t = run.cfg.trainer
    if step % t.log_every == 0 or step == t.steps:
        run.metrics.write(row)
    run.console.step(row)
    due = step % t.log_completions_every == 0 or step == t.steps if t.log_completions_every else False
    if due and t.log_completions_groups:  # the last step too: a short run still leaves a sample
        sample = completion_rows(step, roll, t.log_completions_groups, run.user_text)
        for r in sample:
            run.samples_log.write(r)
        show = shown_group(sample, roll.group_size)
        run.console.completions(show, f"step {step}: completions of {show[0]['prompt']!r} (answer "
                                f"{show[0]['answer']}); {len(sample)} in completions.jsonl")


class Watch:
    """Non-finite updates between steps: skipped with a warning; trainer.nonfinite_patience in a row stop
    the run (the other health checks: health.py)."""

    def __init__(self, trainer, console: Console):
        self.t, self.console = trainer, console
        self.skipped = 0

    def updates(self, step: int, row: dict) -> None:
        self.skipped = self.skipped + 1 if row["skipped"] else 0
        if row["skipped"]:
            self.console.warn(f"step {step}: the loss or gradient was not finite, so this update was skipped "
                              f"({self.skipped} in a row; the run stops at trainer.nonfinite_patience="
                              f"{self.t.nonfinite_patience}).")
        if self.skipped >= self.t.nonfinite_patience:
            raise GrpoError(
                f"{self.skipped} updates in a row had a non-finite loss or gradient (step {step}), so training "
                "stopped with the weights of the last finite update; lower optimizer.lr, check that the reward "
                "is bounded, or resume from the last checkpoint with resume=auto."
            )
