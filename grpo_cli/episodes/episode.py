"""An episode's record, shared by the in-process driver (driver.py) and agents written as code (agent.py): its ids
and which of them the model sampled, its messages and counts; the environment's messages as the chat template
renders them between turns, as ids (EnvTokens); the Rollout its rows make; the step's episode metrics."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from grpo_cli.episodes.kinds import content_parts, text_of
from grpo_cli.errors import GrpoError
from grpo_cli.samples.rollout import Rollout, group_seed


@dataclass
class Episode:
    """One rollout of one prompt: what came after the prompt, as ids and as messages."""

    prompt_ids: list[int]
    seed: int  # the episode's own: its turns' sampling noise and its environment calls derive from it
    environment: Any = None
    ids: list[int] = field(default_factory=list)  # every token after the prompt, model and environment
    action: list[int] = field(default_factory=list)  # 1 where the model generated the token
    logps: list[float] = field(default_factory=list)  # the sampler's log-prob of each model token (0 elsewhere)
    messages: list[dict] = field(default_factory=list)  # assistant, tool and observation messages after the prompt
    turns: int = 0
    calls: int = 0  # environment calls: tool calls and steps
    tool_calls: int = 0
    errors: int = 0  # calls that raised, unknown tools, malformed calls
    timeouts: int = 0
    non_string: int = 0
    truncated_results: int = 0  # tool results and observations cut to env.max_tokens before tokenizing
    cut: str | None = None  # "turns" or "tokens" when the episode ran out of either
    unseen: list[dict] = field(default_factory=list)  # the environment's answer to the last turn, after a cut
    observation: str | None = None  # what reset() appended to the prompt (with data=none, the whole task)
    done: bool = False
    reward: float = 0.0  # a step environment's rewards, added up
    seconds: float = 0.0  # time spent in the environment
    env_wall: float = 0.0  # wall time its generate call spent in environment calls (all its episodes, concurrently)
    context_tokens: int = 0  # tokens of its turns' contexts run through the model (prefill; turn_cache.count_prefill)
    kv_reused: int = 0  # tokens of its turns' contexts taken from the last turn's kept keys and values
    prefix_breaks: int = 0  # turns after the first whose context did not extend the last turn's tokens
    failed: str | None = None  # env.agent: why the agent gave no reward (it raised, timed out, returned NaN)
    metrics: dict = field(default_factory=dict)  # env.agent: the metrics the agent returned beside its reward
    requests: int = 0  # env.agent: requests answered
    dropped_tokens: int = 0  # env.agent: model tokens of chains a prefix break left out of training
    unanswered: int = 0  # env.agent: answers that never reached the agent

    @property
    def final_text(self) -> str:
        """The last assistant message's text: what built-in rewards (exact_match, ...) score."""
        return next((m["content"] for m in reversed(self.messages) if m["role"] == "assistant"), "")

    def logged_messages(self) -> list[dict]:
        """The messages, and after a cut the environment's answer the model never read, marked with the cut."""
        return self.messages + [{**m, "cut": self.cut} for m in self.unseen]

    def rendered(self, tokenizer) -> dict:
        """Exactly the ids the model read, decoded, special tokens kept: the prompt, then each run of the model's
        own tokens and of the template's (the environment's messages as rendered between turns)."""
        runs: list[dict] = []
        for tok, by_model in zip(self.ids, self.action):
            who = "model" if by_model else "template"
            if not runs or runs[-1]["by"] != who:
                runs.append({"by": who, "ids": []})
            runs[-1]["ids"].append(tok)
        decode = lambda ids: tokenizer.decode(ids, skip_special_tokens=False)  # noqa: E731
        return {"prompt": decode(self.prompt_ids), "turns": [{"by": r["by"], "text": decode(r["ids"])} for r in runs]}

    def transcript(self) -> str:
        """The episode as readable lines, for the console and completions.jsonl."""
        lines = []
        for m in self.logged_messages():
            calls = "".join(
                f" -> {c['function']['name']}({json.dumps(c['function']['arguments'])})"
                for c in m.get("tool_calls", [])
            )
            cut = f" (cut at env.max_{m['cut']}: never shown to the model)" if m.get("cut") else ""
            lines.append(
                f"[{m['role']}{'' if m['role'] != 'tool' else ' ' + m.get('name', '')}{cut}] "
                f"{text_of(m['content'])}{calls}"
            )
        if self.cut:
            lines.append(f"[cut at env.max_{self.cut}]")
        return "\n".join(lines)


class EnvTokens:
    """The environment's messages as the chat template renders them between two assistant turns, as ids:
    the suffix of a dummy conversation after the assistant's end-of-turn token (TRL's construction), so
    the model's own ids are never re-tokenised."""

    def __init__(self, tokenizer, eos_ids: list[int], chat_template: bool):
        self.tokenizer, self.eos, self.chat = tokenizer, set(eos_ids), chat_template
        self._prefixes: dict[str | None, tuple[list, list[int]]] = {}  # the dummy conversation, by tool name

    def _ids(self, messages, generation_prompt: bool, tools=None) -> list[int]:
        out = self.tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=generation_prompt, tokenize=True, return_dict=False
        )
        return list(out["input_ids"] if isinstance(out, dict) else out)

    def after_turn(self, new: list[dict], tool_name: str | None = None) -> list[int]:
        """Ids of `new` (tool messages, or one user observation) and the next assistant header."""
        if not self.chat:  # plain prompts: an observation is appended as its own text
            return self.tokenizer("".join(m["content"] for m in new), add_special_tokens=False)["input_ids"]
        if tool_name not in self._prefixes:
            assistant: dict[str, Any] = {"role": "assistant", "content": "x"}
            if tool_name is not None:
                assistant = {
                    "role": "assistant",
                    "content": "",
                    "tool_calls": [
                        {"type": "function", "id": "call00000", "function": {"name": tool_name, "arguments": {}}}
                    ],
                }
            dummy = [{"role": "user", "content": "x"}, assistant]
            prefix = self._ids(dummy, False)
            ends = [i for i, t in enumerate(prefix) if t in self.eos]
            self._prefixes[tool_name] = dummy, prefix[: ends[-1] + 1] if ends else prefix
        dummy, prefix = self._prefixes[tool_name]
        try:
            full = self._ids(dummy + new, True)
        except TypeError as e:  # a template that adds strings to a content given as parts
            if not any(content_parts(m["content"]) for m in new):
                raise
            raise GrpoError(
                f"The chat template cannot render a tool result given as a list of content parts ({e}); "
                "return a string from the tool, or use a template that renders content lists."
            ) from None
        if full[: len(prefix)] != prefix:
            raise GrpoError(
                "The chat template renders an assistant turn differently once a tool or user message "
                "follows it, so the environment's tokens cannot be appended as ids; use a template that "
                "renders a conversation's turns as prefixes of each other."
            )
        return full[len(prefix) :]

    def check_tools(self) -> None:
        """The template renders a tool call and its result (one sentence when it cannot)."""
        try:
            self.after_turn([{"role": "tool", "name": "f", "tool_call_id": "call00000", "content": "1"}], "f")
        except GrpoError:
            raise
        except Exception as e:  # the template's own failure, e.g. it has no tool role
            raise GrpoError(
                f"The model's chat template cannot render a tool call and its result ({type(e).__name__}: "
                f"{e}); use a model whose template supports tools, or a step environment."
            ) from None


def episodes_rollout(prompts, G, episodes: list[Episode], with_logprobs: bool, eos: list[int], model, tokenizer):
    """The Rollout whose rows are `episodes`: each one's prompt ids, then its ids, the model's trained."""
    device = next(model.parameters()).device
    for ep in episodes:
        if not ep.ids:  # nothing generated at all: one end-of-sequence token, as single-turn does
            ep.ids, ep.action, ep.logps = [eos[0]], [1], [0.0]
    return Rollout.of_rows(
        prompts,
        G,
        [ep.prompt_ids for ep in episodes],
        [ep.ids for ep in episodes],
        truncated=[ep.cut is not None for ep in episodes],
        sampled=[ep.action for ep in episodes],
        logps=[ep.logps for ep in episodes] if with_logprobs else None,
        device=device,
        completions=[ep.final_text for ep in episodes],
        pad_token_id=tokenizer.pad_token_id,
        episodes=episodes,
    )


def unseeded(i: int, j: int) -> int:
    """Episode j of prompt i's seed when sampling is greedy: each prompt's episodes still differ from another's
    (with data=none only the seed does)."""
    return group_seed("unseeded", i, "episode", j)


def episode_metrics(episodes: list[Episode], record) -> None:
    """The step's episode counts, per episode (means over episodes): turns, tool calls, errors, ..."""
    n = len(episodes)
    sums = {
        "env/turns": sum(ep.turns for ep in episodes),
        "env/tool_calls": sum(ep.tool_calls for ep in episodes),
        "env/tool_use_frac": sum(ep.tool_calls > 0 for ep in episodes),
        "env/errors": sum(ep.errors for ep in episodes),
        "env/timeouts": sum(ep.timeouts for ep in episodes),
        "env/non_string": sum(ep.non_string for ep in episodes),
        "env/truncated_results": sum(ep.truncated_results for ep in episodes),
        "env/cut_turns_frac": sum(ep.cut == "turns" for ep in episodes),
        "env/cut_tokens_frac": sum(ep.cut == "tokens" for ep in episodes),
        "env/episode_tokens": sum(len(ep.ids) for ep in episodes),
    }
    for k, v in sums.items():
        record.mean(k, float(v), n)
    # the step's wall time in environment calls: the environment phase that run/floors.py splits out of generation
    record.max("env/seconds", max((ep.env_wall for ep in episodes), default=0.0))
    record.sum("env/call_seconds", sum(ep.seconds for ep in episodes))  # summed: more than the wall when concurrent
    record.sum("multiturn/prefill_tokens", sum(ep.context_tokens for ep in episodes))
    record.sum("multiturn/kv_reused_tokens", sum(ep.kv_reused for ep in episodes))
    record.mean(
        "multiturn/prefix_break_rate",
        sum(ep.prefix_breaks for ep in episodes),
        sum(max(ep.turns - 1, 0) for ep in episodes),
    )
    if any(ep.requests or ep.failed for ep in episodes):  # env.agent
        record.mean("agent/failed_frac", float(sum(ep.failed is not None for ep in episodes)), n)
        record.mean("agent/requests", float(sum(ep.requests for ep in episodes)), n)
        record.sum("agent/dropped_tokens", sum(ep.dropped_tokens for ep in episodes))
        record.sum("agent/unanswered", sum(ep.unanswered for ep in episodes))
        for key in sorted({k for ep in episodes for k in ep.metrics}):
            values = [ep.metrics[key] for ep in episodes if key in ep.metrics]
            record.mean(f"agent/{key}", sum(values), len(values))
