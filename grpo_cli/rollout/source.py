"""The rollout stage's one door (docs/math.md, "The algorithm", steps 1-2). A rollout source hands the
loop a `ScoredRollout` per step: prompts -> generation or episodes -> rewards -> the dynamic-sampling
filter and refill -> rewards ready for the group advantages, with the behaviour's log-probabilities
when the weights that sampled are not the policy's. The step (step.py) never sees a generator, and the
loop never knows where sampling happens:

- `LocalSource`: in this process, with the run's generator and, off-policy, its behaviour policy;
- `WorkerSource` (ahead.py): generation in a worker process (rollout/worker.py) up to
  `trainer.max_staleness` steps ahead, with pushed, versioned weights (docs/math.md, "Stale sampling").

How it works in detail: docs/internals.md, grpo_cli/rollout/source.py.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch.profiler import record_function

from grpo_cli.algo.objective import flat_groups
from grpo_cli.data.tasks import PromptBatch
from grpo_cli.generate.base import generate
from grpo_cli.models.distributed import SINGLE, Dist
from grpo_cli.models.forward import score
from grpo_cli.models.policies import Policies
from grpo_cli.models.precision import Precision
from grpo_cli.rewards import score_batch
from grpo_cli.rollout.held_out import part_scores
from grpo_cli.samples.metrics import PHASES, StepMetrics, clock
from grpo_cli.samples.rollout import Rollout, concat_rollouts
from grpo_cli.samples.settings import StepSettings


@dataclass
class ScoredRollout:
    """One step's rollout, scored: `rollout.rewards` [n, G] and `rollout.answers` set, and
    `rollout.behaviour_logp` when the weights that sampled are not the policy's (a behaviour policy, or
    pushed weights older than the policy); `metrics` describe everything sampled this step."""

    rollout: Rollout
    metrics: StepMetrics
    gen_s: float  # sampling and rewards (waiting for a worker's answer included)
    score_s: float = 0.0  # the behaviour policy's log-probs, scored here


class RolloutSource(Protocol):
    def next(self, step: int) -> ScoredRollout: ...

    def update(self, policy, version: int) -> dict: ...

    def evaluate(self, part: dict, settings, first: int, model=None) -> dict: ...

    def evaluates_any_model(self) -> bool: ...

    def state_dict(self) -> dict: ...

    def load_state_dict(self, state: dict) -> None: ...

    def close(self) -> None: ...


def wants_sampler_logprobs(generator, settings: StepSettings) -> bool:
    """Whether a rollout carries the sampler's own log-probs: the generator returns them anyway, the sampler
    correction (TIS) weighs them, or top-k/top-p sampling draws from another distribution than the policy's."""
    return generator.returns_logprobs or settings.algo.sampler_correction == "tis" or settings.sampling.truncates


class LocalSource:
    """SamplerConfig and scoring in this process: `sample(batch, refill)` for any batch, `next(step)` for the
    run's (`prompts`: data.PromptOrder)."""

    def __init__(
        self,
        generator,
        policies: Policies,
        reward_fn,
        settings: StepSettings,
        *,
        precision: Precision | None = None,
        dist: Dist = SINGLE,
        prompts=None,
        warn: Callable = print,
    ):
        self.generator, self.policies, self.reward_fn, self.settings = generator, policies, reward_fn, settings
        self.precision, self.dist, self.prompts, self.warn = precision or Precision("fp32"), dist, prompts, warn
        self.device = next(policies.policy.parameters()).device
        self.sampler_logprobs: bool | None = (
            None  # ask the generator for its own log-probs anyway (True), or as the run needs them
        )

    def wants_sampler_logprobs(self) -> bool:
        return wants_sampler_logprobs(self.generator, self.settings)

    def next(self, step: int) -> ScoredRollout:
        return self.sample(self.prompts.share(step), self.prompts.refill(step))

    def sample(self, batch: PromptBatch, refill=None) -> ScoredRollout:
        """G completions per prompt from the sampling policy, scored; with a behaviour policy its
        log-probabilities in the training precision, the denominator of every ratio."""
        policies, dist = self.policies, self.dist
        t0 = clock(self.device)
        with (policies.behaviour or (lambda: nullcontext(policies.policy)))() as sampler_model:
            with record_function(PHASES[0]):
                with dist.full_model(sampler_model) as generating:  # unwrapped; under FSDP gathered once
                    roll, answers, metrics = collect(
                        self.generator,
                        generating,
                        batch,
                        self.reward_fn,
                        self.settings,
                        refill,
                        StepMetrics(self.device),
                        dist,
                        with_logprobs=self.sampler_logprobs or self.wants_sampler_logprobs(),
                    )
                self.generator.sleep()  # a vLLM engine frees its device memory while the update runs (CUDA)
            t_gen = clock(self.device)
            if policies.behaviour is not None:
                with record_function(PHASES[1]):
                    roll.behaviour_logp = score(
                        sampler_model, roll, self.settings.sampling.temperature, self.settings, self.precision, dist
                    )
        roll.answers = answers
        return ScoredRollout(roll, metrics, gen_s=t_gen - t0, score_s=clock(self.device) - t_gen)

    def evaluate(self, part: dict, settings, first: int, model=None) -> dict:
        """Held-out scores of `part` under the policy, or under `model` (the initial weights loaded again:
        held_out.HeldOut.initial), with this source's generator (held_out.part_scores)."""
        # every rank enters the policy's: FSDP gathers here
        with nullcontext(model) if model is not None else self.dist.full_model(self.policies.policy) as model:
            return part_scores(self.generator, model, part, self.reward_fn, self.settings.judge, settings, first)

    def evaluates_any_model(self) -> bool:
        """Whether `evaluate` can score weights other than the policy's: the generator reads the model it is
        given (hf), and one process holds the whole of it."""
        return not self.generator.needs_weights and self.dist.world_size == 1

    def update(self, policy, version: int) -> dict:
        """An engine that samples from its own copy of the weights takes the update (not a behaviour
        policy's run: the behaviour samples there)."""
        if not self.generator.needs_weights or self.policies.behaviour is not None:
            return {}
        start = time.perf_counter()
        with self.dist.full_model(policy) as full:
            self.generator.update(full)
        return {"push_s": time.perf_counter() - start}

    def state_dict(self) -> dict:
        return {}  # nothing is sampled ahead

    def load_state_dict(self, state: dict) -> None:
        if state:
            self.warn(
                f"the checkpoint holds rollouts sampled ahead for step(s) {', '.join(map(str, sorted(state)))} "
                "(it was written with trainer.max_staleness > 0); this run samples on-policy, so they are "
                "dropped and sampled again with the checkpoint's weights: from there it differs from an "
                "uninterrupted run"
            )

    def close(self) -> None:
        """The generator, with what it holds (an engine, environment workers): the run has finished with it."""
        self.generator.close()


def score_round(roll: Rollout, batch: PromptBatch, reward_fn, judge, metrics: StepMetrics):
    """One round's rewards ([n, G], float64, NaN = no score), each term's, and which groups are flat (all
    rewards equal: no signal), with the round's metrics:
    the rewards see each completion's token count and the batch's columns (one entry per prompt);
    accuracy is what `judge` (reward.correct) calls correct."""
    G = roll.group_size

    def per_completion(values):
        return [v for v in values for _ in range(G)]

    total, terms = score_batch(
        reward_fn,
        per_completion(batch.prompts),
        roll.completions,
        per_completion(batch.answers),
        completion_tokens=roll.sampled_tokens().tolist(),
        completion_ids=roll.completion_ids(),
        columns={k: per_completion(v) for k, v in batch.columns.items()},
        episodes=roll.episodes,
    )
    if roll.episodes is not None:
        from grpo_cli.episodes.episode import episode_metrics

        episode_metrics(roll.episodes, metrics)
    rewards = torch.tensor(total, dtype=torch.float64).view(len(batch.prompts), G)  # NaN: no score
    terms = {k: torch.tensor(v).view(rewards.shape) for k, v in terms.items()}  # [n, G] each
    correct = judge(total, roll.completions, per_completion(batch.answers))
    scored, flat = ~rewards.isnan(), flat_groups(rewards)
    metrics.mean("reward_mean", rewards.nansum(), scored.sum())  # over the scored completions, as TRL
    metrics.mean("reward_sq", rewards.pow(2).nansum(), scored.sum())  # for the std, over ranks too
    metrics.mean("reward_none_frac", (~scored).sum(), rewards.numel())  # no score: advantage 0
    metrics.mean("reward_failed_frac", len(getattr(reward_fn, "failed", ())), rewards.numel())  # workers'
    metrics.mean("accuracy", sum(correct), len(correct))
    metrics.mean("zero_var_frac", flat.sum(), rewards.shape[0])
    for k, v in terms.items():
        metrics.mean(f"reward/{k}", v.double().nansum(), (~v.isnan()).sum())
    return rewards, terms, flat


def sample_round(
    generator, sampler_model, batch: PromptBatch, reward_fn, settings: StepSettings, metrics, with_logprobs
):
    """One round: G completions of each of the batch's prompts, scored: (rollout, rewards, terms, flat groups)."""
    if with_logprobs is None:
        with_logprobs = wants_sampler_logprobs(generator, settings)
    sampling = settings.sampling
    roll = generate(
        generator,
        sampler_model,
        batch.prompts,
        sampling.group_size,
        sampling,
        batch.seeds,
        columns=batch.columns,
        with_logprobs=with_logprobs,
    )
    return (roll, *score_round(roll, batch, reward_fn, settings.judge, metrics))


def collect(
    generator,
    sampler_model,
    batch: PromptBatch,
    reward_fn,
    settings: StepSettings,
    refill=None,
    metrics: StepMetrics | None = None,
    dist: Dist = SINGLE,
    with_logprobs: bool | None = None,
):
    """Sample G completions per prompt and score them: (rollout to train on, its answers, step metrics).

    The metrics describe everything sampled this step (all refill rounds), not only the groups kept
    for training: under dynamic sampling the kept groups are mixed by construction, and their mean
    reward says nothing about how good the policy is.

    The rewards see each completion's token count and the batch's columns (dataset columns by name,
    one entry per prompt); each term's values go to roll.extra["reward_terms"] for logging.
    With algo.dynamic_sampling (DAPO), groups whose rewards are all equal carry no signal and are
    dropped; `refill(round)` supplies another PromptBatch until the batch is full again or
    algo.max_refill_rounds is spent, and the step trains on the groups it has. Under data parallelism
    the quota is global: rounds go on until every rank's share is full (a full rank idles), and each
    rank's kept groups are topped up with zero-weight padding groups, so all run the same micro-batches.
    """
    G, n, algo = settings.sampling.group_size, len(batch.prompts), settings.algo
    kept: list[Rollout] = []
    kept_answers, kept_rewards, kept_terms, rounds = [], [], [], 0
    metrics = metrics if metrics is not None else StepMetrics()

    def have() -> int:
        return sum(len(r.prompts) for r in kept)

    while True:
        if have() < n:  # a rank whose share is full sits out the remaining rounds
            roll, rewards, terms, flat = sample_round(
                generator, sampler_model, batch, reward_fn, settings, metrics, with_logprobs
            )
            if not algo.dynamic_sampling:
                roll.rewards, roll.extra["reward_terms"] = rewards, terms  # float64: logs show the rewards given
                metrics.mean("dropped_frac", 0.0, rewards.shape[0])
                return roll, list(batch.answers), metrics
            groups = (~flat).nonzero().flatten().tolist()[: n - have()]
            metrics.mean("dropped_frac", rewards.shape[0] - len(groups), rewards.shape[0])
            if groups:
                kept.append(roll.select_groups(groups))
                kept_answers += [batch.answers[g] for g in groups]
                kept_rewards.append(rewards[groups])
                kept_terms.append({k: v[groups] for k, v in terms.items()})
            last, last_terms, last_answers = roll, terms, list(batch.answers)
        missing = float(dist.all_sum(torch.tensor([float(n - have())]))[0])  # the global quota
        if missing <= 0 or refill is None or rounds >= algo.max_refill_rounds:
            break
        rounds += 1
        batch = refill(rounds)
    # Top up with zero-weight groups: under data parallelism every rank then runs the same micro-batches,
    # and with nothing kept at all there is still a batch (whose loss is zero).
    short = n - have() if dist.world_size > 1 else (n if not kept else 0)
    if short:
        pad = last.select_groups([0] * short)
        pad.weight = torch.zeros(short * G, device=pad.tokens.device)
        kept.append(pad)
        kept_answers += [last_answers[0]] * short
        kept_rewards.append(torch.zeros(short, G, dtype=torch.float64))
        kept_terms.append({k: torch.zeros(short, G, dtype=v.dtype) for k, v in last_terms.items()})
    roll = concat_rollouts(kept)
    roll.rewards = torch.cat(kept_rewards)
    roll.extra["reward_terms"] = {k: torch.cat([t[k] for t in kept_terms]) for k in last_terms}
    return roll, kept_answers, metrics
