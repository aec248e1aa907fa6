"""What watches a step after it ran: its metrics row and a sample of its completions written and shown, and
updates that were not finite counted."""

from __future__ import annotations

from grpo_cli.errors import GrpoError
from grpo_cli.rewards import no_score_none
from grpo_cli.run.console import Console
from grpo_cli.sample.rollout import Rollout


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
        sample = completion_rows(step, roll, t.log_completions_groups, run.user_text)
        for r in sample:
            run.samples_log.write(r)
        show = shown_group(sample, roll.group_size)
        prompt, answer = show[0]["prompt"], show[0]["answer"]  # data=none: no prompt (reset() writes each), no answer
        what = (f"completions of {prompt!r}" if prompt else "episodes") + (f" (answer {answer})" if answer != "" else "")
        run.console.completions(show, f"step {step}: {what}; {len(sample)} in completions.jsonl")


def completion_rows(step: int, roll: Rollout, groups: int, user_text: dict | None = None) -> list[dict]:
    """Every completion of the first `groups` groups with its reward and advantage, for completions.jsonl;
    the prompt as the user wrote it (`user_text` maps a chat-rendered prompt back to it)."""
    G, answers, user_text = roll.group_size, roll.answers, user_text or {}
    rows = [
        {"step": step, "prompt": user_text.get(roll.prompts[g], roll.prompts[g]), "completion": roll.completions[g * G + j],
         "answer": str(answers[g]),
         "reward": no_score_none(float(roll.rewards[g, j])), "advantage": float(roll.advantages[g * G + j])}
        for g in range(min(groups, len(roll.prompts))) for j in range(G)
    ]
    if roll.episodes is not None:  # the whole transcript: every turn, tool call and result
        for r, ep in zip(rows, roll.episodes):  # rows are the first groups' completions, in order
            r.update(completion=ep.transcript(), messages=ep.messages, turns=ep.turns, tool_calls=ep.tool_calls,
                     cut=ep.cut)
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
            self.console.warn(f"step {step}: the loss or gradient was not finite, so this update was skipped "
                              f"({self.skipped} in a row; the run stops at trainer.nonfinite_patience="
                              f"{self.t.nonfinite_patience}).")
        if self.skipped >= self.t.nonfinite_patience:
            raise GrpoError(
                f"{self.skipped} updates in a row had a non-finite loss or gradient (step {step}), so training "
                "stopped with the weights of the last finite update; lower optimizer.lr, check that the reward "
                "is bounded, or resume from the last checkpoint with resume=auto."
            )
