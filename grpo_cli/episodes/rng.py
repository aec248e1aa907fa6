"""Random numbers per episode (docs/math.md, "Episodes"): each environment call draws from its episode's own
generators, so an environment that draws random numbers repeats whether episodes' calls run one at a time,
concurrently or in environment workers, and a resumed run matches an uninterrupted one. Python's and
NumPy's module-level functions follow the calling thread (thread_generators); each environment gets its own
`self.rng` and `self.np_rng` (hand_generators)."""

from __future__ import annotations

import inspect
import os
import random
from contextlib import contextmanager
from contextvars import ContextVar

import numpy as np

# {"random": ..., "numpy": ...}: the generators of the episode whose code runs in this context (a thread, or an
# asyncio task: env.agent's coroutines share one event loop)
_current: ContextVar[dict | None] = ContextVar("grpo_episode_generators", default=None)
_GLOBAL = random._inst  # what random's module functions draw from
_NP_ALIASES = {
    "seed": "seed",
    "sample": "random_sample",
    "ranf": "random_sample",
}  # module functions, not bound methods


def _drawing(name: str, shared, which: str, method: str | None = None):
    def draw(*args, **kwargs):
        generators = _current.get()
        return getattr(generators[which] if generators else shared, method or name)(*args, **kwargs)

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
    """The calling thread's (or asyncio task's) module-level random functions draw from generators seeded with
    `seed`, as random.seed(seed) and np.random.seed(seed) would seed the shared ones."""
    token = _current.set({"random": random.Random(seed), "numpy": np.random.RandomState(seed % 2**32)})
    try:
        yield
    finally:
        _current.reset(token)


def bound_globally(objects) -> list[str]:
    """`name (file)` for every name in the modules defining `objects` that holds a method of the shared global
    generators (bound before thread_generators was installed): draws through it are shared between threads."""
    shared, found = (_GLOBAL, np.random.mtrand._rand), []
    for module in {inspect.getmodule(o) for o in objects if o is not None} - {None}:
        assert module is not None
        where = os.path.basename(getattr(module, "__file__", None) or module.__name__)
        found += [f"{k} ({where})" for k, v in vars(module).items() if getattr(v, "__self__", None) in shared]
    return sorted(found)


def global_draws() -> tuple:
    """A fingerprint of the shared generators' states: it changes when anything draws from them."""
    _, keys, pos, *_ = np.random.mtrand._rand.get_state(legacy=True)
    return _GLOBAL.getstate(), int(pos), np.asarray(keys).tobytes()


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
