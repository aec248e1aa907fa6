"""The `env` group: multi-turn episodes, off while neither tools nor an environment is named."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, List, Optional

from grpo_cli.config.declare import MAX_TIMEOUT_S, Settings, rule, setting
from grpo_cli.config.reward import user_file
from grpo_cli.registry import is_file_spec


def tool_formats() -> tuple[str, ...]:
    from grpo_cli.registry import load

    return ("auto", "schema", *load("grpo_cli.episodes.tool_formats:TOOL_FORMATS"))


@dataclass
class EnvConfig(Settings):
    tools: List[str] = setting(
        factory=list,
        help="tool functions the model may call: [mod:fn, file.py:fn] (typed, with docstrings; as TRL's tools)",
    )
    factory: Any = setting(
        None,
        "an environment class, one instance per episode: mod:Class or file.py:Class (TRL's "
        "environment_factory); or several, {name: mod.Class, ...}",
    )
    agent: Optional[str] = setting(
        None,
        "your agent as ordinary code, FILE.py:FUNC or mod:FUNC: async def FUNC(client, model, row) -> reward, "
        "calling the run's OpenAI-compatible endpoint through client (docs/how-to/agents.md)",
    )
    verifiers: Optional[str] = setting(
        None,
        "a verifiers environment as the agent: FILE.py:load_environment, mod:fn, or an installed environment's id "
        "(docs/how-to/ecosystem.md)",
    )
    verifiers_args: Any = setting(None, "env.verifiers: its loader's arguments, {name: value, ...}")
    openenv: Optional[str] = setting(
        None,
        "an OpenEnv environment server, http://127.0.0.1:PORT: each episode a session of it, a step environment "
        "(docs/how-to/ecosystem.md)",
    )
    openenv_action: str = setting("message", "env.openenv: the action's field that holds the model's turn")
    agent_sampling: str = setting(
        "run",
        "env.agent: whose temperature and top_p a request samples with; request: the agent's (off the policy the "
        "loss assumes: algo.sampler_correction=tis reweights)",
        choices=("run", "request"),
    )
    fn_dir: Optional[str] = setting(
        None, "where relative tool files and modules are found; grpo train sets it to the directory it runs in"
    )
    max_turns: int = setting(4, "model turns per episode at most; an episode still calling tools then is cut", low=1)
    max_tokens: int = setting(
        256, "tokens per episode after the prompt (model and environment); past it the episode is cut", low=1
    )
    timeout_s: float = setting(
        10.0,
        "seconds each tool call or environment step may take; past it the model reads a timeout error",
        low=0,
        above=True,
        high=MAX_TIMEOUT_S,
    )
    concurrency: int = setting(
        16,
        "episodes whose environment calls run at once; 1 = one at a time (the transcripts are the same either way)",
        low=1,
    )
    workers: int = setting(0, "run the environments, tools or agents in N helper processes (0 = this one)", low=0)
    worker_memory_gib: float = setting(4.0, "workers: each one's address-space limit, GiB (0 = none)", low=0)
    sandbox: str = setting(
        "none",
        "os: confine the workers by the kernel (needs env.workers; docs/sandbox.md) | none",
        choices=("none", "os"),
    )
    tool_format: str = setting(
        "auto", "how tool calls are written: auto = the format the chat template writes", choices=tool_formats
    )

    @property
    def active(self) -> bool:
        """Whether samples are multi-turn episodes: tools or an environment are named."""
        return any(bool(x) for x in (self.tools, self.factory, self.agent, self.openenv, self.verifiers))

    def specs(self) -> list[tuple[str, str]]:
        """(key, spec) of every tool and environment named."""
        factory = self.factory
        named = (factory.items() if isinstance(factory, Mapping) else [("", factory)]) if factory else []
        return (
            [("env.tools", str(t)) for t in self.tools]
            + [(f"env.factory{'.' + str(k) if k else ''}", str(v)) for k, v in named if v]
            + ([("env.agent", str(self.agent))] if self.agent else [])
        )


@rule("env.tools", "env.factory", "env.agent", "env.sandbox", "env.workers")
def _env(p, c) -> None:
    env = c.env
    p.need(
        env.sandbox != "os" or env.workers >= 1 or not env.active,
        "env.sandbox=os confines the environment's worker processes, and env.workers is 0; set env.workers "
        "(e.g. env.workers=2), or env.sandbox=none",
    )
    for key, spec in env.specs():
        p.need(
            ":" in spec or "." in spec, f"{key}={spec} names no function or class; write it as mod:name or file.py:name"
        )
        if is_file_spec(spec):
            where = user_file(spec.partition(":")[0], env.fn_dir)
            p.need(
                os.path.isfile(where),
                f"{key}={spec}: there is no file {where}; give the path to your file "
                "(relative to the directory grpo runs in)",
            )


@rule("env.agent", "env.verifiers", "env.tools", "env.factory", "env.workers", "data.chat_template")
def _agent(p, c) -> None:
    env = c.env
    if not (env.agent or env.verifiers):
        return
    p.need(not (env.agent and env.verifiers), "env.verifiers is the agent, and env.agent is set too; keep one")
    p.need(
        not (env.tools or env.factory),
        "env.agent runs your agent's own tools and loop, and env.tools or env.factory is set too; keep one of them",
    )
    p.need(
        c.data.chat_template,
        "env.agent's endpoint renders each request with the chat template; set data.chat_template=true",
    )


@rule("env.openenv", "env.tools", "env.factory", "env.agent", "env.workers")
def _openenv(p, c) -> None:
    env = c.env
    if not env.openenv:
        return
    p.need(
        str(env.openenv).startswith(("http://", "https://", "ws://", "wss://")),
        f"env.openenv={env.openenv} is not a server's URL; give it as http://127.0.0.1:PORT",
    )
    p.need(
        not (env.tools or env.factory or env.agent or env.workers),
        "env.openenv is the environment, and env.tools, env.factory, env.agent or env.workers is set too; keep one",
    )


@rule("env.tools", "data.chat_template")
def _tools_need_the_chat_template(p, c) -> None:
    p.need(
        not c.env.tools or c.data.chat_template,
        "env.tools needs the chat template to show tools and render their results; set data.chat_template=true",
    )
