"""Environments in helper processes (`env.workers=N`): each episode's environment instance, its tools and
the standalone `env.tools` live in one of N environment workers (`python -m grpo_cli.episodes.worker
FD`, a subprocesses.Helper), so an environment that crashes, hangs in native code, leaks or draws from
the shared random generators is confined to its process.

The trainer holds a `RemoteEnvironment` per episode: its methods are the instance's, each call sent to
the worker that holds it. A worker runs one call at a time, under the episode's seed (its own
generators, and Python's and NumPy's shared ones seeded too, which no other call can move meanwhile),
with the same deadline as in-process calls: so the transcripts equal `env.workers=0`'s, for an
environment that draws "globally" as well, at any `env.concurrency`. Calls to different workers run
concurrently, up to `env.concurrency` at a time.

How it works in detail: docs/internals.md, grpo_cli/episodes/worker.py.
"""

from __future__ import annotations

import pickle
from contextlib import nullcontext

from grpo_cli.errors import GrpoError
from grpo_cli.procs.subprocesses import Channel, serve, to_plain


# ---- the worker's end -------------------------------------------------------------------------------
def _answer(fn, args, kwargs, timeout: float, seed: int | None, memory_gib: float) -> tuple[str, object]:
    from grpo_cli.episodes.environments import Timeout, call_with_timeout
    from grpo_cli.episodes.rng import seeded

    try:
        with seeded(seed) if seed is not None else nullcontext():
            value = call_with_timeout(fn, args, kwargs, timeout, seed)
    except Timeout as e:
        return "timeout", str(e)
    except MemoryError:
        return "raised", f"ran out of memory (env.worker_memory_gib={memory_gib:g})"
    except Exception as e:  # the environment's failure: the model reads it, as in-process
        return "raised", str(e)
    try:
        pickle.dumps(value)
    except Exception as e:  # noqa: BLE001 - any pickling failure is the same answer
        return "raised", f"returned a {type(value).__name__}, which cannot be sent between processes ({e})"
    return "ok", value


def _serve(channel: Channel, settings) -> None:
    from omegaconf import OmegaConf

    cfg, memory_gib = settings
    confined = cfg.get("sandbox") == "os"
    if confined:
        from grpo_cli.sandbox.env import confine

        confine(cfg, channel.conn.fileno())
    from grpo_cli.episodes.environments import environment

    spec = environment(OmegaConf.create(cfg), schemas=False)  # a GrpoError goes back as ("error", sentence)
    if spec is None:
        raise GrpoError("env.workers is set, but env.tools and env.factory are empty: there is no environment to run.")
    instances: dict[int, object] = {}
    channel.send(("ready", None))
    while (message := channel.receive()) is not None:
        if message[0] == "drop":
            instances.clear()
        elif message[0] == "new":
            _, handle, row, rng_seed = message
            instances[handle] = spec.new(row, rng_seed)
            channel.send(("ok", None))
        else:
            _, handle, name, args, kwargs, seed, timeout = message
            instance = instances.get(handle)
            tools = spec.tools_of(instance)
            fn = tools.get(name) or getattr(instance, name)
            kind, value = _answer(fn, args, kwargs, timeout, seed, memory_gib)
            channel.send((kind, to_plain(value) if confined else value))


if __name__ == "__main__":
    serve(_serve, memory_gib=lambda settings: settings[1])
