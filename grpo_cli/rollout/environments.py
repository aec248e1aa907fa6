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

Nothing an environment does stops the run: a tool that raises, an unknown tool or a malformed call
becomes the tool message `{'error': ...}` (TRL's wording); every call and step has `env.timeout_s`
seconds (a call past it is abandoned on its thread, which Python cannot kill, and the model is told
it timed out); a list of content parts is kept as parts (TRL's rule), any other non-string result is
`str()`-ed. Each is counted in the step's metrics. Each call
draws from its episode's own generators (`random`'s and `np.random`'s module functions follow the
calling thread: thread_generators), and each environment gets its own `self.rng` and `self.np_rng`, so
an environment that draws random numbers repeats whether episodes' calls run one at a time or
concurrently, and a resumed run matches an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import copy
import inspect
import os
import random
import threading
from collections.abc import Mapping
from contextlib import contextmanager, nullcontext
from typing import Any, Callable

import numpy as np

from grpo_cli.errors import GrpoError


# ---- the environment a config names -----------------------------------------------------------------
def public_methods(cls) -> dict[str, Callable]:
    """The methods an environment exposes as tools (TRL's rule): public functions other than reset and
    get_reward (and step, which makes it a step environment)."""
    return {name: fn for name, fn in inspect.getmembers(cls, predicate=inspect.isfunction)
            if not name.startswith("_") and name not in ("reset", "get_reward", "step")}


def tool_schema(fn: Callable, where: str) -> dict:
    """The tool's JSON schema as the chat template gets it, or one sentence on what its docstring lacks."""
    from transformers.utils import get_json_schema

    try:
        return get_json_schema(fn)
    except Exception as e:  # transformers raises its own DocstringParsingException / TypeHintParsingException
        raise GrpoError(f"{where} {fn.__name__!r} cannot be shown to the model as a tool ({e}); give it type hints "
                        "and a Google-style docstring with an Args: section.") from None


def environment(cfg) -> "EnvSpec | EnvChoice | None":
    """The env group's tools and environment, loaded (None when single-turn)."""
    if not (cfg.tools or cfg.factory):
        return None
    return EnvChoice(cfg, cfg.fn_dir) if isinstance(cfg.factory, Mapping) else EnvSpec(cfg, cfg.fn_dir)


def reward_with(reward_cfg, spec: "EnvSpec | None"):
    """The reward group's Reward for this environment: an environment that scores episodes (get_reward(),
    or a step environment's rewards) is one more term (rewards.Reward.add_environment_term), and with
    reward=auto the only one, as TRL's GRPOTrainer scores with an environment and no reward_funcs. A
    reward that would score nothing is one sentence."""
    from grpo_cli.rewards import build_reward, resolved

    scores = spec is not None and spec.reward_name is not None
    reward = build_reward(resolved(reward_cfg, scores))
    if scores:
        spec.score_with(reward)
    if not reward.terms:
        what = (f"env.factory={spec.cfg.factory} has no get_reward() and no step()" if spec is not None and spec.cfg.factory
                else "there is no env.factory")
        raise GrpoError(f"reward=none leaves the scoring to the environment, but {what}; give the environment a "
                        "get_reward() method, or name a reward (reward=exact_match, reward=python, ...).")
    return reward


class EnvSpec:
    """What `env.*` names, loaded: standalone tools, the environment class, and their schemas."""

    def __init__(self, cfg, base: str | None = None):
        from grpo_cli.rewards.python_fn import load_function

        thread_generators()  # before the environment's modules are imported, so their random functions follow
        self.cfg = cfg
        self.tools = [load_function(str(s), base, key="env.tools") for s in cfg.tools]
        self.factory = load_function(cfg.factory, base, key="env.factory") if cfg.factory else None
        cls = self.factory if inspect.isclass(self.factory) else None
        self.kind = "step" if cls is not None and callable(getattr(cls, "step", None)) else "tools"
        if self.factory is not None and cls is None:  # a factory function: look at what it makes
            cls = type(self.factory())
            self.kind = "step" if callable(getattr(cls, "step", None)) else "tools"
        if cls is not None and self.kind == "tools" and not callable(getattr(cls, "reset", None)):
            raise GrpoError(f"env.factory={cfg.factory}: {cls.__name__} has no reset method; give it reset(self, **row) "
                            "returning None or text for the prompt (TRL's environment_factory contract).")
        self.cls = cls
        methods = public_methods(cls) if cls is not None and self.kind == "tools" else {}
        self.schemas = [tool_schema(f, "env.tools function") for f in self.tools]
        self.schemas += [tool_schema(f, f"env.factory {cls.__name__} method") for f in methods.values()]
        self.shared_draws = bound_globally([*self.tools, self.factory])  # names that would make concurrency unrepeatable
        self.reward_name = cls.__name__ if cls is not None and (self.kind == "step" or hasattr(cls, "get_reward")) else None

    def score_with(self, reward) -> None:
        """An environment with get_reward(), or a step environment, adds its reward to `reward` as a term."""
        if self.reward_name and hasattr(reward, "add_environment_term"):
            reward.add_environment_term(self.reward_name, getattr(self.cls, "max_reward", 1.0))

    def new(self, row: dict | None = None):
        return self.factory() if self.factory is not None else None

    def schemas_for(self, row: dict) -> list[dict]:
        """The tools' JSON schemas a row's prompt shows."""
        return self.schemas

    def tools_of(self, instance) -> dict[str, Callable]:
        tools = {f.__name__: f for f in self.tools}
        if instance is not None and self.kind == "tools":
            tools.update({name: getattr(instance, name) for name in public_methods(type(instance))})
        return tools


ENVIRONMENT_COLUMN = "environment"  # the column that names each row's environment, with several (TRL's field)


class EnvChoice:
    """env.factory as a dict {name: factory} (TRL's dict of environment factories): each row's
    `environment` column names its environment, whose instance the episode gets and whose tools alone its
    prompt shows; each environment class that scores is its own reward term, scoring its episodes only."""

    def __init__(self, cfg, base: str | None = None):
        def one(spec):
            single = copy.copy(cfg)
            single.factory = spec
            return EnvSpec(single, base)

        if not cfg.factory:
            raise GrpoError("env.factory is an empty dict; name at least one environment: env.factory={name:mod.Class}.")
        self.cfg, self.named = cfg, {str(k): one(v) for k, v in cfg.factory.items()}
        kinds = {s.kind for s in self.named.values()}
        if len(kinds) > 1:
            raise GrpoError("env.factory mixes step environments and tool-calling ones; a run's environments take "
                            "turns the same way: make them all one kind.")
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
            raise GrpoError(f"A row's {ENVIRONMENT_COLUMN!r} is {name!r}, not one of env.factory's {list(self.named)}; "
                            f"give every row an {ENVIRONMENT_COLUMN!r} column naming its environment.")
        return self.named[name]

    def new(self, row: dict | None = None):
        return self.of(row or {}).new()

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


# ---- random numbers, per episode ------------------------------------------------------------------
_thread = threading.local()  # .random, .numpy: the generators of the episode whose call runs on this thread
_GLOBAL = random._inst  # what random's module functions draw from
_NP_ALIASES = {"seed": "seed", "sample": "random_sample", "ranf": "random_sample"}  # module functions, not bound methods


def _drawing(name: str, shared, which: str, method: str | None = None):
    def draw(*args, **kwargs):
        return getattr(getattr(_thread, which, None) or shared, method or name)(*args, **kwargs)

    draw.__name__ = draw.__qualname__ = name
    return draw


def thread_generators() -> None:
    """Python's and NumPy's module-level random functions (random.randint, np.random.rand, np.random.seed, ...)
    draw from the generators of the episode whose call runs on the calling thread, where one is set
    (episode_generators), and from the shared global ones everywhere else, as before. So an environment
    that draws "globally", as many TRL environments do, gives the same transcripts whether episodes' calls
    run one at a time or concurrently. Installed once, before an environment's modules are imported; a
    name bound earlier (`from random import randint` in a module already loaded) still draws from the
    shared generator, which bound_globally finds."""
    if getattr(random.random, "__self__", None) is not _GLOBAL:
        return
    for name in random.__all__:
        if getattr(getattr(random, name), "__self__", None) is _GLOBAL:
            setattr(random, name, _drawing(name, _GLOBAL, "random"))
    shared = np.random.mtrand._rand
    for name in dir(np.random):
        if getattr(getattr(np.random, name, None), "__self__", None) is shared:
            setattr(np.random, name, _drawing(name, shared, "numpy"))
    for name, method in _NP_ALIASES.items():
        setattr(np.random, name, _drawing(name, shared, "numpy", method))


def hand_generators(environment, seed: int) -> None:
    """An episode's environment gets its own generators, `rng` (random.Random) and `np_rng` (NumPy's
    Generator), seeded from the episode's seed, unless it has attributes of those names already."""
    if hasattr(environment, "__dict__"):
        for name, make in (("rng", random.Random), ("np_rng", np.random.default_rng)):
            if not hasattr(environment, name):
                setattr(environment, name, make(seed))


@contextmanager
def episode_generators(seed: int):
    """The calling thread's module-level random functions draw from generators seeded with `seed`, as
    random.seed(seed) and np.random.seed(seed) would seed the shared ones."""
    _thread.random, _thread.numpy = random.Random(seed), np.random.RandomState(seed % 2**32)
    try:
        yield
    finally:
        _thread.random = _thread.numpy = None


def bound_globally(objects) -> list[str]:
    """`name (file)` for every name in the modules defining `objects` that holds a method of the shared global
    generators (bound before thread_generators was installed): draws through it are shared between threads."""
    shared, found = (_GLOBAL, np.random.mtrand._rand), []
    for module in {inspect.getmodule(o) for o in objects if o is not None} - {None}:
        where = os.path.basename(getattr(module, "__file__", None) or module.__name__)
        found += [f"{k} ({where})" for k, v in vars(module).items() if getattr(v, "__self__", None) in shared]
    return sorted(found)


def global_draws() -> tuple:
    """A fingerprint of the shared generators' states: it changes when anything draws from them."""
    _, keys, pos, *_ = np.random.mtrand._rand.get_state()
    return _GLOBAL.getstate(), int(pos), keys.tobytes()


@contextmanager
def seeded(seed: int):
    """Python's and NumPy's global generators seeded for one environment call, then put back."""
    state, np_state = random.getstate(), np.random.get_state()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    try:
        yield
    finally:
        random.setstate(state)
        np.random.set_state(np_state)


def reset_arguments(row: dict) -> dict:
    """What reset(**row) gets: the dataset row's columns, the prompt as the user wrote it (chat messages on
    conversational data, as TRL passes the example) rather than rendered by the chat template."""
    from grpo_cli.rollout.data import USER_PROMPT
    from grpo_cli.rewards import PROMPT_MESSAGES

    args = {k: v for k, v in row.items() if not k.startswith("_")}
    given = row.get(PROMPT_MESSAGES) or row.get(USER_PROMPT)
    if given is not None:
        args["prompt"] = given
    return args


def step_result(value) -> tuple[str, float, bool]:
    """A step environment's (observation, reward, done), checked: a malformed return is the environment's bug."""
    try:
        observation, reward, done = value
        return str(observation), float(reward), bool(done)
    except (TypeError, ValueError):
        raise GrpoError(f"A step environment's step() returned {value!r}; it must return (observation, reward, done).") from None


def content_parts(value) -> bool:
    """A message's content given as a list of parts ({"type": "text", "text": ...}, {"type": "image", ...})."""
    return isinstance(value, list) and bool(value) and all(isinstance(p, dict) and "type" in p for p in value)


def text_of(content) -> str:
    """A message's content as text: its text parts joined, any other part as [type]."""
    if not content_parts(content):
        return str(content)
    return "".join(str(p["text"]) if "text" in p else f"[{p['type']}]" for p in content)
