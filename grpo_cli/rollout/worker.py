"""The rollout stage in a process of its own, overlapped with training (`trainer.max_staleness`,
`generator.*`; docs/math.md, "Stale sampling").

The worker (`python -m grpo_cli.rollout.worker FD`, a subprocesses.Helper) is built from a small frozen
`WorkerSpec`, never the run's config: its own model copy on its own device (`generator.device`) and
threads (`generator.threads`), the run's generator, environment and reward, and the training split's
prompt order. It runs the whole chain of source.LocalSource: prompts, generation or episodes, rewards,
the dynamic-sampling filter and refill; it answers each request with a scored rollout tagged with the
version (the number of updates) of the weights that sampled it.

How it works in detail: docs/internals.md, grpo_cli/rollout/worker.py.
"""

from __future__ import annotations

import pickle
import time
from collections import deque
from contextlib import nullcontext
from dataclasses import dataclass, replace
from typing import Any

import torch

from grpo_cli.config import reference_in_worker
from grpo_cli.errors import GrpoError, SourceLost
from grpo_cli.generate.base import GENERATORS
from grpo_cli.procs.subprocesses import Channel, Helper, how_it_ended, serve
from grpo_cli.procs.transport import START_TIMEOUT_S, GlooTransport


class WorkerDied(SourceLost):
    """The generation worker is gone or stuck; the sentence says which and why."""


@dataclass(frozen=True)
class WorkerSpec:
    """What the worker builds itself from: plain settings, frozen."""

    model: Any  # config.ModelConfig: the policy's copy (or, for a frozen behaviour, the behaviour's weights)
    precision: str  # trainer.precision
    generator: Any  # config.GeneratorConfig
    chat_template: bool
    system_prompt: str | None
    reward: Any  # config.RewardConfig (its files found through reward.fn_dir)
    data: str  # data.name: what reward=auto stands for can depend on it
    env: Any  # config.EnvConfig (its files found through env.fn_dir)
    settings: Any  # step.StepSettings without its judge (built there, with the worker's reward)
    behaviour: str  # algo.behaviour: "current" (the policy), "frozen" or "lagged"
    seed: int
    device: str
    threads: int
    reference: bool = False  # score the KL reference here (config.reference_in_worker)
    plugins: tuple = ()  # cfg.plugins: imported before the generator's factory is unpickled

    @classmethod
    def of(cls, cfg, settings, device, threads: int) -> "WorkerSpec":
        model, behaviour = cfg.model, cfg.algo.behaviour
        if behaviour == "frozen":  # the behaviour's own weights, no adapter: nothing is pushed to it
            model = replace(model, path=cfg.algo.behaviour_path or model.path, lora=replace(model.lora, r=0))
        return cls(
            model=replace(model, device=str(device)),
            precision=cfg.trainer.precision,
            generator=cfg.generator,
            chat_template=cfg.data.chat_template,
            system_prompt=cfg.data.system_prompt,
            reward=cfg.reward,
            data=cfg.data.name,
            env=cfg.env,
            settings=replace(settings, judge=None),
            behaviour=behaviour,
            seed=cfg.trainer.seed,
            device=str(device),
            threads=threads,
            reference=reference_in_worker(cfg),
            plugins=tuple(cfg.plugins),
        )


class RolloutWorker:
    """The trainer's end: `request(step)` asks for a step's scored rollout, `take(step)` waits for it,
    `push(tensors, version)` sends weights."""

    def __init__(self, spec: WorkerSpec, tokenizer, prompts, device: torch.device, timeout_s: float):
        try:  # the generator's factory, by reference: one registered in this process (register_generator) too
            factory = pickle.dumps(GENERATORS[spec.generator.name].factory)
        except Exception as e:  # a lambda or a local class: the worker cannot import it
            raise GrpoError(
                f"generator.name={spec.generator.name} is registered with a factory the generation worker "
                f"cannot import ({type(e).__name__}: {e}); register a module-level class or function, or "
                "a 'module:attribute' string, or set trainer.max_staleness=0 and generator.worker=false."
            ) from None
        self.device, self.timeout_s = device, timeout_s
        self.transport = GlooTransport(timeout_s)
        self.helper = Helper(
            "grpo_cli.rollout.worker",
            (spec, tokenizer, prompts, factory, self.transport.address),
            name="the generation worker",
            lost=WorkerDied,
            timeout_key="generator.timeout_s",
        )
        self.ready: list | None = None  # the shapes of the worker's trainable tensors, once it has loaded its model
        self.requested: deque[int] = deque()  # steps asked for and not yet answered, in order
        self.received: dict[int, dict] = {}  # step -> scored rollout (as plain types), not yet trained on
        self.scores: dict | None = None  # the answer to an evaluate request

    def _take(self, doing: str, timeout: float | None = None) -> None:
        kind, *body = self.helper.receive(self.timeout_s if timeout is None else timeout, doing)
        if kind == "ready":
            self.ready = body[0]
        elif kind == "scores":
            self.scores = body[0]
        elif kind == "scored":
            step, state = body
            if step != self.requested[0]:
                raise RuntimeError(f"the generation worker answered step {step}, expected {self.requested[0]}")
            self.requested.popleft()
            self.received[step] = state

    def push(self, tensors: list[torch.Tensor], version: int) -> float:
        """Send `tensors` (the trainable ones, in the worker's order) as `version`, once the worker has
        answered every request (it reads messages in order, so it then waits for this one). Returns the
        seconds spent waiting for those answers, before the push itself."""
        start = time.perf_counter()
        self._started()
        while self.requested:
            self._take(f"sampling step {self.requested[0]}")
        waited = time.perf_counter() - start
        layout = [(tuple(t.shape), t.dtype) for t in tensors]
        if [shape for shape, _ in layout] != self.ready:
            raise RuntimeError(
                "the generation worker's trainable parameters differ from the trainer's: "
                f"{len(self.ready or [])} against {len(tensors)}"
            )
        self.helper.send(("weights", version, layout))
        try:
            self.transport.send(tensors)
        except RuntimeError as e:
            hung = self.helper.alive()
            if hung and not any(word in str(e).lower() for word in ("timed out", "timeout")):
                raise
            self.helper.process.kill()
            why = f"did not answer within {self.timeout_s:g} s" if hung else how_it_ended(self.helper.process)
            raise WorkerDied(
                f"the generation worker {why} while taking the weights of update {version}"
                + (" (generator.timeout_s)" if hung else "")
            ) from None
        return waited

    def _started(self) -> None:
        """Wait for the worker to load its model (it may take longer than one answer's deadline)."""
        while self.ready is None:
            self._take("loading its model", START_TIMEOUT_S)

    def evaluate(self, part: dict, settings, first: int) -> dict:
        """Held-out scores of `part` with the weights last pushed (held_out.part_scores, run there)."""
        self._started()
        self.helper.send(("evaluate", part, settings, first))
        self.scores = None
        while self.scores is None:
            self._take("scoring the held-out prompts")
        return self.scores

    def request(self, step: int) -> None:
        self.helper.send(("sample", step))
        self.requested.append(step)

    def take(self, step: int) -> dict:
        """Step `step`'s scored rollout, as plain types (ahead.scored_from_state)."""
        self._started()
        while step not in self.received:
            self._take(f"sampling step {self.requested[0] if self.requested else step}")
        return self.received.pop(step)

    def state(self) -> dict:
        """The scored rollouts received and not yet trained on, by step (for a checkpoint)."""
        return dict(self.received)

    def restore(self, state: dict) -> None:
        self.received = {int(step): s for step, s in state.items()}

    def close(self) -> None:
        """End the worker: its pipe closes, it exits; one that does not is killed."""
        self.helper.close()
        self.transport.close()


def worker_device(generator, trainer_device: torch.device, rank: int) -> torch.device:
    """generator.device: null = the trainer's; a CUDA device cuda:N gives local rank r's worker cuda:N+r (under
    torchrun, `generator.device=cuda:2` on 2 ranks puts the workers on GPUs 2 and 3)."""
    from grpo_cli.models.loading import resolve_device

    if not generator.device:
        return trainer_device
    device = resolve_device(str(generator.device), key="generator.device")
    if device.type != "cuda" or not rank:
        return device
    index = (device.index or 0) + rank
    if index >= torch.cuda.device_count():
        raise GrpoError(
            f"generator.device={generator.device} puts local rank {rank}'s worker on cuda:{index}, which "
            f"this machine does not have ({torch.cuda.device_count()} GPUs); choose a lower first device."
        )
    return torch.device("cuda", index)


# --- the worker's end ---


def _sampler(spec: WorkerSpec):
    """The worker's model and the tensors a push fills, in the trainer's order."""
    from grpo_cli.models.loading import load_model, resolve_device
    from grpo_cli.models.policies import load_policy
    from grpo_cli.models.precision import training_precision
    from grpo_cli.models.runtime import prepare_process

    device = resolve_device(spec.device, key="generator.device")
    if device.type == "cuda" and device.index is not None:  # plain "cuda" is the current device (set_device refuses it)
        torch.cuda.set_device(device)
    prepare_process(spec.threads, device)
    precision, _ = training_precision(spec.precision, device)
    m = spec.model
    if spec.behaviour == "frozen":  # stored as the trainer stores a frozen model: in the compute dtype
        model = load_model(m.path, precision.frozen_dtype, m.device, m.trust_remote_code, key="algo.behaviour_path")
    else:
        model = load_policy(m, precision)
    trainable = [p for p in model.parameters() if p.requires_grad]  # what the trainer trains, in its order
    model.requires_grad_(False)
    return model, trainable, precision, device


def _reference(spec: WorkerSpec, model, precision):
    """A context yielding the KL reference (models.policies.Policies, as the trainer would hold it): the
    model's base with its adapter off under LoRA, else a frozen copy of the initial weights; None when the
    trainer scores it."""
    from grpo_cli.models.lora import adapter_disabled
    from grpo_cli.models.policies import frozen_model

    if not spec.reference:
        return None
    if spec.model.lora.r:
        return lambda: adapter_disabled(model)
    reference = frozen_model(spec.model, precision)
    return lambda: nullcontext(reference)


def _chain(spec: WorkerSpec, model, tokenizer, prompts, precision, device):
    """The rollout chain of this process: source.LocalSource with the run's generator, environment and reward."""
    from grpo_cli.episodes import environment, with_env
    from grpo_cli.generate.base import make_generator
    from grpo_cli.models.policies import Policies
    from grpo_cli.rewards import Judge, reward_with
    from grpo_cli.rollout.source import LocalSource

    env = environment(spec.env)
    reward_fn = reward_with(spec.reward, env, spec.data)  # an environment that scores episodes is one more reward term
    generator = with_env(
        make_generator(
            spec.generator,
            tokenizer,
            chat_template=spec.chat_template,
            precision=precision,
            device=device,
            seed=spec.seed,
        ),
        env,
        tokenizer,
        chat_template=spec.chat_template,
        system_prompt=spec.system_prompt,
    )
    settings = replace(spec.settings, judge=Judge(spec.reward, reward_fn))
    return LocalSource(generator, Policies(model), reward_fn, settings, precision=precision, prompts=prompts)


def _serve(channel: Channel, opening) -> None:
    """Build the model and the chain, say ready (with the shapes a push fills), then answer messages in
    order: ("weights", version, layout) takes a push; ("sample", step) runs the chain for that step with
    the weights held and answers ("scored", step, state); ("evaluate", part, settings, first) scores
    held-out prompts and answers ("scores", scores)."""
    from grpo_cli.models.runtime import prepare_libraries

    prepare_libraries()  # as the trainer's job does, before the model classes are imported
    from grpo_cli.models.forward import score
    from grpo_cli.rollout.ahead import scored_state
    from grpo_cli.samples.metrics import clock

    spec, tokenizer, prompts, factory, address = opening
    from grpo_cli.generate.base import register_generator
    from grpo_cli.registry import import_plugin

    for plugin in spec.plugins:
        import_plugin(plugin)

    register_generator(
        spec.generator.name, pickle.loads(factory), settings=type(spec.generator)
    )  # on the trainer's sys.path
    model, trainable, precision, device = _sampler(spec)
    reference = _reference(spec, model, precision)
    chain = _chain(spec, model, tokenizer, prompts, precision, device)
    settings, generator = chain.settings, chain.generator
    # The decoder's own log-probs are the sampler's exactly (up to rounding) only for the built-in decoder in
    # float32 over the whole distribution (no top-k/top-p); otherwise a stale policy's are recomputed as the
    # trainer would, in the training precision.
    own = not generator.returns_logprobs and precision.name == "fp32" and not settings.sampling.truncates
    channel.send(("ready", [tuple(p.shape) for p in trainable]))
    transport, version = GlooTransport(spec.generator.timeout_s, address=address), None
    try:
        while (message := channel.receive()) is not None:
            if message[0] == "weights":
                _, version, layout = message
                transport.receive(trainable, layout)
                if generator.needs_weights:
                    generator.update(model)
                continue
            if message[0] == "evaluate":
                with torch.no_grad():
                    channel.send(("scores", chain.evaluate(*message[1:])))
                continue
            step = message[1]
            stale = spec.behaviour == "current" and version is not None and step - 1 - version > 0
            chain.sampler_logprobs = True if stale and own else None
            with torch.no_grad():
                scored = chain.next(step)
                roll, start = scored.rollout, clock(device)
                if spec.behaviour != "current" or (stale and not own):
                    roll.behaviour_logp = score(model, roll, settings.sampling.temperature, settings, precision)
                elif stale:
                    roll.behaviour_logp = roll.sampler_logp
                    if not chain.wants_sampler_logprobs():
                        roll.sampler_logp = None
                if reference is not None:
                    with reference() as ref:
                        roll.ref_logp = score(ref, roll, settings.sampling.temperature, settings, precision)
                scored.score_s += clock(device) - start
            roll.version = version
            channel.send(("scored", step, scored_state(scored)))
    finally:
        transport.close()


if __name__ == "__main__":
    serve(_serve)
