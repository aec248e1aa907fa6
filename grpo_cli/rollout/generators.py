"""The generator protocol and registry (`generator.name`). Training, held-out evaluation, `grpo evaluate`
and `grpo sample` build a generator with `make_generator` and use it only through `Generator`; the
step asks capabilities (`returns_logprobs`, `needs_weights`), never names.

A backend written anywhere (a test module, a plugin) is one class with this shape, added with
`register_generator(name, factory)`; `generator.name=NAME` then trains, evaluates and samples with it.
Multi-turn episodes (env.tools, env.factory) also need `complete(model, contexts, sampling, seeds, *,
with_logprobs)`: one continuation of each context's token ids (HFGenerator.complete says what it returns).
Built-ins are named by import path and imported only when chosen, so this module imports no torch
and `checks.py` reads the names before anything heavy loads.
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Protocol, runtime_checkable

from grpo_cli.registry import load


@runtime_checkable
class Generator(Protocol):
    """G completions per prompt from a model, as a Rollout (update/batch.py)."""

    returns_logprobs: bool  # its rollouts carry the sampler's own log-probs (Rollout.sampler_logp)
    needs_weights: bool  # it samples from a copy of the weights: `update(model)` after every optimizer step

    def generate(self, model, prompts: list[str], group_size: int, sampling, seeds: list[int] | None = None, *,
                 with_logprobs: bool = False) -> Any:
        """`group_size` completions of each prompt; `seeds` (one per prompt) fix each group's noise."""

    def update(self, model) -> None:
        """Take the model's current weights (after an optimizer step)."""

    def sleep(self) -> None:
        """Free what the update needs while it runs (device memory of a second copy)."""

    def close(self) -> None:
        """Release everything; the generator is not used again."""


# factory(tokenizer, settings, *, chat_template, precision, device, world_size, seed) -> Generator;
# a "module:attribute" string is imported when first chosen. A factory may have `check_available()`,
# called before any model loads, that raises a GrpoError naming what to install.
GENERATORS: dict[str, Callable | str] = {
    "hf": "grpo_cli.rollout.generation:HFGenerator",
    "vllm": "grpo_cli.rollout.vllm_engine:VLLMGenerator",
}
_LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()


def register_generator(name: str, factory: Callable) -> None:
    """`generator.name=name` builds generators with `factory` (see GENERATORS)."""
    GENERATORS[name] = factory


def generator_factory(name: str) -> Callable:
    return load(GENERATORS[name])


def check_available(settings) -> None:
    """Fail with one sentence before any model loads when the generator's library is missing."""
    check = getattr(generator_factory(settings.name), "check_available", None)
    if check is not None:
        check()


def make_generator(settings, tokenizer, *, chat_template: bool, precision, device, world_size: int = 1,
                   seed: int = 0, env=None, system_prompt: str | None = None) -> Generator:
    """The generator the `generator` config group names; with `env` (an environments.EnvSpec), driven turn by
    turn through that environment (episodes.EpisodeGenerator)."""
    generator = generator_factory(settings.name)(tokenizer, settings, chat_template=chat_template, precision=precision,
                                                  device=device, world_size=world_size, seed=seed)
    if not isinstance(generator, Generator):  # the protocol's members, data ones included, are the one list
        raise TypeError(f"generator {settings.name!r} does not have every member of grpo_cli.rollout.generators.Generator.")
    _LIVE.add(generator)
    if env is not None:
        from grpo_cli.rollout.episodes import EpisodeGenerator

        return EpisodeGenerator(generator, env, tokenizer, chat_template=chat_template, system_prompt=system_prompt)
    return generator


def generate(generator, model, prompts: list[str], group_size: int, sampling, seeds: list[int] | None = None, *,
             columns: dict | None = None, **kwargs):
    """generator.generate, handing the prompts' dataset columns (one entry per prompt) to a generator that
    takes them (an environment's reset reads the row)."""
    if getattr(generator, "takes_columns", False):
        kwargs["columns"] = columns
    return generator.generate(model, prompts, group_size, sampling, seeds, **kwargs)


def close_all() -> None:
    """Close every generator of this process (before the process group goes: an engine that shares
    torch.distributed's default group must shut down while it is there)."""
    for generator in list(_LIVE):
        generator.close()
