"""The run the loop drives (`Run`, built by build.start_run): its parts' state, saved and restored as one
checkpoint, and what the loop asks of it each step: sample, watch, checkpoint and stop."""

from __future__ import annotations

import shlex
import time
from contextlib import ExitStack, closing, contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from grpo_cli.data.tasks import PromptOrder
from grpo_cli.errors import GrpoError, SourceLost, first_line
from grpo_cli.models.distributed import Dist
from grpo_cli.models.policies import Policies
from grpo_cli.models.precision import Precision
from grpo_cli.rollout.held_out import HeldOut
from grpo_cli.rollout.source import RolloutSource
from grpo_cli.run.checkpoint import list_checkpoints, save_checkpoint
from grpo_cli.run.console import Console, MetricsLog
from grpo_cli.run.health import stop_run
from grpo_cli.run.parts import OptimizerState, PerRank, Rng, Stateful
from grpo_cli.run.stopping import GracefulStop, Stopped
from grpo_cli.samples.settings import StepSettings

if TYPE_CHECKING:
    from grpo_cli.config import TrainConfig
    from grpo_cli.run.observers import AfterStep


@dataclass
class Run:
    """Everything the loop uses, built once by `start_run`."""

    cfg: TrainConfig
    run_dir: Path
    console: Console
    dist: Dist
    command: str | None
    precision: Precision
    tokenizer: Any
    policy: torch.nn.Module  # wrapped for DDP / FSDP when launched so
    policies: Policies
    reward_fn: Any  # rewards.Reward
    settings: StepSettings
    optimizer: torch.optim.Optimizer
    scheduler: Any  # a torch LR scheduler
    prompts: PromptOrder  # this rank's prompts of each step, from the training split
    user_text: dict  # chat-rendered prompt -> what the user wrote, for completions.jsonl
    metrics: MetricsLog
    samples_log: MetricsLog
    first_step: int
    held_out_before: dict | None = None
    saved: int = 0  # the newest step saved by this run
    resumed_from: Path | None = None  # the checkpoint this run started from
    plan: Any = None  # the memory plan (plan.py), shown again from the first step's samples
    # set by start_run once the run exists, before the loop reads them:
    source: RolloutSource = field(init=False)  # the rollout stage (source.py): in this process or a worker's
    held_out: HeldOut = field(init=False)  # scored through the source
    after: AfterStep = field(init=False)  # what watches each step once it ran
    started: float = 0.0  # when the loop began (perf_counter)

    def parts(self) -> dict[str, Stateful]:
        """The run's state, part by part, in the order a resume loads them (the RNG last): each saves and
        loads its own, and a checkpoint's trainer state is their collection. The policy's weights are the
        checkpoint's model files; the data has no position (PromptOrder makes every step's prompts a
        function of seed and step); the logs' cursor is the step, read where they open. The source's part is
        each rank's rollouts sampled ahead and not yet trained on: a resumed run trains on these, as the
        uninterrupted one would."""
        return {
            "policies": self.policies,
            "optimizer": OptimizerState(self.optimizer, self.policy, self.resumed_from),
            "scheduler": self.scheduler,
            "source": PerRank(self.source, self.dist, lambda ranks: {}),
            "rng": PerRank(Rng(), self.dist, lambda ranks: ranks[0]),
        }

    def save(self, step: int) -> None:
        """A checkpoint of this step: the weights, every part's state, and what a resume reads first."""
        save_checkpoint(
            self.run_dir,
            step,
            self.policy,
            self.tokenizer,
            {
                **{name: part.state_dict() for name, part in self.parts().items()},
                "config": asdict(self.cfg),
                "held_out_before": self.held_out_before,
                "max_tokens_per_micro_batch": self.settings.max_tokens,  # a resumed run batches as this one did
            },
            keep_last=self.cfg.trainer.keep_last,
            dist=self.dist,
            optimizer=self.optimizer,
        )
        self.saved = step

    def restore(self, state: dict) -> None:
        """Every part takes its state back from a checkpoint's (none for a new run)."""
        if not state:
            return
        for name, part in self.parts().items():
            try:
                part.load_state_dict(state[name])
            except (KeyError, ValueError, TypeError, RuntimeError) as e:  # the file's content, not this code
                raise GrpoError(
                    f"The checkpoint {self.resumed_from}'s {name} state does not load ({first_line(e)}); "
                    "resume from another checkpoint with resume=PATH, or start a new run."
                ) from None
        if state.get("world_size", 1) != self.dist.world_size:
            self.console.print(
                f"resuming a {state.get('world_size', 1)}-process run on {self.dist.world_size}: the "
                "prompts and sampled completions of each step are the same (they depend on the seed "
                "and step alone)"
            )

    @contextmanager
    def running(self):
        """The loop's frame: the progress display, Ctrl-C and SIGTERM finishing the step (yields the GracefulStop),
        and the reward's and the source's helper processes ending with the run, however it ends."""
        t = self.cfg.trainer
        with ExitStack() as stack:
            stack.enter_context(closing(self.reward_fn))
            stack.enter_context(closing(self.source))
            stack.enter_context(self.console.training(t.steps, start=self.first_step - 1, log_every=t.log_every))
            self.started = time.perf_counter()
            yield stack.enter_context(GracefulStop(self.console.announce_stop))

    def sample(self, step: int):
        """Step `step`'s groups from the rollout source, sampled and scored. A source that cannot sample them (a
        dead or stuck worker) stops the run: a checkpoint of the last finished step first, then one sentence
        naming it and the resume command. Under torchrun the other ranks are elsewhere in the step (a save is
        collective), so this rank names the newest checkpoint and exits, and its exit takes the others down."""
        self.policy.train()
        try:
            return self.source.next(step)
        except SourceLost as e:
            done = step - 1
            if self.first_step <= done != self.saved and self.dist.world_size == 1:
                self.save(done)
            kept = list_checkpoints(self.run_dir)
            where = (
                f"{kept[-1].name} is the newest checkpoint; continue with: {resume_command(self.command, self.run_dir)}"
                if kept
                else "no checkpoint was written yet; start the run again"
            )
            raise GrpoError(f"Training stopped at step {step}: {e}; {where}.") from None

    def checkpoint(self, step: int, stop: GracefulStop) -> None:
        """Save every trainer.save_every steps, at the end, and before stopping: on a signal to any rank (every rank
        stops, together) or a health rule under trainer.health=stop."""
        t, unhealthy = self.cfg.trainer, self.after.unhealthy
        signum = int(self.dist.all_max(stop.signum or 0))
        if step % t.save_every == 0 or step == t.steps or signum or unhealthy:
            self.save(step)
        if signum:
            raise Stopped(signum, step, resume_command(self.command, self.run_dir))
        if unhealthy:
            raise stop_run(unhealthy, resume_command(self.command, self.run_dir))


def resume_command(command: str | None, run_dir: Path) -> str:
    """The command that continues this run where it stopped: the same overrides, this directory, resume=auto."""
    kept = [
        a
        for a in (command or "grpo train").split()[2:]
        if not a.startswith(("output_dir=", "resume=", "hydra.run.dir=", "overwrite="))
    ]
    return shlex.join(["grpo", "train", *kept, f"output_dir={run_dir}", "resume=auto"])
