"""The trainer's end of the generation worker (worker.py): `WorkerSource` asks for rollouts up to
`trainer.max_staleness` steps ahead of the update, pushes the weights that sample them, and keeps the
rollouts in flight in a checkpoint (docs/math.md, "Stale sampling"). A scored rollout crosses the pipe, and
a checkpoint, as plain types (`scored_state`), and is checked when read back (`stored_damage`).
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from typing import Any, Callable

import torch

from grpo_cli.errors import SourceLost
from grpo_cli.models.distributed import unwrap
from grpo_cli.models.policies import Policies
from grpo_cli.rollout.source import LocalSource, ScoredRollout
from grpo_cli.samples.metrics import StepMetrics
from grpo_cli.samples.rollout import ROW_FIELDS, TOKEN_FIELDS, Rollout


class WorkerSource:
    """The whole chain in a worker process (rollout/worker.py), built from a frozen spec: step t trains on
    rollouts sampled by the weights of update max(t - 1 - max_staleness, 0). Requests run
    `max_staleness` steps ahead of the update. What the worker samples with: the policy, pushed after
    every update but the last; a frozen behaviour, loaded there once; a lagged behaviour, pushed at the
    start and at each refresh."""

    def __init__(
        self,
        worker,
        policies: Policies,
        algo,
        *,
        max_staleness: int,
        first_step: int,
        last_step: int,
        warn: Callable = print,
        evaluator: LocalSource | None = None,
        prompts=None,
        reference: bool = False,
    ):
        self.worker, self.policies, self.warn = worker, policies, warn
        self.reference = reference  # the worker scores the KL reference (config.reference_in_worker): rollouts carry it
        # the run's PromptOrder: what each step draws, to check a checkpoint's rollouts against (not under
        # dynamic sampling, whose refills draw more)
        self.prompts = None if algo.dynamic_sampling else prompts
        self.evaluator = evaluator  # held-out scoring in this process, when the worker samples a behaviour
        self.updated: tuple | None = None  # (the policy, the update) the source was last told of
        self.pushed: int | None = None  # the last update pushed
        self.behaviour, self.refresh = algo.behaviour, algo.behaviour_refresh
        self.k, self.first_step, self.last_step = max_staleness, first_step, last_step
        self.device = next(policies.policy.parameters()).device
        self.asked = first_step - 1  # the last step requested (or restored)
        self.lost: SourceLost | None = None  # a push that failed: said at the next request

    def next(self, step: int) -> ScoredRollout:
        if self.lost is not None:
            raise self.lost
        for t in range(self.asked + 1, min(step + self.k, self.last_step) + 1):  # the newest weights sample them
            self.worker.request(t)
            self.asked = t
        start = time.perf_counter()
        scored = scored_from_state(self.worker.take(step), self.device)
        scored.metrics.max("worker/gen_s", scored.gen_s)  # the worker's own seconds, beside the trainer's
        scored.metrics.max("worker/score_s", scored.score_s)
        scored.gen_s, scored.score_s = time.perf_counter() - start, 0.0  # the trainer's wait is its sampling time
        if self.behaviour == "current" and scored.rollout.version is not None:  # updates between sampler and policy
            scored.metrics.max("staleness", float(step - 1 - scored.rollout.version))
        return scored

    def sampler(self, policy, version: int):
        """A context yielding the model whose weights the worker samples with after update `version`, or
        None when it keeps the weights it has."""
        if version >= self.last_step or self.behaviour == "frozen":
            return None
        if self.behaviour == "lagged" and version == self.first_step - 1:
            return self.policies.behaviour  # as the checkpoint holds it: not the policy, between refreshes
        if self.behaviour == "lagged" and version % self.refresh:
            return None
        return lambda: nullcontext(policy)

    def update(self, policy, version: int) -> dict:
        """Push the weights the worker samples with next: the seconds the trainer waited for the worker's
        answers to the steps asked ahead (`wait_s`), and those of the push itself (`push_s`). A worker lost
        during the push leaves this step done; the next request says so."""
        start, waited = time.perf_counter(), 0.0
        self.updated = (policy, version)
        sampler = self.sampler(policy, version)
        if sampler is not None:
            try:
                with sampler() as model:
                    waited = self.worker.push(pushed_tensors(model, policy), version)
                self.pushed = version
            except SourceLost as e:
                self.lost = e
        return {"push_s": time.perf_counter() - start - waited, "wait_s": waited}

    def evaluates_any_model(self) -> bool:
        return False  # the worker samples its own copy of the policy

    def evaluate(self, part: dict, settings, first: int, model=None) -> dict:
        """Held-out scores of `part` under the policy: in the worker, which first takes an update it has
        not had (the last one is not pushed for sampling); in this process when the worker samples a
        behaviour policy."""
        if self.evaluator is not None:
            return self.evaluator.evaluate(part, settings, first)
        if self.lost is not None:
            raise self.lost
        assert self.updated is not None, "held-out scoring comes after the first update"
        policy, version = self.updated
        if self.pushed != version:
            self.worker.push(pushed_tensors(policy, policy), version)
            self.pushed = version
        return self.worker.evaluate(part, settings, first) if part[settings.prompt_field] else {}

    def state_dict(self) -> dict:
        """The scored rollouts received and not yet trained on, by step."""
        return self.worker.state()

    def load_state_dict(self, state: dict) -> None:
        """Keep the rollouts a checkpoint holds for the steps this run samples ahead; say which steps
        are sampled again instead."""
        expected = range(self.first_step, min(self.first_step - 1 + self.k, self.last_step) + 1)
        dropped = sorted(s for s in state if s not in expected)
        for step in sorted(s for s in state if s not in dropped):
            drawn = None if self.prompts is None else list(self.prompts.share(step).prompts)
            damage = stored_damage(state[step], step, self.k, drawn, self.reference)
            if damage:  # never trained on: sampled again, and said
                self.warn(
                    f"the checkpoint's rollout sampled ahead for step {step} is damaged ({damage}), so it is "
                    "dropped and sampled again: from there this run differs from an uninterrupted one"
                )
                dropped.append(step)
        missing = [s for s in expected if s not in state or s in dropped]
        if dropped:
            self.warn(
                f"the checkpoint holds rollouts sampled ahead for step(s) {', '.join(map(str, dropped))} that "
                f"this run does not take (more than trainer.max_staleness={self.k} ahead), so they "
                "are dropped and sampled again: from there this run differs from an uninterrupted one"
            )
        elif missing:
            self.warn(
                f"the checkpoint holds no rollouts sampled ahead for step(s) {', '.join(map(str, missing))}, "
                "so they are sampled with its weights (staleness 0): from there this run differs from an "
                "uninterrupted one"
            )
        self.worker.restore({s: r for s, r in state.items() if s in expected and s not in dropped})
        self.asked = max([self.first_step - 1, *self.worker.received])

    def close(self) -> None:
        self.worker.close()
        if self.evaluator is not None:
            self.evaluator.close()


def pushed_tensors(model, policy) -> list[torch.Tensor]:
    """What a push sends, in order: `model`'s tensors named as the policy's trainable parameters (the whole
    model, or a LoRA adapter), whole (an FSDP2 shard is gathered: every rank pushes at the same point)."""
    params = dict(unwrap(model).named_parameters())
    out = []
    for name, p in unwrap(policy).named_parameters():
        if p.requires_grad:
            t = params[name].detach()
            out.append(t.full_tensor() if hasattr(t, "full_tensor") else t)
    return out


STATE_FIELDS = ("prompts", "group_size", "completions", "pad_token_id", "version", "rewards", "answers", "extra")


def scored_state(scored: ScoredRollout) -> dict:
    """A scored rollout as plain types and CPU tensors: for a pipe, or a checkpoint's torch.load(weights_only)."""
    roll = scored.rollout
    out = {name: getattr(roll, name) for name in STATE_FIELDS}
    out.update(
        {
            k: None if getattr(roll, k) is None else getattr(roll, k).cpu()
            for k in ("tokens", *TOKEN_FIELDS, *ROW_FIELDS)
        }
    )
    out["episodes"] = (
        None
        if roll.episodes is None
        # a live environment stays where it ran
        else [{k: v for k, v in vars(e).items() if k != "environment"} for e in roll.episodes]
    )
    out.update(metrics=scored.metrics.state_dict(), gen_s=scored.gen_s, score_s=scored.score_s)
    return out


def stored_damage(state: dict, step: int, k: int, prompts: list | None = None, reference: bool = False) -> str | None:
    """What is wrong with a rollout a checkpoint holds for `step` (sampled at most `k` steps ahead), or None:
    its prompts must be the ones this run draws for the step (`prompts`, when known), its token fields must
    line up with its rows, its log-probs be finite, its weights' version in range; with `reference`, it must
    carry the KL reference's log-probs (this run's trainer holds no reference to score them)."""
    try:
        if prompts is not None and list(state["prompts"]) != prompts:
            return (
                f"it holds other prompts than this run draws for step {step} (were the data or trainer.seed changed?)"
            )
        if reference and state.get("ref_logp") is None:
            return "it carries no KL reference log-probs: it was written with generator.score_reference=false"
        tokens, lengths = state["tokens"], state["lengths"]
        rows = len(state["prompts"]) * state["group_size"]
        if tokens.dim() != 1 or lengths.shape != (rows,) or int(lengths.sum()) != tokens.numel():
            return f"{tokens.numel()} tokens in {tuple(lengths.shape)} rows for {rows} completions"
        for name in TOKEN_FIELDS:
            value = state.get(name)
            if value is not None and value.shape != tokens.shape:
                return f"{name} has shape {tuple(value.shape)}, not {tuple(tokens.shape)}"
            if value is not None and value.is_floating_point() and not bool(torch.isfinite(value).all()):
                return f"{name} is not finite"
        version = state["version"]
        if version is not None and not step - 1 - k <= int(version) <= step - 1:  # staleness 0..k
            return f"sampled with the weights of step {version}"
    except (KeyError, TypeError, AttributeError, ValueError) as e:
        return f"unreadable: {type(e).__name__} {e}"
    return None


def scored_from_state(state: dict, device) -> ScoredRollout:
    """The scored rollout, its token fields and metrics on `device` (rewards stay on the host, as sampled)."""
    rows: dict[str, Any] = {
        k: None if state[k] is None else state[k].to("cpu" if k.endswith("lengths") else device)
        for k in ("tokens", *TOKEN_FIELDS, *ROW_FIELDS)
    }
    episodes = None
    if state["episodes"] is not None:
        from grpo_cli.episodes.episode import Episode

        episodes = [Episode(**e) for e in state["episodes"]]
    roll = Rollout(**{k: state[k] for k in STATE_FIELDS}, **rows, episodes=episodes)
    return ScoredRollout(roll, StepMetrics.from_state(state["metrics"], device), state["gen_s"], state["score_s"])
