"""Health checks (`trainer.health`: warn | stop | off): rules over the metrics every step already logs,
each with a documented threshold and the knob that fixes what it sees.

A broken run rarely crashes; it learns nothing for hours. Each rule reads the step's metrics row and
the rows before it:

How it works in detail: docs/internals.md, grpo_cli/run/health.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from grpo_cli.errors import GrpoError

HEALTH_MODES = ("warn", "stop", "off")
TRUNCATED_FRAC, TRUNCATED_STEPS = 0.5, 3
CONSTANT_STEPS = 5
MISSING_FRAC, MISSING_STEPS = 0.5, 2
SAMPLER_NATS = 0.1
KL_NATS = 2.0  # the default tiny run peaks at 0.74
ENTROPY_FLOOR, ENTROPY_STEPS, ENTROPY_ACCURACY = 0.01, 3, 0.5
ENTROPY_FACTOR, ENTROPY_RISE = 3.0, 2.0
MEMORY_WARMUP, MEMORY_STEPS, MEMORY_GROWTH_GIB = 5, 8, 64 / 1024
MEMORY_WORK_RISE = (
    1.1  # memory_growth stays quiet while the steps' tokens reach new highs (over 10% above the earlier ones)
)
BREAK_RATE, BREAK_STEPS = 0.25, 2


@dataclass
class Rule:
    name: str
    holds: Callable[[list[dict]], bool]  # the rows so far, the newest last
    sentence: Callable[[list[dict]], str]  # what it saw and the knob, for the newest row


def _running(rows: list[dict], steps: int, test: Callable[[dict], bool]) -> bool:
    return len(rows) >= steps and all(test(r) for r in rows[-steps:])


def _work(row: dict) -> float:
    """A step's tokens: what its memory grows with (episodes that lengthen as the model learns to call tools)."""
    return max(row.get("prompt_tokens", 0) + row.get("completion_tokens", 0), row.get("forward_tokens", 0))


def _memory_grew(rows: list[dict]) -> bool:
    seen = [r for r in rows[MEMORY_WARMUP:] if "memory_gib" in r]
    if len(seen) < MEMORY_STEPS + 1:
        return False
    last = [r["memory_gib"] for r in seen[-(MEMORY_STEPS + 1) :]]
    before = max((_work(r) for r in rows[: len(rows) - MEMORY_STEPS]), default=0.0)
    more_work = max(_work(r) for r in rows[-MEMORY_STEPS:]) > MEMORY_WORK_RISE * before  # a new high: not a leak
    return all(b > a for a, b in zip(last, last[1:])) and last[-1] - last[0] > MEMORY_GROWTH_GIB and not more_work


def _mismatch(rows: list[dict], corrected: bool, truncates: bool) -> str:
    """The sampler_mismatch sentence: what to set depends on whether the correction is on already, and on
    whether top-k/top-p sampling makes the gap (by design: the kept mass) or the sampler's numerics do."""
    row = rows[-1]
    gap = (
        f"the sampler's log-probs differ from the trainer's by {row['sampler/logp_diff']:.3f} nats a token, over "
        f"{SAMPLER_NATS}: the sampled tokens are not the policy's; "
    )
    if truncates:  # corrected and truncating does not warn (sample_rules)
        return gap + (
            'sampler.top_p/top_k draw from the kept set only (docs/math.md, "Truncated sampling"); set '
            "algo.sampler_correction=tis to weigh each token by its kept mass, or sampler.top_p=1.0 and sampler.top_k=0"
        )
    if corrected:
        return (
            gap + f"algo.sampler_correction=tis weighs them ({row.get('sampler/capped_frac', 0.0):.1%} of tokens at "
            "its cap); to remove the gap, sample in the training precision (generator=hf: generator.weights=full)"
        )
    return gap + "set algo.sampler_correction=tis, or sample in the training precision"


def rules(cfg) -> list[Rule]:
    """Every rule, in the order they are checked: the samples and their rewards, then the policy and the run."""
    return sample_rules(cfg) + policy_rules(cfg)


def sample_rules(cfg) -> list[Rule]:
    s, zero_steps = cfg.sampler, cfg.trainer.zero_variance_warn_steps
    corrected = cfg.algo.sampler_correction == "tis"
    return [
        Rule(
            "truncation",
            lambda rows: _running(rows, TRUNCATED_STEPS, lambda r: r["truncated_frac"] > TRUNCATED_FRAC),
            lambda rows: (
                f"{rows[-1]['truncated_frac']:.0%} of completions hit sampler.max_new_tokens={s.max_new_tokens} "
                f"for {TRUNCATED_STEPS} steps, so their rewards judge unfinished answers; raise "
                "sampler.max_new_tokens, or add a length penalty (reward=combo with length)"
            ),
        ),
        Rule(
            "zero_variance",
            lambda rows: _running(rows, zero_steps, lambda r: r["zero_var_frac"] == 1.0),
            lambda rows: (
                f"every group has had zero reward variance for {zero_steps} steps, so the advantages and the "
                "loss are zero and nothing learns; raise sampler.temperature or sampler.group_size, or use an "
                "easier task or a denser reward"
            ),
        ),
        Rule(
            "reward_constant",
            lambda rows: _running(
                rows, CONSTANT_STEPS, lambda r: r["reward_std"] == 0.0 and r.get("reward_none_frac", 0.0) < 1.0
            ),
            lambda rows: (
                f"every completion has scored {rows[-1]['reward_mean']:g} for {CONSTANT_STEPS} steps; check that "
                "the reward reads the completion (reward.fn, reward.extract, data.answer_field)"
            ),
        ),
        Rule(
            "reward_missing",
            lambda rows: _running(rows, MISSING_STEPS, lambda r: r.get("reward_none_frac", 0.0) > MISSING_FRAC),
            lambda rows: (
                f"{rows[-1]['reward_none_frac']:.0%} of completions had no score (None, or a reward worker "
                f"failure) for {MISSING_STEPS} steps; fix the reward, or raise reward.timeout_s"
            ),
        ),
        Rule(  # top-k/top-p's gap is the kept mass by design: with the correction on, it is weighed, not wrong
            "sampler_mismatch",
            lambda rows: rows[-1].get("sampler/logp_diff", 0.0) > SAMPLER_NATS and not (corrected and s.truncates),
            lambda rows: _mismatch(rows, corrected, s.truncates),
        ),
    ]


def policy_rules(cfg) -> list[Rule]:
    return [
        Rule(
            "kl_explode",
            lambda rows: rows[-1].get("kl", 0.0) > KL_NATS,
            lambda rows: (
                f"the KL to the reference is {rows[-1]['kl']:.2f} nats a token, over {KL_NATS:g}: the policy is "
                "running away; lower optimizer.lr or raise algo.beta"
            ),
        ),
        Rule(
            "entropy_collapse",
            lambda rows: _running(
                rows,
                ENTROPY_STEPS,
                lambda r: r.get("entropy", 1.0) < ENTROPY_FLOOR and r.get("accuracy", 0.0) < ENTROPY_ACCURACY,
            ),
            lambda rows: (
                f"the policy's entropy is {rows[-1]['entropy']:.4f} nats a token while {rows[-1]['accuracy']:.0%} "
                "of completions are correct: it samples one answer and cannot explore; raise "
                "sampler.temperature or algo.entropy_coef"
            ),
        ),
        Rule(
            "entropy_explode",
            lambda rows: (
                "entropy" in rows[0]
                and _running(
                    rows,
                    ENTROPY_STEPS,
                    lambda r: (
                        r["entropy"] > max(ENTROPY_FACTOR * rows[0]["entropy"], rows[0]["entropy"] + ENTROPY_RISE)
                    ),
                )
            ),
            lambda rows: (
                f"the policy's entropy rose from {rows[0]['entropy']:.2f} to {rows[-1]['entropy']:.2f} nats a "
                "token: its outputs are turning to noise; lower optimizer.lr"
            ),
        ),
        Rule(
            "memory_growth",
            _memory_grew,
            lambda rows: (
                f"memory has grown at each of the last {MEMORY_STEPS} steps, to {rows[-1]['memory_gib']:.2f} GiB: "
                "something keeps a reference every step (a reward or callback that stores completions?)"
            ),
        ),
        Rule(
            "prefix_breaks",
            lambda rows: _running(rows, BREAK_STEPS, lambda r: r.get("multiturn/prefix_break_rate", 0.0) > BREAK_RATE),
            lambda rows: (
                f"{rows[-1]['multiturn/prefix_break_rate']:.0%} of episodes' later turns did not extend the last "
                "turn's tokens, so each prefilled its whole context again; an environment or chat template is "
                "rewriting earlier turns (episodes must only append)"
            ),
        ),
    ]


@dataclass
class Health:
    """The rules of one run, the rows they have seen, and the rules that fired."""

    cfg: object
    warn: Callable[[str], None]
    mode: str = "warn"
    rows: list[dict] = field(default_factory=list)
    fired: list[str] = field(default_factory=list)  # in the order they first fired

    def __post_init__(self):
        self.rules = rules(self.cfg) if self.mode != "off" else []

    def check(self, step: int, row: dict) -> str | None:
        """Adds `health/<rule>: 1.0` to the row for each rule that holds; warns once per rule; under `stop`,
        returns the sentence to stop with (the caller saves a checkpoint first)."""
        self.rows.append({k: v for k, v in row.items() if isinstance(v, (int, float))})
        stop = None
        for rule in self.rules:
            if not rule.holds(self.rows):
                continue
            row[f"health/{rule.name}"] = 1.0
            if rule.name in self.fired:
                continue
            self.fired.append(rule.name)
            sentence = rule.sentence(self.rows)
            if self.mode == "stop":
                stop = stop or f"Health check {rule.name!r} at step {step}: {sentence}."
            else:
                self.warn(
                    f"health: {rule.name} at step {step}: {sentence} (trainer.health=stop stops such a run; "
                    "off silences this)."
                )
        return stop


def stop_run(sentence: str, resume: str) -> GrpoError:
    return GrpoError(f"{sentence[:-1]}; a checkpoint was saved, so `{resume}` goes on from it.")
