"""The trainer's held-out scores (docs/math.md, "Evaluation"): greedy and sampled accuracy on the test
split before, during and after training, the prompts split over ranks, sampled through the run's rollout
source, so a run never builds a second generator or engine for them."""

from __future__ import annotations

from dataclasses import dataclass

from grpo_cli.config.data import SamplerConfig
from grpo_cli.data.tasks import answer_column
from grpo_cli.models.distributed import SINGLE, Dist
from grpo_cli.rewards import Judge
from grpo_cli.rollout.scoring import Draws, greedy_scores, sampled_scores


def held_out_scores(source, rows, settings: "HeldOutSettings", dist: Dist = SINGLE, model=None) -> dict:
    """The trainer's held-out row, asked of the run's rollout source (source.py; the weights it samples
    the policy with): greedy accuracy and reward, and the accuracy of 4 completions per prompt sampled as
    in training (seeded per prompt by the run seed, so every evaluation draws the same noise). Under data
    parallelism each rank scores a slice of `rows`; the means are combined, weighted by each slice's
    prompts. `model`: weights other than the policy's, where the source can score them."""
    per = -(-len(rows) // dist.world_size)
    first = min(dist.rank * per, len(rows))
    part = rows.select(range(first, min(first + per, len(rows)))).to_dict()
    n = len(part[settings.prompt_field])
    scores = source.evaluate(part, settings, first, model)  # every rank enters: under FSDP it gathers the parameters
    parts = [(n, s) for n, s in dist.gather_objects((n, scores)) if n]
    total = sum(n for n, _ in parts)
    combined = {k: sum(n * s[k] for n, s in parts) / total for k in parts[0][1] if k != "num_prompts"}
    return {**combined, "num_prompts": total}


def part_scores(generator, model, part: dict, reward_fn, judge: Judge, settings: "HeldOutSettings", first: int) -> dict:
    """The scores of one slice of the held-out rows (`part`: columns of lists; `first`: its first row's
    index in the split, which seeds the sampled draws)."""
    prompts, answers = part[settings.prompt_field], part[settings.answer_field]
    if not prompts:
        return {}
    scores = greedy_scores(
        generator,
        model,
        prompts,
        answers,
        reward_fn,
        judge,
        max_new_tokens=settings.sampler.max_new_tokens,
        columns=part,
    )
    scores.update(
        sampled_scores(
            generator,
            model,
            prompts,
            answers,
            reward_fn,
            judge,
            Draws(4, settings.sampler, seed=settings.seed, offset=first),
            extract=settings.extract,
            pattern=settings.pattern,
            columns=part,
        )
    )
    return scores


class HeldOut:
    """The held-out split's first `trainer.eval_prompts` prompts, scored with the run's generator and
    reward: before training (kept in checkpoints, so a resumed run reports the same start), every
    `trainer.eval_every` steps as an `eval/` metrics row, and after training. With
    `trainer.eval_before_at=end` the scores before training are those of the initial weights loaded again
    after the last step (`initial`), so the first step starts at once: the same weights, drawn the same way."""

    def __init__(self, t, settings: HeldOutSettings, rows, source, judge: Judge, dist: Dist, console, metrics):
        """`t`: the trainer group; `settings`: how the prompts are read, sampled and judged (`of`)."""
        self.rows, self.settings = rows.select(range(min(t.eval_prompts, len(rows)))), settings
        self.source, self.judge = source, judge  # the rollout source samples the policy (source.py)
        self.dist, self.console, self.metrics = dist, console, metrics
        self.last: tuple[int, dict] | None = None  # (step, scores) of the latest periodic evaluation
        at_end = t.eval_before_after and t.eval_before_at == "end"
        self.deferred = at_end and source.evaluates_any_model()
        if at_end and not self.deferred:
            console.warn(
                "trainer.eval_before_at=end needs the in-process hf generator and one process (the scores "
                "come from the initial weights loaded again); the scores before training are measured first"
            )

    def scores(self) -> dict:
        return held_out_scores(self.source, self.rows, self.settings, self.dist)

    @staticmethod
    def row(step: int, scores: dict) -> dict:
        """Scores as a metrics row: `eval/` keys and no `reward_mean`, so readers of the training rows
        (which filter on it) pass them by."""
        return {"step": step, "kind": "eval", **{f"eval/{k}": v for k, v in scores.items() if k != "num_prompts"}}

    def before(self, saved: dict | None, enabled: bool, first_row: bool) -> dict | None:
        """The scores before training: those a checkpoint kept, else measured now when `enabled` (after the
        last step when deferred)."""
        if self.deferred and not saved:
            self.console.print(
                f"held-out accuracy on {len(self.rows)} prompts before training: measured after the last "
                "step, on the initial weights loaded again (trainer.eval_before_at=end)"
            )
            return None
        before = saved or (self.scores() if enabled else None)
        if before:
            self.console.print(
                f"held-out accuracy on {len(self.rows)} prompts before training: greedy "
                f"{before['accuracy']:.3f}, sampled {before['sampled_accuracy']:.3f} (correct: {self.judge.label})"
            )
            if first_row:
                self.metrics.write(self.row(0, before))  # where the held-out curve starts
        return before

    def during(self, step: int) -> None:
        scores = self.scores()
        self.last = (step, scores)
        self.metrics.write(self.row(step, scores))
        self.console.print(
            f"step {step} held-out: greedy accuracy {scores['accuracy']:.3f}, sampled "
            f"{scores['sampled_accuracy']:.3f}, reward {scores['reward_mean']:.3f} (correct: {self.judge.label})"
        )

    def final(self, step: int) -> dict:
        """The scores after the last step: the periodic evaluation's when one ran at that step (the same
        weights, drawn the same way), else measured now and written as that step's `eval/` row."""
        if self.last is not None and self.last[0] == step:
            return self.last[1]
        self.console.phase(f"scoring {len(self.rows)} held-out prompts after training")
        scores = self.scores()
        self.metrics.write(self.row(step, scores))
        return scores

    def initial(self, load) -> dict:
        """The deferred scores before training: the initial weights, `load()`ed again as the run first built
        them, scored as `before` would have scored them, and written as the step-0 `eval/` row."""
        self.console.phase(f"scoring {len(self.rows)} held-out prompts with the initial weights, loaded again")
        model = load().eval()
        scores = held_out_scores(self.source, self.rows, self.settings, self.dist, model=model)
        del model
        self.console.print(
            f"held-out accuracy on {len(self.rows)} prompts before training (the initial weights, loaded "
            f"again): greedy {scores['accuracy']:.3f}, sampled {scores['sampled_accuracy']:.3f}"
        )
        self.metrics.write(self.row(0, scores))
        return scores

    def after(self, before: dict, after: dict) -> dict:
        """The scores after training (`final`) printed beside `before`; returns the summary's keys."""
        self.console.print(
            f"held-out accuracy on {len(self.rows)} prompts: greedy {before['accuracy']:.3f} -> "
            f"{after['accuracy']:.3f}, "
            f"sampled {before['sampled_accuracy']:.3f} -> {after['sampled_accuracy']:.3f} (correct: {self.judge.label})"
        )
        summary = dict(
            greedy_accuracy_before=before["accuracy"],
            greedy_accuracy_after=after["accuracy"],
            sampled_accuracy_before=before["sampled_accuracy"],
            sampled_accuracy_after=after["sampled_accuracy"],
            correct=self.judge.label,
        )
        if "tool_use_frac" in after:  # episodes: how often the greedy model called a tool
            self.console.print(
                f"held-out greedy tool use: {before['tool_use_frac']:.3f} -> {after['tool_use_frac']:.3f} "
                f"of episodes, {before['tool_calls']:.2f} -> {after['tool_calls']:.2f} calls and "
                f"{before['turns']:.2f} -> {after['turns']:.2f} turns per episode",
                highlight=False,
            )
            summary.update(
                tool_use_before=before["tool_use_frac"],
                tool_use_after=after["tool_use_frac"],
                tool_calls_before=before["tool_calls"],
                tool_calls_after=after["tool_calls"],
            )
        return summary


@dataclass(frozen=True)
class HeldOutSettings:
    prompt_field: str
    answer_field: str
    sampler: SamplerConfig  # the run's sampler settings: max_new_tokens, temperature, top_p, top_k
    extract: str  # reward.extract: what maj@k votes on
    pattern: str | None
    seed: int

    @classmethod
    def of(cls, data, sampler, reward, seed: int, columns) -> "HeldOutSettings":
        """From the data, sampler and reward groups, for a split with `columns`."""
        return cls(data.prompt_field, answer_column(columns, data), sampler, reward.extract, reward.pattern, seed)
