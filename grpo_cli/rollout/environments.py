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
it timed out); a non-string result is `str()`-ed. Each is counted in the step's metrics. The
environment's calls are made one at a time, in episode order, with Python's and NumPy's global random
generators seeded per episode and call (and restored after), so an environment that draws random
numbers is repeatable and a resumed run matches an uninterrupted one.
"""

from __future__ import annotations

import asyncio
import inspect
import random
import threading
from contextlib import contextmanager
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


def environment(cfg, reward=None) -> "EnvSpec | None":
    """The env group's tools and environment, loaded (None when single-turn); an environment that scores
    episodes becomes one more term of `reward` (rewards.Reward.add_environment_term)."""
    if not (cfg.tools or cfg.factory):
        return None
    spec = EnvSpec(cfg, cfg.fn_dir)
    if reward is not None:
        spec.score_with(reward)
    return spec


class EnvSpec:
    """What `env.*` names, loaded: standalone tools, the environment class, and their schemas."""

    def __init__(self, cfg, base: str | None = None):
        from grpo_cli.rewards.python_fn import load_function

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
        self.reward_name = cls.__name__ if cls is not None and (self.kind == "step" or hasattr(cls, "get_reward")) else None

    def score_with(self, reward) -> None:
        """An environment with get_reward(), or a step environment, adds its reward to `reward` as a term."""
        if self.reward_name and hasattr(reward, "add_environment_term"):
            reward.add_environment_term(self.reward_name, getattr(self.cls, "max_reward", 1.0))

    def new(self):
        return self.factory() if self.factory is not None else None

    def tools_of(self, instance) -> dict[str, Callable]:
        tools = {f.__name__: f for f in self.tools}
        if instance is not None and self.kind == "tools":
            tools.update({name: getattr(instance, name) for name in public_methods(type(instance))})
        return tools


# ---- calls with a deadline --------------------------------------------------------------------------
class Timeout(Exception):
    pass


def call_with_timeout(fn: Callable, args: tuple, kwargs: dict, timeout: float):
    """fn(*args, **kwargs) on a daemon thread (an async fn run to completion there), waited for `timeout`
    seconds: its result, or it raises what fn raised, or Timeout (the thread is left to finish on its own:
    Python cannot stop it)."""
    box: dict[str, Any] = {}

    def target():
        try:
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
