"""What watches a step once it ran, behind the one call the loop makes (`AfterStep`): the step's wall time and its
phases against this machine's floors, updates that were not finite counted, the health rules, the metrics row and
a sample of its completions written and shown, the memory plan again from the first step's samples, and the
held-out scores every trainer.eval_every steps."""

from __future__ import annotations

from rich.markup import escape

from grpo_cli.errors import GrpoError
from grpo_cli.rewards import no_score_none
from grpo_cli.run.console import Console
from grpo_cli.run.floors import StepFloors
from grpo_cli.run.health import Health
from grpo_cli.samples.rollout import Rollout


class AfterStep:
    """The loop's one call after each step (the module docstring); `unhealthy` is the health rule that stops the run
    under trainer.health=stop, else None."""

    def __init__(self, run, floors: StepFloors):
        t = run.cfg.trainer
        self.run, self.floors, self.watch = run, floors, Watch(t, run.console)
        self.health = Health(run.cfg, run.console.warn, t.health)  # every rank sees the same rows: all stop together
        self.unhealthy: str | None = None

    def __call__(self, step: int, row: dict, roll: Rollout, seconds: float) -> None:
        run, dist, t = self.run, self.run.dist, self.run.cfg.trainer
        wall = dist.all_max(seconds)  # the step's wall time, every wait included
        row.update(seconds=wall, tokens_per_s=row["completion_tokens"] / max(wall, 1e-9))
        row.update(self.floors.efficiency(row, roll, dist.all_max))  # efficiency/<phase>: floor over seconds
        self.watch.updates(step, row)
        row = {"step": step, **row}
        self.unhealthy = self.health.check(step, row)  # adds health/<rule> to the row
        log_step(run, step, row, roll)
        if step == run.first_step and dist.is_main:  # the memory plan again, from what was really sampled
            run.console.print(
                escape("from this step's samples, " + run.plan.from_samples(row).line()),
                highlight=False,
                soft_wrap=True,
            )
        if t.eval_every and step % t.eval_every == 0:
            run.held_out.during(step)


def log_step(run, step: int, row: dict, roll) -> None:
    """The metrics row (every trainer.log_every steps and the last), the console line, and every
    trainer.log_completions_every steps (and the last) a sample of completions to completions.jsonl and the
    screen."""
    t = run.cfg.trainer
    if step % t.log_every == 0 or step == t.steps:
        run.metrics.write(row)
    run.console.step(row)
    due = step % t.log_completions_every == 0 or step == t.steps if t.log_completions_every else False
    if due and t.log_completions_groups:  # the last step too: a short run still leaves a sample
        sample = completion_rows(step, roll, t.log_completions_groups, run.user_text, run.tokenizer)
        for r in sample:
            run.samples_log.write(r)
        show = shown_group(sample, roll.group_size)
        prompt, answer = show[0]["prompt"], show[0]["answer"]  # data=none: no prompt (reset() writes each), no answer
        what = (f"completions of {prompt!r}" if prompt else "episodes") + (
            f" (answer {answer})" if answer != "" else ""
        )
        run.console.completions(show, f"step {step}: {what}; {len(sample)} in completions.jsonl")


def completion_rows(step: int, roll: Rollout, groups: int, user_text: dict | None = None, tokenizer=None) -> list[dict]:
    """Every completion of the first `groups` groups with its reward and advantage, for completions.jsonl;
    the prompt as the user wrote it (`user_text` maps a chat-rendered prompt back to it). An episode's row
    also holds its messages (and after a cut the unseen answer, marked), reset()'s observation appended to the
    prompt, and with `tokenizer` the text the model read, decoded from its ids (Episode.rendered)."""
    G, answers, user_text = roll.group_size, roll.answers, user_text or {}
    assert answers is not None and roll.rewards is not None and roll.advantages is not None, "a scored rollout"
    rows = [
        {
            "step": step,
            "prompt": user_text.get(roll.prompts[g], roll.prompts[g]),
            "completion": roll.completions[g * G + j],
            "answer": str(answers[g]),
            "reward": no_score_none(float(roll.rewards[g, j])),
            "advantage": float(roll.advantages[g * G + j]),
        }
        for g in range(min(groups, len(roll.prompts)))
        for j in range(G)
    ]
    if roll.episodes is not None:  # the whole transcript: every turn, tool call and result
        for r, ep in zip(rows, roll.episodes):  # rows are the first groups' completions, in order
            r.update(
                completion=ep.transcript(),
                messages=ep.logged_messages(),
                turns=ep.turns,
                tool_calls=ep.tool_calls,
                cut=ep.cut,
            )
            if ep.observation:
                r.update(prompt=r["prompt"] + ep.observation, observation=ep.observation)
            if tokenizer is not None:
                r["rendered"] = ep.rendered(tokenizer)
    return rows


def shown_group(rows: list[dict], group_size: int) -> list[dict]:
    """The first logged group whose rewards differ (the ones that teach), else the first."""
    groups = [rows[s : s + group_size] for s in range(0, len(rows), group_size)]
    return next((g for g in groups if len({r["reward"] for r in g}) > 1), groups[0])


class Watch:
    """Non-finite updates between steps: skipped with a warning; trainer.nonfinite_patience in a row stop
    the run (the other health checks: health.py)."""

    def __init__(self, trainer, console: Console):
        self.t, self.console = trainer, console
        self.skipped = 0

    def updates(self, step: int, row: dict) -> None:
        self.skipped = self.skipped + 1 if row["skipped"] else 0
        if row["skipped"]:
            self.console.warn(
                f"step {step}: the loss or gradient was not finite, so this update was skipped "
                f"({self.skipped} in a row; the run stops at trainer.nonfinite_patience="
                f"{self.t.nonfinite_patience})."
            )
        if self.skipped >= self.t.nonfinite_patience:
            raise GrpoError(
                f"{self.skipped} updates in a row had a non-finite loss or gradient (step {step}), so training "
                "stopped with the weights of the last finite update; lower optimizer.lr, check that the reward "
                "is bounded, or resume from the last checkpoint with resume=auto."
            )
