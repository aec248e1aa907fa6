"""`grpo train`: the GRPO loop (docs/math.md, "The algorithm"), read top to bottom. Each step:
1. the rollout source hands over this step's groups, sampled and scored: in this process, or sampled ahead in a
   worker process (trainer.max_staleness), which the loop does not need to know;
2. whiten the rewards within each group, compute the log-probabilities the config needs and run mu clipped
   updates (update/step.py); the source takes the new weights;
3. advance the schedule and refresh the lagged policies;
4. what watches a step: the metrics row and its log, floors, health, the held-out scores (observers.py);
5. save a checkpoint every trainer.save_every steps, at the end, and on SIGTERM / Ctrl-C.
Building the run and finishing it live in build.py; under torchrun every rank runs this loop on its share of
each step's prompts (distributed.py does the communicating, rank 0 the writing)."""

from __future__ import annotations

import time
from pathlib import Path

from grpo_cli.models.distributed import SINGLE, Dist
from grpo_cli.run.build import start_run
from grpo_cli.run.console import Console
from grpo_cli.run.finish import finish_run
from grpo_cli.update.step import grpo_step


def train(cfg, run_dir: Path, console: Console, dist: Dist = SINGLE, command: str | None = None) -> dict:
    """The whole run, on this rank. Returns the summary printed at the end."""
    run = start_run(cfg, Path(run_dir), console, dist, command)
    with run.running() as stop:
        for step in range(run.first_step, cfg.trainer.steps + 1):
            start = time.perf_counter()
            scored = run.sample(step)  # 1.
            row, roll = grpo_step(
                run.policies, run.optimizer, scored, run.settings, precision=run.precision, dist=dist
            )  # 2.
            row.update(run.source.update(run.policy, step))  # the source samples the coming steps with this update
            row["lr"] = run.scheduler.get_last_lr()[0]  # 3.
            run.scheduler.step()
            run.policies.refresh(step)
            run.after(step, row, roll, time.perf_counter() - start)  # 4.
            run.checkpoint(step, stop)  # 5.
        return finish_run(run)  # the helpers still up: the held-out scores after training use the source
