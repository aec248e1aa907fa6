"""Where the user's agents run: `AgentHost` runs them in this process (the trainer's, or an agent worker's,
episodes/agent_workers.py), each with a client pointed at its episode's path of the run's endpoint, its own seeded
generators, and its return read as a reward or a failure."""

from __future__ import annotations

import asyncio
import inspect
import math
import threading
from typing import Any, Callable

from grpo_cli.episodes.rng import episode_generators, thread_generators

CLIENT_TIMEOUT_S = 3600.0  # the client's own limit on one call: generation may queue behind a long batch
# loopback HTTP: no TLS set-up (20 ms a client), none of the environment's proxies
PLAIN_HTTP: dict = dict(verify=False, trust_env=False, timeout=CLIENT_TIMEOUT_S)
Report = Callable[[str, "float | None", dict, "str | None"], None]  # (episode, reward, metrics, why it failed)


class AgentHost:
    """Runs `fn(client, model, row)` per episode: coroutines as tasks of one event loop on one thread, kept with
    its connections (a blocking call in one stalls the others: blocking code belongs in a plain def); a plain def
    each on its own thread with a synchronous client. `report` hears each episode's end."""

    def __init__(self, fn, report: Report):
        self.fn, self.report, self.is_async = fn, report, inspect.iscoroutinefunction(fn)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.http: Any = None  # the coroutines' connections (openai's httpx client), made on the loop

    def start(self, key: str, row: dict, rng_seed: int, where: dict) -> Callable[[], object]:
        """Start one episode's agent; returns what cancels it where it can be (a coroutine)."""
        if not self.is_async:
            args = (key, row, rng_seed, where)
            threading.Thread(target=self._sync_agent, args=args, name="grpo-agent", daemon=True).start()
            return lambda: None
        future = asyncio.run_coroutine_threadsafe(self._async_agent(key, row, rng_seed, where), self.running_loop())
        return future.cancel

    def running_loop(self) -> asyncio.AbstractEventLoop:
        if self.loop is None:
            self.loop = asyncio.new_event_loop()
            threading.Thread(target=self.loop.run_forever, name="grpo-agents", daemon=True).start()
        return self.loop

    async def _async_agent(self, key: str, row: dict, rng_seed: int, where: dict) -> None:
        import openai

        if self.http is None:  # a connection kept per concurrent episode, for the run
            self.http = openai.DefaultAsyncHttpxClient(**PLAIN_HTTP, transport=transport(asynchronous=True))
        client = openai.AsyncOpenAI(**client_args(where), http_client=self.http)
        try:
            with episode_generators(rng_seed):
                value = await self.fn(client, where["model"], row)
        except BaseException as e:  # the agent's own failure (or its cancelling): the episode goes unscored
            self.report(key, None, {}, f"{type(e).__name__}: {e}"[:500])
            return
        self._returned(key, value)

    def _sync_agent(self, key: str, row: dict, rng_seed: int, where: dict) -> None:
        import openai

        http = openai.DefaultHttpxClient(**PLAIN_HTTP, transport=transport())
        try:
            with openai.OpenAI(**client_args(where), http_client=http) as client:
                with episode_generators(rng_seed):
                    value = self.fn(client, where["model"], row)
                    value = asyncio.run(value) if inspect.iscoroutine(value) else value
        except BaseException as e:  # the agent's own failure: the episode goes unscored
            self.report(key, None, {}, f"{type(e).__name__}: {e}"[:500])
            return
        self._returned(key, value)

    def _returned(self, key: str, value) -> None:
        try:
            reward, metrics = returned(value)
        except ValueError as e:
            self.report(key, None, {}, f"ValueError: {e}"[:500])
            return
        self.report(key, reward, metrics, None)

    def close(self) -> None:
        if self.loop is not None:
            if self.http is not None:
                asyncio.run_coroutine_threadsafe(self.http.aclose(), self.loop).result(timeout=10)
            self.loop.call_soon_threadsafe(self.loop.stop)


def load_agent(cfg):
    """The agent function env.agent (or env.verifiers) names, imported here."""
    from grpo_cli.registry import load_function

    thread_generators()  # before the agent's module is imported, so its random functions follow the episode
    if getattr(cfg, "verifiers", None):  # a verifiers environment's rollout is the agent
        from grpo_cli.episodes.verifiers_env import verifiers_agent

        return verifiers_agent(cfg)
    return load_function(str(cfg.agent), cfg.fn_dir, key="env.agent")


def client_args(where: dict) -> dict:
    """No retries (a refusal is the agent's to see), and no limit of the client's own on a call's wait."""
    return dict(base_url=where["base_url"], api_key=where["api_key"], max_retries=0, timeout=CLIENT_TIMEOUT_S)


def transport(asynchronous: bool = False):
    """The clients' transport, from the httpx library openai's client is built on (httpx, or httpx2): no TLS,
    no cap on connections, and TCP_NODELAY, without which a kept connection's request waits 40 ms for the
    endpoint's delayed ACK of its headers before it sends its body."""
    import importlib
    import socket

    import openai

    library = importlib.import_module(openai.DefaultAsyncHttpxClient.__mro__[1].__module__.split(".")[0])
    kind = library.AsyncHTTPTransport if asynchronous else library.HTTPTransport
    return kind(
        verify=False,
        limits=library.Limits(max_connections=None, max_keepalive_connections=None),
        socket_options=[(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)],
    )


def returned(value) -> tuple[float, dict]:
    """The agent's return: a finite reward, or a dict with one and metrics to log (one sentence otherwise)."""
    metrics = {}
    if isinstance(value, dict):
        if "reward" not in value:
            raise ValueError(f"the agent returned a dict without 'reward': {sorted(value)}")
        metrics = {k: float(v) for k, v in value.items() if k != "reward" and isinstance(v, (int, float))}
        value = value["reward"]
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"the agent returned {value!r}; return a finite number (or a dict with 'reward')")
    return float(value), metrics
