"""Agents in helper processes (`env.agent` with `env.workers=N`): each of N agent workers (`python -m
grpo_cli.episodes.agent_workers FD`, a subprocesses.Helper) imports the agent and runs the episodes the trainer
hands it (agent_host.AgentHost), against the run's endpoint as in-process agents do; the trainer never imports the
agent. With `env.sandbox=os` a worker is confined by the kernel (sandbox/env.py) and the one way out is loopback
HTTP to the endpoint: the trainer's endpoint also listens on a Unix socket shown to the worker, and inside the
worker's own network namespace a forwarder listens on 127.0.0.1 at the endpoint's port and passes each
connection to that socket, so `base_url` is the same and any client library reaches it.
"""

from __future__ import annotations

import atexit
import itertools
import os
import tempfile
import threading
from typing import Any

from grpo_cli.errors import GrpoError
from grpo_cli.procs.subprocesses import Channel, Helper, HelperLost, serve

SOCKET = "endpoint.sock"


class AgentWorkerLost(HelperLost):
    """An agent worker is gone or stopped."""


class AgentWorkers:
    """The trainer's end: N agent workers, started with the run (each says the agent's `max_reward` once it has
    imported it); `start` hands one episode to the next worker in turn, and each worker's reader thread passes
    its reports to `report`. A worker that is lost fails the episodes it held; the next step restarts it."""

    def __init__(self, cfg):
        from omegaconf import OmegaConf

        settings: Any = OmegaConf.to_container(cfg, resolve=True) if OmegaConf.is_config(cfg) else dict(vars(cfg))
        self.confined = settings.get("sandbox") == "os"  # read as plain data, output unshown
        self.socket_dir = None
        if self.confined:
            from grpo_cli.sandbox.scratch import sweep_stale

            sweep_stale()
            self.socket_dir = tempfile.mkdtemp(prefix="grpo-endpoint-")
            os.chmod(self.socket_dir, 0o711)  # the worker's own user id connects; the key still guards the door
        socket = os.path.join(self.socket_dir, SOCKET) if self.socket_dir else None
        self.settings = ({**settings, "workers": 0}, float(cfg.worker_memory_gib), socket)
        self.helpers: list[Helper | None] = [None] * int(cfg.workers)
        self.locks = [threading.Lock() for _ in self.helpers]
        self.held: dict[Helper, set[str]] = {}  # the episodes each worker runs
        self.turn = itertools.count()
        self.report: Any = None
        atexit.register(self.close)  # also where no generator came to close them (the generation worker's run)
        started = [self._launch(slot) for slot in range(len(self.helpers))]  # they import the agent side by side
        try:
            self.max_reward = max(self._ready(slot, helper) for slot, helper in enumerate(started))
        except BaseException:  # one could not start (the agent's import failed): the others go too
            for helper in started:
                helper.kill()
            raise

    def bind(self, report, endpoint) -> None:
        """Where reports go, and (confined) the endpoint to serve on the workers' Unix socket too."""
        self.report = report
        if self.socket_dir is not None:
            endpoint.serve_unix(os.path.join(self.socket_dir, SOCKET))

    def _launch(self, slot: int) -> Helper:
        name = f"agent worker {slot}"
        return Helper(
            "grpo_cli.episodes.agent_workers", self.settings, name=name, lost=AgentWorkerLost, plain=self.confined
        )

    def _ready(self, slot: int, helper: Helper) -> float:
        """The slot's worker started: the max_reward it read off the agent."""
        _, ready = helper.receive(120, "starting (importing the agent)")
        if not (isinstance(ready, dict) and isinstance(ready.get("max_reward"), (int, float))):
            helper.kill()
            raise AgentWorkerLost(f"agent worker {slot} sent a start message of no known shape and was stopped")
        self.helpers[slot], self.held[helper] = helper, set()
        threading.Thread(target=self._read, args=(slot, helper), name="grpo-agent-worker", daemon=True).start()
        return ready["max_reward"]

    def revive(self) -> None:
        """Restart the workers that were lost, from the thread that runs the step (a helper dies with the thread
        that started it: PR_SET_PDEATHSIG)."""
        for slot, helper in enumerate(self.helpers):
            if helper is None or not helper.alive():
                with self.locks[slot]:
                    self._ready(slot, self._launch(slot))

    def start(self, key: str, row: dict, rng_seed: int, where: dict):
        slot = next(self.turn) % len(self.helpers)
        with self.locks[slot]:
            helper = self.helpers[slot]
            assert helper is not None
            held = self.held.setdefault(helper, set())
            held.add(key)
            try:
                helper.send(("start", key, row, rng_seed, where))
            except AgentWorkerLost as e:  # lost this step: its next step restarts it
                held.discard(key)
                self.report(key, None, {}, f"AgentWorkerLost: {e}"[:500])
                return lambda: None
        return lambda: self._send(slot, ("cancel", key))

    def _send(self, slot: int, message) -> None:
        with self.locks[slot]:
            helper = self.helpers[slot]
            if helper is not None and helper.alive():
                try:
                    helper.send(message)
                except AgentWorkerLost:
                    pass  # its reader thread reports the loss

    def _read(self, slot: int, helper: Helper) -> None:
        """The worker's reports, until it ends; then its episodes still running fail with how it ended."""
        while True:
            try:
                kind, value = helper.receive(None, "running agents")
                key, reward, metrics, failed = done(kind, value)
            except (HelperLost, GrpoError, RuntimeError, ValueError, OSError, EOFError) as e:
                with self.locks[slot]:
                    if helper.alive():
                        helper.kill()
                    keys = self.held.pop(helper, set())
                for key in keys:
                    self.report(key, None, {}, f"AgentWorkerLost: {e}"[:500])
                return
            with self.locks[slot]:
                self.held.get(helper, set()).discard(key)
            self.report(key, reward, metrics, failed)

    def close(self) -> None:
        for helper in self.helpers:
            if helper is not None:
                helper.close(grace_s=2.0)
        self.helpers = [None] * len(self.helpers)
        if self.socket_dir is not None:
            import shutil

            from grpo_cli.sandbox.scratch import sweep_stale

            shutil.rmtree(self.socket_dir, ignore_errors=True)
            sweep_stale()  # a killed worker could not remove its scratch directory


def done(kind, value) -> tuple[str, float | None, dict, str | None]:
    """A worker's report, checked (a confined worker may be hostile): ValueError for one of no known shape."""
    if kind != "done" or not (isinstance(value, list) and len(value) == 4):
        raise ValueError("it sent a report of no known shape")
    key, reward, metrics, failed = value
    if not (
        isinstance(key, str)
        and (reward is None or isinstance(reward, float))
        and isinstance(metrics, dict)
        and all(isinstance(k, str) and isinstance(v, float) for k, v in metrics.items())
        and (failed is None or isinstance(failed, str))
        and (reward is None) != (failed is None)
    ):
        raise ValueError("it sent a report of no known shape")
    return key, reward, metrics, failed


# ---- the worker's end -------------------------------------------------------------------------------------
def _serve(channel: Channel, settings) -> None:
    from omegaconf import OmegaConf

    cfg, _, socket = settings
    if cfg.get("sandbox") == "os":
        from grpo_cli.sandbox.env import confine

        confine(cfg, channel.conn.fileno(), shown=(os.path.dirname(socket),), loopback=True)
    from grpo_cli.episodes.agent_host import AgentHost, load_agent

    fn = load_agent(OmegaConf.create(cfg))
    lock = threading.Lock()

    def report(key, reward, metrics, failed) -> None:
        with lock:
            channel.send(("done", [key, reward, metrics, failed]))

    host = AgentHost(fn, report)
    forwarded: set[int] = set()
    cancels: dict = {}
    with lock:
        channel.send(("ready", {"max_reward": float(getattr(fn, "max_reward", 1.0))}))
    while (message := channel.receive()) is not None:
        if message[0] == "start":
            _, key, row, rng_seed, where = message
            port = int(where["base_url"].split(":")[2].split("/")[0])
            if socket is not None and port not in forwarded:
                forward(port, socket)
                forwarded.add(port)
            cancels[key] = host.start(key, row, rng_seed, where)
        elif message[0] == "cancel":
            cancels.pop(message[1], lambda: None)()


def forward(port: int, socket: str) -> None:
    """Listen on this namespace's 127.0.0.1:`port` and pass each connection to the endpoint's Unix socket, on an
    event loop of its own (an agent that blocks its loop on a request must not stall the request)."""
    import asyncio

    async def pipe(reader, writer) -> None:
        try:
            while data := await reader.read(2**16):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass  # the other side closed: its own pipe ends the connection
        finally:
            writer.close()

    async def connection(reader, writer) -> None:
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(socket)
        except OSError:
            writer.close()
            return
        await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))

    async def listen() -> None:
        await asyncio.start_server(connection, "127.0.0.1", port, backlog=4096)

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, name="grpo-forward", daemon=True).start()
    asyncio.run_coroutine_threadsafe(listen(), loop).result(timeout=10)


if __name__ == "__main__":
    serve(_serve, memory_gib=lambda settings: settings[1])
