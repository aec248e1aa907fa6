"""What an episode acts on (docs/math.md, "Episodes"): the tools and environments `env.*` names, and
each environment call, with a deadline and its own seed (the tool calls in the model's text are read by
tool_formats.py).

Interfaces, as TRL 1.16's GRPOTrainer takes them, so the same code runs unchanged:
- `env.tools=[mod:fn,...]`: typed functions with Google-style docstrings; their JSON schemas
  (transformers' `get_json_schema`) reach the chat template's `tools=`.
- `env.factory=mod:Class`: one instance per episode; `reset(**row)` gets the dataset row's columns and
  returns None or text appended to the last user message; its public methods are tools; an optional
  `get_reward()` is one more reward term (weight 1, named after the class).
- a step environment: a class with `step(text) -> (observation, reward, done)` (games, simulators):
  each turn's text goes to `step`; the observation comes back as a user message; the step rewards add
  up to the class's reward term.
How it works in detail: docs/internals.md, grpo_cli/episodes/environments.py.
"""

from __future__ import annotations

import asyncio
import inspect
import itertools
import threading
import time
from collections.abc import Mapping
from contextlib import nullcontext
from typing import Any, Callable

from grpo_cli.config.declare import amended
from grpo_cli.episodes.kinds import ENV_KINDS, kind_of
from grpo_cli.episodes.rng import bound_globally, episode_generators, hand_generators, thread_generators
from grpo_cli.errors import GrpoError
from grpo_cli.procs.subprocesses import Helper, HelperLost


# ---- the environment a config names -----------------------------------------------------------------
def public_methods(cls) -> dict[str, Callable]:
    """The methods an environment exposes as tools (TRL's rule): public functions other than reset and
    get_reward (and step, which makes it a step environment)."""
    return {
        name: fn
        for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction)
        if not name.startswith("_") and name not in ("reset", "get_reward", "step")
    }


def tool_schema(fn: Callable, where: str) -> dict:
    """The tool's JSON schema as the chat template gets it, or one sentence on what its docstring lacks."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers raises its own DocstringParsingException / TypeHintParsingException
        raise GrpoError(
            f"{where} {fn.__name__!r} cannot be shown to the model as a tool ({e}); give it type hints "
            "and a Google-style docstring with an Args: section."
        ) from None


def environment(cfg, schemas: bool = True) -> "EnvSpec | EnvChoice | None":
    """The env group's tools and environment, loaded (None when single-turn); with env.workers, their
    instances and calls live in that many helper processes (episodes/worker.py). `schemas=False` skips the
    tools' JSON schemas (and transformers' import): an environment worker shows the model nothing."""
    if not (cfg.tools or cfg.factory):
        return None
    spec = (
        EnvChoice(cfg, cfg.fn_dir, schemas) if isinstance(cfg.factory, Mapping) else EnvSpec(cfg, cfg.fn_dir, schemas)
    )
    if getattr(cfg, "workers", 0):
        spec.workers = EnvWorkers(cfg, cfg.workers, cfg.worker_memory_gib)
    return spec


class EnvSpec:
    """What `env.*` names, loaded: standalone tools, the environment class, and their schemas."""

    workers: EnvWorkers | None = None  # with env.workers > 0

    def __init__(self, cfg, base: str | None = None, schemas: bool = True):
        from grpo_cli.registry import load_function

        thread_generators()  # before the environment's modules are imported, so their random functions follow
        self.cfg = cfg
        self.tools = [load_function(str(s), base, key="env.tools") for s in cfg.tools]
        self.factory = load_function(cfg.factory, base, key="env.factory") if cfg.factory else None
        cls = self.factory if inspect.isclass(self.factory) else None
        if self.factory is not None and cls is None:  # a factory function: look at what it makes
            cls = type(self.factory())
        self.kind = kind_of(cls)
        shows_tools = ENV_KINDS[self.kind].tools
        if cls is not None and self.kind == "tools" and not callable(getattr(cls, "reset", None)):
            raise GrpoError(
                f"env.factory={cfg.factory}: {cls.__name__} has no reset method; give it reset(self, **row) "
                "returning None or text for the prompt (TRL's environment_factory contract)."
            )
        self.cls = cls
        methods = public_methods(cls) if cls is not None and shows_tools else {}
        names = [f.__name__ for f in self.tools] + list(methods)
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:  # the model could call only one of them, and which one would depend on the order
            raise GrpoError(
                f"Two tools are named {twice[0]!r} (env.tools and env.factory's methods); rename one, "
                "since the model calls a tool by its name."
            )
        self.schemas = (
            (
                [tool_schema(f, "env.tools function") for f in self.tools]
                + [tool_schema(f, f"env.factory {getattr(cls, '__name__', '')} method") for f in methods.values()]
            )
            if schemas
            else []
        )
        self.shared_draws = bound_globally(
            [*self.tools, self.factory]
        )  # names that would make concurrency unrepeatable
        self.reward_name = (
            cls.__name__ if cls is not None and (self.kind != "tools" or hasattr(cls, "get_reward")) else None
        )

    def score_with(self, reward) -> None:
        """An environment with get_reward(), or a step environment, adds its reward to `reward` as a term."""
        if self.reward_name and hasattr(reward, "add_environment_term"):
            reward.add_environment_term(self.reward_name, getattr(self.cls, "max_reward", 1.0))

    def new(self, row: dict | None = None, rng_seed: int | None = None):
        """An episode's environment (None with tools alone), given its own generators (hand_generators);
        with workers, a RemoteEnvironment whatever the factory (the calls run where it lives)."""
        if self.workers is not None:
            return self.workers.new(row or {}, rng_seed, self.cls)
        instance = self.factory() if self.factory is not None else None
        if rng_seed is not None:
            hand_generators(instance, rng_seed)
        return instance

    def schemas_for(self, row: dict) -> list[dict]:
        """The tools' JSON schemas a row's prompt shows."""
        return self.schemas

    def tools_of(self, instance) -> dict[str, Callable]:
        if isinstance(instance, RemoteEnvironment):
            cls = instance.remote_class if ENV_KINDS[self.kind].tools else None
            return {
                name: RemoteMethod(instance, name)
                for name in [f.__name__ for f in self.tools] + (list(public_methods(cls)) if cls is not None else [])
            }
        tools = {f.__name__: f for f in self.tools}
        if instance is not None and ENV_KINDS[self.kind].tools:
            tools.update({name: getattr(instance, name) for name in public_methods(type(instance))})
        return tools


ENVIRONMENT_COLUMN = "environment"  # the column that names each row's environment, with several (TRL's field)


class EnvChoice:
    """env.factory as a dict {name: factory} (TRL's dict of environment factories): each row's
    `environment` column names its environment, whose instance the episode gets and whose tools alone its
    prompt shows; each environment class that scores is its own reward term, scoring its episodes only."""

    workers: EnvWorkers | None = None  # with env.workers > 0

    def __init__(self, cfg, base: str | None = None, schemas: bool = True):
        def one(spec):
            return EnvSpec(amended(cfg, factory=spec), base, schemas)

        if not cfg.factory:
            raise GrpoError(
                "env.factory is an empty dict; name at least one environment: env.factory={name:mod.Class}."
            )
        self.cfg, self.named = cfg, {str(k): one(v) for k, v in cfg.factory.items()}
        kinds = {s.kind for s in self.named.values()}
        if len(kinds) > 1:
            raise GrpoError(
                "env.factory mixes step environments and tool-calling ones; a run's environments take "
                "turns the same way: make them all one kind."
            )
        self.kind = kinds.pop()
        first = next(iter(self.named.values()))
        self.tools, self.cls = first.tools, None
        self.schemas = list({s["function"]["name"]: s for spec in self.named.values() for s in spec.schemas}.values())
        self.shared_draws = sorted({name for spec in self.named.values() for name in spec.shared_draws})
        scoring = {spec.cls: spec for spec in self.named.values() if spec.reward_name}  # a class under two names: once
        self.reward_name = ", ".join(spec.reward_name for spec in scoring.values()) or None
        self._scoring = list(scoring.values())

    def of(self, row: dict) -> EnvSpec:
        name = row.get(ENVIRONMENT_COLUMN)
        if name not in self.named:
            raise GrpoError(
                f"A row's {ENVIRONMENT_COLUMN!r} is {name!r}, not one of env.factory's {list(self.named)}; "
                f"give every row an {ENVIRONMENT_COLUMN!r} column naming its environment."
            )
        return self.named[name]

    def new(self, row: dict | None = None, rng_seed: int | None = None):
        spec = self.of(row or {})
        return spec.new(row, rng_seed) if self.workers is None else self.workers.new(row or {}, rng_seed, spec.cls)

    def schemas_for(self, row: dict) -> list[dict]:
        return self.of(row).schemas

    def tools_of(self, instance) -> dict[str, Callable]:
        return next(iter(self.named.values())).tools_of(instance)  # the standalone tools and the instance's methods

    def score_with(self, reward) -> None:
        for spec in self._scoring:
            reward.add_environment_term(spec.reward_name, getattr(spec.cls, "max_reward", 1.0), only=spec.cls)


# ---- calls with a deadline --------------------------------------------------------------------------
class Timeout(Exception):
    pass


class RemoteEnvironment:
    """An episode's environment living in an environment worker (episodes/worker.py): the methods of
    `remote_class` (None with tools alone), each call made there."""

    def __init__(self, workers, slot: int, life: int, handle: int, cls):
        self.workers, self.slot, self.life, self.handle, self.remote_class = workers, slot, life, handle, cls

    def __getattr__(self, name: str):
        if name.startswith("_") or not callable(getattr(self.remote_class, name, None)):
            raise AttributeError(name)
        return RemoteMethod(self, name)


class RemoteMethod:
    """One method (or standalone tool) of a RemoteEnvironment. Calling it directly (get_reward(), from the
    reward term) has env.timeout_s and no seed."""

    def __init__(self, env: RemoteEnvironment, name: str):
        self.env, self.__name__ = env, name

    def remote_call(self, args: tuple, kwargs: dict, timeout: float, seed: int | None):
        return self.env.workers.call(self.env, self.__name__, args, kwargs, timeout, seed)

    def __call__(self, *args, **kwargs):
        return self.remote_call(args, kwargs, self.env.workers.timeout_s, None)


# ---- environment workers (env.workers: episodes/worker.py is their end) -------------------------------------
GRACE_S = 5.0  # past a call's own deadline, how long a worker may take to say it timed out before it is killed


class EnvWorkerLost(HelperLost):
    """An environment worker is gone or did not answer in time."""


class EnvWorkers:
    """N environment workers, started when first needed; instances are spread over them in turn."""

    def __init__(self, cfg, count: int, memory_gib: float):
        from omegaconf import OmegaConf

        settings: Any = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(vars(cfg))
        self.settings = ({**settings, "workers": 0}, memory_gib)
        self.confined = settings.get("sandbox") == "os"  # sandbox/env.py: read as plain data, output unshown
        if self.confined:
            from grpo_cli.sandbox.scratch import sweep_stale

            sweep_stale()  # the scratch directories of workers killed with an earlier run
        self.timeout_s = float(cfg.timeout_s)
        self.helpers: list[Helper | None] = [None] * count
        self.locks = [threading.Lock() for _ in range(count)]
        self.lives = [0] * count  # how many workers each slot has started: an instance belongs to one life
        self.ended: dict[tuple[int, int], str] = {}  # (slot, life) -> how that worker ended
        self.handles = itertools.count()

    def _helper(self, slot: int) -> Helper:
        helper = self.helpers[slot]
        if helper is None or not helper.alive():
            self.lives[slot] += 1
            helper = Helper(
                "grpo_cli.episodes.worker",
                self.settings,
                name=f"environment worker {slot}",
                lost=EnvWorkerLost,
                timeout_key="env.timeout_s",
                plain=self.confined,
            )
            helper.receive(120, "starting (importing the environment)")
            self.helpers[slot] = helper
        return helper

    def new(self, row: dict, rng_seed: int | None, cls) -> "RemoteEnvironment":
        handle = next(self.handles)
        slot = handle % len(self.helpers)
        with self.locks[slot]:
            helper = self._helper(slot)
            helper.send(("new", handle, row, rng_seed))
            helper.receive(self.timeout_s + GRACE_S, "making an environment")
            return RemoteEnvironment(self, slot, self.lives[slot], handle, cls)

    def call(self, env: RemoteEnvironment, name: str, args: tuple, kwargs: dict, timeout: float, seed: int | None):
        """The method's value; raises Timeout, or RuntimeError with what went wrong (the model reads it). A
        call past its deadline whose worker does not answer either (stuck in native code) has the worker
        killed. Standalone tools (an episode with no environment instance) run on whichever life of the
        slot is up."""
        with self.locks[env.slot]:
            helper = self._helper(env.slot) if env.remote_class is None else self.helpers[env.slot]
            gone = None if env.remote_class is None else self.ended.get((env.slot, env.life))
            if (
                gone is None
                and env.remote_class is not None
                and (helper is None or self.lives[env.slot] != env.life or not helper.alive())
            ):
                gone = "ended"
            if gone is not None or helper is None:
                raise RuntimeError(f"this episode's environment is gone: its process {gone}")
            start = time.perf_counter()
            try:
                helper.send(("call", env.handle, name, args, kwargs, seed, timeout))
                kind, value = helper.receive(timeout + GRACE_S, f"running {name}")
            except EnvWorkerLost as e:
                how = str(e).removeprefix(f"{helper.name} ")
                self.ended[(env.slot, self.lives[env.slot])] = how
                helper.kill()  # reaped: the slot's next use starts a fresh worker
                self.helpers[env.slot] = None
                if time.perf_counter() - start >= timeout + GRACE_S:
                    raise Timeout(
                        f"timed out after {timeout:g} s (its process did not answer and was stopped)"
                    ) from None
                raise RuntimeError(f"the environment's process {how}") from None
        if kind == "timeout":
            raise Timeout(value)
        if kind == "raised":
            raise RuntimeError(value)
        return value

    def release(self) -> None:
        """Drop the last step's instances (their episodes are scored)."""
        for slot, helper in enumerate(self.helpers):
            if helper is not None and helper.alive():
                with self.locks[slot]:
                    helper.send(("drop",))

    def close(self) -> None:
        for helper in self.helpers:
            if helper is not None:
                helper.close(grace_s=2.0)
        self.helpers = [None] * len(self.helpers)
        if self.confined:
            from grpo_cli.sandbox.scratch import sweep_stale

            sweep_stale()  # a worker killed (a deadline, a forged message) could not remove its scratch directory


def call_with_timeout(fn: Callable, args: tuple, kwargs: dict, timeout: float, seed: int | None = None):
    """fn(*args, **kwargs) on a daemon thread (an async fn run to completion there), its random draws from
    generators seeded with `seed` (episode_generators), waited for `timeout` seconds: its result, or it
    raises what fn raised, or Timeout (the thread is left to finish on its own: Python cannot stop it)."""
    box: dict[str, Any] = {}

    def target():
        try:
            with episode_generators(seed) if seed is not None else nullcontext():
                value = fn(*args, **kwargs)
                box["value"] = asyncio.run(value) if inspect.iscoroutine(value) else value  # TRL's async tools
        except SystemExit as e:  # a tool must not end the run: it is an error the model reads
            box["error"] = RuntimeError(f"called sys.exit({e.code!r})")
        except Exception as e:  # handed back to the caller, which decides
            box["error"] = e

    thread = threading.Thread(target=target, daemon=True, name=f"grpo-env-{getattr(fn, '__name__', 'call')}")
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise Timeout(f"timed out after {timeout:g} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


def reset_arguments(row: dict) -> dict:
    """What reset(**row) gets: the dataset row's columns, the prompt as the user wrote it (chat messages on
    conversational data, as TRL passes the example) rather than rendered by the chat template."""
    from grpo_cli.data.prompts import USER_PROMPT
    from grpo_cli.rewards import PROMPT_MESSAGES

    args = {k: v for k, v in row.items() if not k.startswith("_")}
    given = row.get(PROMPT_MESSAGES) or row.get(USER_PROMPT)
    if given is not None:
        args["prompt"] = given
    return args
