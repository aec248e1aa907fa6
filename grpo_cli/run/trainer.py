"""`grpo train`: the GRPO loop (docs/math.md, "The algorithm"), read top to bottom. Each step:
1. the rollout source (source.py) hands over this step's groups, sampled and scored: in this process,
   or sampled ahead in a worker process (trainer.max_staleness), which the loop does not need to know;
2. whiten the rewards within each group, compute the log-probabilities the config needs and run mu
   clipped updates (step.grpo_step); the source takes the new weights;
3. advance the schedule and refresh the lagged policies;
4. log the metrics (and a sample of completions);
5. score the held-out prompts every trainer.eval_every steps;
6. save a checkpoint every trainer.save_every steps, at the end, and on SIGTERM / Ctrl-C.

Building the run and finishing it live in build.py; under torchrun every rank runs this same loop on
its share of each step's prompts (distributed.py does the communicating, rank 0 the writing).
"""

from __future__ import annotations

import signal
import time
from contextlib import closing
from pathlib import Path

from rich.markup import escape

from grpo_cli.run.console import Console
from grpo_cli.models.distributed import SINGLE, Dist
from grpo_cli.run.health import Health, stop_run
from grpo_cli.run.floors import StepFloors
from grpo_cli.run.build import finish_run, resume_command, start_run
from grpo_cli.update.step import grpo_step
from grpo_cli.run.observers import Watch, log_step
from grpo_cli.run.stopping import GracefulStop, Stopped


def train(cfg, run_dir: Path, console: Console, dist: Dist = SINGLE, command: str | None = None) -> dict:
    """The whole run, on this rank. Returns the summary printed at the end."""
    run = start_run(cfg, Path(run_dir), console, dist, command)
    t, source = cfg.trainer, run.source
    run.floors = StepFloors.of(cfg, run.policy, run.precision, dist.world_size)  # peaks: probed once, cached
    watch, start = Watch(t, console), time.perf_counter()
    health = Health(cfg, console.warn, t.health)  # every rank sees the same reduced rows, so all stop together
    # The reward's and the source's helper processes end with the run, however it ends.
    with closing(run.reward_fn), closing(source):
        with console.training(t.steps, start=run.first_step - 1, log_every=t.log_every), \
                GracefulStop(announcer(console)) as stop:
            for step in range(run.first_step, t.steps + 1):
                t_step = time.perf_counter()
                run.policy.train()
                with run.stop_if_source_lost(step):
                    scored = source.next(step)  # 1.
                row, roll = grpo_step(run.policies.roles(), run.optimizer, scored, run.settings,  # 2.
                                      precision=run.precision, dist=dist)
                row.update(source.update(run.policy, step))  # the source samples the coming steps with this update
                wall = dist.all_max(time.perf_counter() - t_step)  # the step's wall time, every wait included
                row.update(seconds=wall, tokens_per_s=row["completion_tokens"] / max(wall, 1e-9))
                row.update(run.floors.efficiency(row, roll, dist.all_max))  # efficiency/<phase>: floor over seconds
                watch.updates(step, row)
                lr = run.scheduler.get_last_lr()[0]  # 3.
                run.scheduler.step()
                run.policies.refresh(step)
                row = {"step": step, **row, "lr": lr}
                unhealthy = health.check(step, row)  # adds health/<rule> to the row
                log_step(run, step, row, roll)  # 4.
                if step == run.first_step and dist.is_main:  # the memory plan again, from what was really sampled
                    run.console.print(escape("from this step's samples, " + run.plan.from_samples(row).line()),
                                      highlight=False, soft_wrap=True)
                if t.eval_every and step % t.eval_every == 0:  # 5.
                    run.held_out.during(step)
                signum = int(dist.all_max(stop.signum or 0))  # 6. a signal to any rank stops every rank, together
                if step % t.save_every == 0 or step == t.steps or signum or unhealthy:
                    run.save(step)
                if signum:
                    raise Stopped(signum, step, resume_command(command, run.run_dir))
                if unhealthy:  # trainer.health=stop
                    raise stop_run(unhealthy, resume_command(command, run.run_dir))
        return finish_run(run, time.perf_counter() - start)


def announcer(console: Console):
    def announce(signum: int) -> None:
        console.warn(f"{signal.Signals(signum).name}: finishing this step and saving a checkpoint "
                     "(press Ctrl-C again to stop at once)")
    return announce
