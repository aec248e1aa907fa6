"""`env.openenv=URL`: an OpenEnv environment server as a step environment (docs/how-to/ecosystem.md). Each episode
opens its own session with OpenEnv's client (a WebSocket to the server), resets it, sends each turn's text as
the action's `env.openenv_action` field and reads back the observation, the reward and whether it is done; the
session closes once the episode is scored (EpisodeGenerator.close_environments), a cut episode's too."""

from __future__ import annotations

import json
from typing import Any

from grpo_cli.errors import GrpoError


def client_class():
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError:
        raise GrpoError("env.openenv needs OpenEnv's client: pip install 'grpo-cli[openenv]'.") from None
    return GenericEnvClient


class OpenEnv:
    """One episode's session on an OpenEnv server: reset, step(text) -> (observation, reward, done), close."""

    url: str = ""
    action_field: str = "message"

    def __init__(self, url: str | None = None, action_field: str | None = None):
        self.url, self.action_field = url or self.url, action_field or self.action_field
        self.client: Any = None

    def reset(self, **row) -> str:
        client = client_class()(base_url=self.url)
        self.client = client.sync() if hasattr(client, "sync") else client  # from 0.3 the client is async
        try:
            self.client.connect()
        except ConnectionError as e:
            raise GrpoError(f"env.openenv={self.url}: no OpenEnv server answers there ({e}); start it first.") from None
        result = self.client.reset()
        return observation_text(result.observation)

    def step(self, text: str) -> tuple[str, float, bool]:
        result = self.client.step({self.action_field: text})
        return observation_text(result.observation), float(result.reward or 0.0), bool(result.done)

    def close(self) -> None:
        if self.client is not None:
            self.client.close()
            self.client = None


def observation_text(observation) -> str:
    """What the model reads of an observation: its one text field, else the fields as JSON (done, reward and
    metadata left out: the driver reads the first two, and the model is not shown the third)."""
    fields = {k: v for k, v in dict(observation or {}).items() if k not in ("done", "reward", "metadata")}
    texts = [v for v in fields.values() if isinstance(v, str)]
    return texts[0] if len(texts) == 1 and len(fields) == 1 else json.dumps(fields)
