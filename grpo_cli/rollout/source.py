"""The rollout stage's one door (docs/math.md, "The algorithm", steps 1-2). A rollout source hands the
loop a `ScoredRollout` per step: prompts -> generation or episodes -> rewards -> the dynamic-sampling
filter and refill -> rewards ready for the group advantages, with the behaviour's log-probabilities
when the weights that sampled are not the policy's. The step (step.py) never sees a generator, and the
loop never knows where sampling happens:

- `LocalSource`: in this process, with the run's generator and, off-policy, its behaviour policy;
- `WorkerSource`: generation in a worker process (rollout_worker.py) up to `trainer.max_staleness`
  steps ahead, with pushed, versioned weights (docs/math.md, "Stale sampling").

Both have `next(step)`, `update(policy, version)` (after each optimizer step: take the new weights;
returns the metrics of doing so), `evaluate(part, settings, first)` (held-out scores under the policy,
held_out.py), `state_dict()` / `load_state_dict()` (the rollouts in flight) and `close()`. A source that cannot sample any more raises `SourceLost` (errors.py); the run then saves the
last finished step and stops with that sentence.

On resume, rollouts in flight that this run's settings would not have sampled ahead (a checkpoint
written at a larger `trainer.max_staleness`) are dropped with a warning naming their steps, and those
steps are sampled with the checkpoint's weights: the run says where it leaves the uninterrupted one.
"""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, Protocol

import torch
from torch.profiler import record_function

from grpo_cli.data.tasks import PromptBatch
from grpo_cli.models.distributed import SINGLE, Dist, unwrap
from grpo_cli.errors import SourceLost
from grpo_cli.generate.base import generate
from grpo_cli.rollout.held_out import part_scores
from grpo_cli.samples.metrics import StepMetrics
from grpo_cli.algo.objective import flat_groups
from grpo_cli.models.precision import Precision
from grpo_cli.rewards import score_batch
from grpo_cli.samples.rollout import ROW_FIELDS, TOKEN_FIELDS, Rollout, concat_rollouts
from grpo_cli.models.forward import score
from grpo_cli.models.policies import Policies
from grpo_cli.samples.metrics import PHASES, clock
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


def wants_sampler_logprobs(generator, algo) -> bool:
    """Whether a rollout carries the sampler's own log-probs: the generator returns them anyway, or the
    sampler correction (TIS) weighs them."""
    return generator.returns_logprobs or algo.sampler_correction == "tis"


class LocalSource:
    """SamplerConfig and scoring in this process: `sample(batch, refill)` for any batch, `next(step)` for the
    run's (`prompts`: data.PromptOrder)."""

    def __init__(self, generator, policies: Policies, reward_fn, settings: StepSettings, *,
                 precision: Precision | None = None, dist: Dist = SINGLE, prompts=None, warn: Callable = print):
        self.generator, self.policies, self.reward_fn, self.settings = generator, policies, reward_fn, settings
        self.precision, self.dist, self.prompts, self.warn = precision or Precision("fp32"), dist, prompts, warn
        self.device = next(policies.policy.parameters()).device
        self.sampler_logprobs: bool | None = None  # ask the generator for its own log-probs anyway (True), or as the run needs them

    def wants_sampler_logprobs(self) -> bool:
        return wants_sampler_logprobs(self.generator, self.settings.algo)

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
                    roll, answers, metrics = collect(self.generator, generating, batch, self.reward_fn, self.settings,
                                                     refill, StepMetrics(self.device), dist,
                                                     with_logprobs=self.sampler_logprobs or self.wants_sampler_logprobs())
                self.generator.sleep()  # a vLLM engine frees its device memory while the update runs (CUDA)
            t_gen = clock(self.device)
            if policies.behaviour is not None:
                with record_function(PHASES[1]):
                    roll.behaviour_logp = score(sampler_model, roll, self.settings.sampling.temperature,
                                                self.settings, self.precision, dist)
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
            self.warn(f"the checkpoint holds rollouts sampled ahead for step(s) {', '.join(map(str, sorted(state)))} "
                      "(it was written with trainer.max_staleness > 0); this run samples on-policy, so they are "
                      "dropped and sampled again with the checkpoint's weights: from there it differs from an "
                      "uninterrupted run")

    def close(self) -> None:
        """The generator, with what it holds (an engine, environment workers): the run has finished with it."""
        self.generator.close()


class WorkerSource:
    """The whole chain in a worker process (rollout_worker.py), built from a frozen spec: step t trains on
    rollouts sampled by the weights of update max(t - 1 - max_staleness, 0). Requests run
    `max_staleness` steps ahead of the update. What the worker samples with: the policy, pushed after
    every update but the last; a frozen behaviour, loaded there once; a lagged behaviour, pushed at the
    start and at each refresh."""

    def __init__(self, worker, policies: Policies, algo, *, max_staleness: int, first_step: int, last_step: int,
                 warn: Callable = print, evaluator: LocalSource | None = None, prompts=None, reference: bool = False):
        self.worker, self.policies, self.warn = worker, policies, warn
        self.reference = reference  # the worker scores the KL reference (config.reference_in_worker): rollouts carry it
        # the run's PromptOrder: what each step draws, to check a checkpoint's rollouts against (not under
        # dynamic sampling, whose refills draw more)
        self.prompts = None if algo.dynamic_sampling else prompts
        self.evaluator = evaluator  # held-out scoring in this process, when the worker samples a behaviour
        self.updated = self.pushed = None  # the last update the source was told of, and the last pushed
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
        if self.behaviour == "current":  # updates between the sampler and the policy
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
                self.warn(f"the checkpoint's rollout sampled ahead for step {step} is damaged ({damage}), so it is "
                          "dropped and sampled again: from there this run differs from an uninterrupted one")
                dropped.append(step)
        missing = [s for s in expected if s not in state or s in dropped]
        if dropped:
            self.warn(f"the checkpoint holds rollouts sampled ahead for step(s) {', '.join(map(str, dropped))} that "
                      f"this run does not take (more than trainer.max_staleness={self.k} ahead), so they "
                      "are dropped and sampled again: from there this run differs from an uninterrupted one")
        elif missing:
            self.warn(f"the checkpoint holds no rollouts sampled ahead for step(s) {', '.join(map(str, missing))}, "
                      "so they are sampled with its weights (staleness 0): from there this run differs from an "
                      "uninterrupted one")
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
    out.update({k: None if getattr(roll, k) is None else getattr(roll, k).cpu() for k in ("tokens", *TOKEN_FIELDS, *ROW_FIELDS)})
    out["episodes"] = (None if roll.episodes is None else  # a live environment stays where it ran
                       [{k: v for k, v in vars(e).items() if k != "environment"} for e in roll.episodes])
    out.update(metrics=scored.metrics.state_dict(), gen_s=scored.gen_s, score_s=scored.score_s)
    return out


def stored_damage(state: dict, step: int, k: int, prompts: list | None = None, reference: bool = False) -> str | None:
    """What is wrong with a rollout a checkpoint holds for `step` (sampled at most `k` steps ahead), or None:
    its prompts must be the ones this run draws for the step (`prompts`, when known), its token fields must
    line up with its rows, its log-probs be finite, its weights' version in range; with `reference`, it must
    carry the KL reference's log-probs (this run's trainer holds no reference to score them)."""
    try:
        if prompts is not None and list(state["prompts"]) != prompts:
            return f"it holds other prompts than this run draws for step {step} (were the data or trainer.seed changed?)"
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
    rows = {k: None if state[k] is None else state[k].to("cpu" if k.endswith("lengths") else device)
            for k in ("tokens", *TOKEN_FIELDS, *ROW_FIELDS)}
    episodes = None
    if state["episodes"] is not None:
        from grpo_cli.episodes.driver import Episode

        episodes = [Episode(**e) for e in state["episodes"]]
    roll = Rollout(**{k: state[k] for k in STATE_FIELDS}, **rows, episodes=episodes)
    return ScoredRollout(roll, StepMetrics.from_state(state["metrics"], device), state["gen_s"], state["score_s"])


def score_round(roll: Rollout, batch: PromptBatch, reward_fn, judge, metrics: StepMetrics):
    """One round's rewards ([n, G], float64, NaN = no score), each term's, and which groups are flat (all
    rewards equal: no signal), with the round's metrics:
    the rewards see each completion's token count and the batch's columns (one entry per prompt);
    accuracy is what `judge` (reward.correct) calls correct."""
    G = roll.group_size

    def per_completion(values):
        return [v for v in values for _ in range(G)]

    total, terms = score_batch(
        reward_fn, per_completion(batch.prompts), roll.completions, per_completion(batch.answers),
        completion_tokens=roll.sampled_tokens().tolist(), completion_ids=roll.completion_ids(),
        columns={k: per_completion(v) for k, v in batch.columns.items()}, episodes=roll.episodes,
    )
    if roll.episodes is not None:
        from grpo_cli.episodes.driver import episode_metrics

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


def collect(generator, sampler_model, batch: PromptBatch, reward_fn, settings: StepSettings, refill=None,
            metrics: StepMetrics | None = None, dist: Dist = SINGLE, with_logprobs: bool | None = None):
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
    G, n, sampling, algo = settings.sampling.group_size, len(batch.prompts), settings.sampling, settings.algo
    kept, kept_answers, kept_rewards, kept_terms, rounds = [], [], [], [], 0
    metrics = metrics if metrics is not None else StepMetrics()

    def have() -> int:
        return sum(len(r.prompts) for r in kept)

    while True:
        if have() < n:  # a rank whose share is full sits out the remaining rounds
            roll = generate(generator, sampler_model, batch.prompts, G, sampling, batch.seeds, columns=batch.columns,
                            with_logprobs=wants_sampler_logprobs(generator, algo) if with_logprobs is None else with_logprobs)
            rewards, terms, flat = score_round(roll, batch, reward_fn, settings.judge, metrics)
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
