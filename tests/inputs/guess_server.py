"""An OpenEnv environment server for tests/episodes/test_openenv.py: guess a letter (the row's, or 'q'); each
session its own environment; the server counts its open sessions and the most ever open at once."""

from __future__ import annotations

import threading
import time

import uvicorn
from fastapi import FastAPI
from openenv.core.env_server.http_server import HTTPEnvServer
from openenv.core.env_server.interfaces import Environment
from openenv.core.env_server.types import Action, Observation, State


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    prompt: str


class GuessEnvironment(Environment):
    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State(step_count=0)

    def reset(self, seed=None, episode_id=None, **kwargs) -> GuessObservation:
        self._state = State(step_count=0)
        time.sleep(0.05)  # so sessions overlap
        return GuessObservation(prompt=" Guess my letter:", done=False, reward=0.0)

    def step(self, action: GuessAction, timeout_s=None, **kwargs) -> GuessObservation:
        self._state.step_count += 1
        right = action.message.strip().startswith("q")
        return GuessObservation(prompt=" No, again:", done=right, reward=1.0 if right else 0.0)

    @property
    def state(self) -> State:
        return self._state


class Server:
    """The server on 127.0.0.1 at a free port, in a thread: `url`, `open_sessions()`, `most_open`."""

    def __init__(self, max_sessions: int = 64):
        self.env_server = HTTPEnvServer(
            GuessEnvironment, GuessAction, GuessObservation, max_concurrent_envs=max_sessions
        )
        app = FastAPI()
        self.env_server.register_routes(app)
        self.server = uvicorn.Server(
            uvicorn.Config(app, host="127.0.0.1", port=0, log_level="error", ws="websockets-sansio")
        )
        self.most_open, self._watching = 0, True
        threading.Thread(target=self.server.run, daemon=True).start()
        while not self.server.started:
            time.sleep(0.01)
        self.url = f"http://127.0.0.1:{self.server.servers[0].sockets[0].getsockname()[1]}"
        threading.Thread(target=self._watch, daemon=True).start()

    def open_sessions(self) -> int:
        return len(self.env_server._sessions)

    def _watch(self) -> None:
        while self._watching:
            self.most_open = max(self.most_open, self.open_sessions())
            time.sleep(0.002)

    def stop(self) -> None:
        self._watching = False
        self.server.should_exit = True
