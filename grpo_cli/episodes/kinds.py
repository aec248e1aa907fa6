"""Environment kinds: how an environment takes its turn in an episode. The class env.factory names decides the
kind: the first registered kind whose `detect(cls)` holds, else `tools`.

- `tools`: TRL's environment_factory. The class's public methods (and env.tools) are the model's tools; its turn
  is parsed for calls in the tool-call format (tool_formats.py), the calls are run, and their results come back
  as tool messages. An episode ends when the model calls nothing.
- `step`: a gym-like `step(text) -> (observation, reward, done)`; the observation is the next user message, and
  the rewards add up to the episode's reward.

A new kind is one function, `turn(episodes, ep, ids, text, env_tokens, turn) -> (messages, tool name) | None`,
registered with `register_env_kind`: it appends the model's message to `ep.messages` and returns the
environment's answer, or None when the episode ended in this turn. `episodes` (driver.EpisodeGenerator) lends
it `call(ep, fn, ...)` (the environment's code under the episode's seed and deadline) and `bounded(ep, text)`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from grpo_cli.errors import GrpoError


@dataclass(frozen=True)
class EnvKind:
    turn: Callable  # (episodes, ep, ids, text, env_tokens, turn) -> (messages, tool name) | None
    detect: Callable[[type], bool]  # whether an environment class is of this kind
    tools: bool = False  # the class's public methods are the model's tools, shown in its prompt
    start: Callable = lambda episodes: None  # the kind's checks and set-up when an EpisodeGenerator starts


ENV_KINDS: dict[str, EnvKind] = {}


def register_env_kind(name: str, detect: Callable[[type], bool], *, tools: bool = False, start=None):
    """An environment class for which `detect(cls)` holds takes its turns with the decorated function."""

    def add(turn: Callable) -> Callable:
        ENV_KINDS[name] = EnvKind(turn, detect, tools, start or (lambda episodes: None))
        return turn

    return add


def kind_of(cls: type | None) -> str:
    """The kind of an environment class (`tools` for standalone tools, without a class)."""
    for name, kind in ENV_KINDS.items():
        if name != "tools" and cls is not None and kind.detect(cls):
            return name
    return "tools"


def start_tools(episodes) -> None:
    """Tools need the chat template to render calls and results, and a tool-call format that reads back
    the calls the template writes."""
    from grpo_cli.episodes.tool_formats import resolve_format, round_trip

    tokenizer = episodes.tokenizer
    if not episodes.chat_template:
        raise GrpoError(
            "Tool calling needs the chat template to render tool calls and results; set "
            "data.chat_template=true (or use a step environment, which plain prompts can drive)."
        )
    episodes.check_tools()
    name, episodes.format = resolve_format(episodes.cfg.tool_format, tokenizer)
    why = round_trip(tokenizer, episodes.format)
    if why is not None:  # a call the model writes would be read as an answer: never in silence
        raise GrpoError(
            f"env.tool_format={name} cannot read the model's tool calls: {why}; name the format "
            "the model writes with env.tool_format (`grpo tools` shows what each reads), or use a "
            "model whose chat template writes tool calls."
        )
    episodes.specials = [t for t in tokenizer.all_special_tokens if t]


@register_env_kind("tools", detect=lambda cls: True, tools=True, start=start_tools)
def tools_turn(episodes, ep, ids: list[int], text: str, env_tokens, turn: int):
    with episodes.tokenizing:
        content, calls = parse_turn(episodes, ids, text, env_tokens.eos)
    message: dict[str, Any] = {"role": "assistant", "content": content}
    call_ids = [f"call{ep.tool_calls + i:05d}" for i in range(len(calls))]  # 9 characters, as Mistral's
    good: list[dict[str, Any]] = [
        {"type": "function", "id": i, "function": c} for i, c in zip(call_ids, calls) if "error" not in c
    ]
    if good:
        message["tool_calls"] = good
    ep.messages.append(message)
    if not calls:
        ep.done = True
        return None
    if turn + 1 == episodes.cfg.max_turns:  # no turn left to read the results: the calls are not made
        ep.done, ep.cut = True, "turns"
        return None
    return tool_messages(episodes, ep, calls, call_ids), (good[0]["function"]["name"] if good else None)


@register_env_kind("step", detect=lambda cls: callable(getattr(cls, "step", None)))
def step_turn(episodes, ep, ids: list[int], text: str, env_tokens, turn: int):
    ep.messages.append({"role": "assistant", "content": text})
    value, error = episodes.call(ep, ep.environment.step, text)
    observation, reward, done = (str({"error": error}), 0.0, False) if error is not None else step_result(value)
    ep.reward += reward
    if done:
        ep.done = True
        return None
    return [{"role": "user", "content": episodes.bounded(ep, str(observation))}], None


def tool_messages(episodes, ep, calls: list[dict], ids: list[str]) -> list[dict]:
    """Each call run with the episode's tools, answered as a tool message (an error is what the model reads)."""
    tools, out = episodes.spec.tools_of(ep.environment), []
    result: Any  # what the tool returned: text, content parts or anything printable
    for call, call_id in zip(calls, ids):
        ep.tool_calls += 1
        name = call.get("name", "unknown")
        if "error" in call:
            ep.errors += 1
            result, error = None, call["error"]
        elif name not in tools:
            ep.errors += 1
            result, error = None, f"Tool {name} not found."
        else:
            result, error = episodes.call(ep, tools[name], **call["arguments"])
        if error is not None:
            content = episodes.bounded(ep, str({"error": error}))  # TRL's wording
        elif content_parts(result):  # [{"type": "text", "text": ...}, {"type": "image", ...}]: kept, as TRL does
            content = [
                {**part, "text": episodes.bounded(ep, str(part["text"]))} if "text" in part else part for part in result
            ]
        else:
            ep.non_string += not isinstance(result, str)
            content = episodes.bounded(ep, str(result))
        out.append({"role": "tool", "name": name, "tool_call_id": call_id, "content": content})
    return out


def parse_turn(episodes, ids: list[int], text: str, eos: set[int]) -> tuple[str, list[dict]]:
    """(the turn's text outside its tool calls, the calls): formats whose markers are special tokens read the
    turn with them kept (but for its end-of-turn token), and their text is given back without them."""
    if not episodes.format.special:
        return episodes.format.parse(text)
    while ids and ids[-1] in eos:
        ids = ids[:-1]
    content, calls = episodes.format.parse(episodes.tokenizer.decode(ids, skip_special_tokens=False))
    for token in episodes.specials:
        content = content.replace(token, "")
    return content.strip(), calls


def step_result(value) -> tuple[str, float, bool]:
    """A step environment's (observation, reward, done), checked: a malformed return is the environment's bug."""
    try:
        observation, reward, done = value
        return str(observation), float(reward), bool(done)
    except (TypeError, ValueError):
        raise GrpoError(
            f"A step environment's step() returned {value!r}; it must return (observation, reward, done)."
        ) from None


def content_parts(value) -> bool:
    """A message's content given as a list of parts ({"type": "text", "text": ...}, {"type": "image", ...})."""
    return isinstance(value, list) and bool(value) and all(isinstance(p, dict) and "type" in p for p in value)


def text_of(content) -> str:
    """A message's content as text: its text parts joined, any other part as [type]."""
    if not content_parts(content):
        return str(content)
    return "".join(str(p["text"]) if "text" in p else f"[{p['type']}]" for p in content)
