"""An agent's requests as token-exact trajectories (docs/how-to/agents.md, "What is trained"): each request's ids,
continuing the episode's chain of sampled and environment ids when its messages extend the last request and the
reply it got, or starting a new chain when they do not; and the OpenAI response for what was sampled, each choice
kept until the agent's next request shows which one it went on with."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from grpo_cli.episodes.endpoint import Refusal, chat_choice, normal, response, same_reply, text_choice, wire_logprobs
from grpo_cli.episodes.episode import EnvTokens, Episode
from grpo_cli.episodes.kinds import parse_turn, start_tools


@dataclass
class Choice:
    """One sampled reply of a request: what the agent got, and the ids behind it."""

    message: dict  # the assistant message (chat) as the agent will send it back, or {"text": ...} (completions)
    ids: list[int]
    logps: list[float] | None
    calls: int  # tool calls in it (they number the next reply's calls)
    forced: list[int] = field(default_factory=list)  # a forced tool_choice's opening, before `ids`: context


@dataclass
class Run:
    """An episode's state on the endpoint side."""

    key: str
    ep: Episode
    row: dict
    messages: list | None = None  # the chain's last request (chat), normalised
    tools: Any = None
    text: str | None = None  # completions: the chain's text so far, before the pending reply
    forced: tuple[list[int], str] = ([], "")  # the pending request's forced tool-call opening: ids, text
    replies: list[Choice] = field(default_factory=list)  # the last answer's choices, not yet part of the chain
    delivered: bool = False  # the last answer reached the agent
    unsent: bool = False  # an answer is made and not yet written
    turn: int = 0  # requests answered, all chains
    calls: int = 0  # tool calls taken into the chain
    since: float = 0.0  # when the agent last had control: its start, or its last answer's delivery
    in_request: bool = False  # the endpoint holds one of its requests: the agent is not the one running
    queued: bool = False  # that request waits for a decode batch
    admitted: bool = False
    done: bool = False
    cancel: Callable | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)  # one request of an episode at a time
    records: list[dict] = field(default_factory=list)  # per request: the prompt ids and each choice's ids


class Chains:
    """The trajectories of one run's agents: what a request's ids are, and what its answer says (one request of an
    episode at a time, under `tokenizing`: a fast tokenizer is not to be used from two threads at once)."""

    def __init__(self, tokenizer, cfg, model_name: str):
        self.tokenizer, self.cfg, self.model_name = tokenizer, cfg, model_name
        self.chat_template, self.tokenizing = True, threading.Lock()
        start_tools(self)  # the tool-call format the replies are read with (sets .format and .specials)
        self.env_tokens = EnvTokens(tokenizer, [tokenizer.eos_token_id], True)  # each step: start()
        self.eos: list[int] = []
        self.rendered: dict[str, list[int]] = {}

    def check_tools(self) -> None:
        EnvTokens(self.tokenizer, [self.tokenizer.eos_token_id], True).check_tools()

    def start(self, eos: list[int]) -> None:
        """A step: its EOS ids, and the renders of the last step forgotten."""
        self.eos, self.env_tokens, self.rendered = eos, EnvTokens(self.tokenizer, eos, True), {}

    def context(self, run: Run, route: str, body: dict) -> list[int]:
        with self.tokenizing:
            return self.chat_context(run, body) if route == "chat/completions" else self.text_context(run, body)

    def chat_context(self, run: Run, body: dict) -> list[int]:
        """The ids the model reads for a chat request (_chat_context), then, for a forced tool_choice, the opening
        of the call the template writes: the reply continues from there."""
        context = self._chat_context(run, body)
        choice = body.get("tool_choice")
        if choice not in (None, "auto", "none"):
            run.forced = self.forced(run.messages or [], body.get("tools") or None, choice)
        return context + run.forced[0]

    def forced(self, messages: list[dict], tools, choice) -> tuple[list[int], str]:
        """What the reply starts with under tool_choice "required" (the template's text before a call's name) or a
        named function (that text and the name): the model writes the rest of the call. Its ids are context."""
        names = [t.get("function", {}).get("name") for t in tools or [] if isinstance(t, dict)]
        named = choice.get("function", {}).get("name") if isinstance(choice, dict) else None
        if not (choice == "required" or (named is not None and choice.get("type") == "function")):
            raise Refusal(
                400, f"tool_choice {choice!r} is none of auto, none, required or a function.", "invalid_tool_choice"
            )
        if not names or (named is not None and named not in names):
            raise Refusal(
                400,
                f"tool_choice names {named or 'a call'}, which this request's tools do not hold.",
                "invalid_tool_choice",
            )
        mark = "grpo_forced_call_name"
        call = {"id": "call0", "type": "function", "function": {"name": mark, "arguments": {}}}
        try:
            head = self.tokenizer.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
            whole = self.tokenizer.apply_chat_template(
                [*messages, {"role": "assistant", "content": "", "tool_calls": [call]}], tools=tools, tokenize=False
            )
        except Exception as e:  # the template's own refusal
            raise Refusal(
                400, f"The chat template cannot render a tool call here ({e}).", "invalid_tool_choice"
            ) from None
        if not whole.startswith(head) or mark not in whole[len(head) :]:
            raise Refusal(
                400,
                "This model's chat template does not write a tool call right after its generation prompt, so a forced "
                "tool_choice cannot be served; use auto.",
                "unsupported_parameter",
            )
        text = whole[len(head) : whole.index(mark, len(head))] + (named or "")
        return self.tokenizer(text, add_special_tokens=False)["input_ids"], text

    def _chat_context(self, run: Run, body: dict) -> list[int]:
        """The ids the model reads for a chat request: the chain continued (its last reply's ids, then the new
        messages as the template renders them between turns), or a new chain rendered whole."""
        run.forced = ([], "")
        messages, tools = [normal(m) for m in body.get("messages") or []], body.get("tools") or None
        if not messages:
            raise Refusal(400, "messages is empty; send the conversation so far.", "invalid_messages")
        ep, last = run.ep, run.messages
        if last is not None and tools == run.tools and messages[: len(last)] == last and len(messages) > len(last):
            taken = next((c for c in run.replies if same_reply(c.message, messages[len(last)])), None)
            new = messages[len(last) + 1 :]
            if taken is not None and all(m["role"] != "assistant" for m in new):
                self.take(run, taken)
                names = {c["id"]: c["function"]["name"] for c in taken.message.get("tool_calls", [])}
                new = [
                    {**m, "name": names.get(m.get("tool_call_id"), m.get("name"))} if m["role"] == "tool" else m
                    for m in new
                ]
                first_call = next(iter(names.values()), None)
                self.limits(run, new)
                suffix = self.env_tokens.after_turn(new, first_call)
                if len(ep.ids) + len(suffix) >= self.cfg.max_tokens:
                    ep.done, ep.cut, ep.unseen = True, "tokens", new
                    raise Refusal(
                        400, f"The episode reached env.max_tokens={self.cfg.max_tokens}.", "context_length_exceeded"
                    )
                ep.messages += new
                ep.ids += suffix
                ep.action += [0] * len(suffix)
                ep.logps += [0.0] * len(suffix)
                run.messages = messages
                return ep.prompt_ids + ep.ids
        self.limits(run, messages)
        self.new_chain(run)
        ep.prompt_ids = self.render(messages, tools)
        run.messages, run.tools = messages, tools
        ep.messages = []
        return ep.prompt_ids

    def render(self, messages: list[dict], tools) -> list[int]:
        """The chat template's ids for a conversation, once per step for the same one (a group's first requests)."""
        key = json.dumps([messages, tools], sort_keys=True)
        if key not in self.rendered:
            try:
                ids = self.tokenizer.apply_chat_template(
                    messages, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
                )
            except Exception as e:  # the template's own refusal of these messages
                raise Refusal(
                    400,
                    f"The chat template cannot render these messages ({type(e).__name__}: {e}).",
                    "invalid_messages",
                ) from None
            self.rendered[key] = list(ids["input_ids"] if isinstance(ids, dict) else ids)
        return list(self.rendered[key])

    def text_context(self, run: Run, body: dict) -> list[int]:
        """completions: a prompt that extends the chain's text and one of its replies continues the chain."""
        prompt = body.get("prompt")
        prompt = prompt[0] if isinstance(prompt, list) and len(prompt) == 1 else prompt
        if not isinstance(prompt, str):
            raise Refusal(400, "prompt must be one string.", "invalid_prompt")
        ep = run.ep
        if run.text is not None:
            taken = next((c for c in run.replies if prompt.startswith(run.text + c.message["text"])), None)
            if taken is not None:
                self.take(run, taken)
                rest = prompt[len(run.text) + len(taken.message["text"]) :]
                suffix = self.tokenizer(rest, add_special_tokens=False)["input_ids"] if rest else []
                ep.ids += suffix
                ep.action += [0] * len(suffix)
                ep.logps += [0.0] * len(suffix)
                ep.messages.append({"role": "user", "content": rest})
                run.text = prompt
                return ep.prompt_ids + ep.ids
        self.limits(run, [])
        self.new_chain(run)
        ep.prompt_ids = self.tokenizer(prompt, add_special_tokens=True)["input_ids"]
        run.text = prompt
        return ep.prompt_ids

    def limits(self, run: Run, new: list[dict]) -> None:
        if run.turn >= self.cfg.max_turns:
            run.ep.cut, run.ep.unseen = "turns", new
            raise Refusal(400, f"The episode took env.max_turns={self.cfg.max_turns} turns.", "max_turns_reached")

    def new_chain(self, run: Run) -> None:
        """A request that does not extend the chain: the chain so far is dropped from training (counted)."""
        ep = run.ep
        if run.messages is not None or run.text is not None:
            ep.prefix_breaks += 1
            ep.dropped_tokens += sum(ep.action) + sum(len(c.ids) for c in run.replies[:1])
        ep.ids, ep.action, ep.logps, run.replies = [], [], [], []

    def take(self, run: Run, choice: Choice) -> None:
        """The reply the agent went on with joins the chain: its ids, trained."""
        ep = run.ep
        ep.ids += choice.forced + choice.ids
        ep.action += [0] * len(choice.forced) + [1] * len(choice.ids)
        ep.logps += [0.0] * len(choice.forced)
        ep.logps += list(choice.logps) if choice.logps is not None else [0.0] * len(choice.ids)
        ep.turns += 1
        ep.tool_calls += choice.calls
        run.calls += choice.calls
        if "role" in choice.message:
            ep.messages.append(choice.message)
        else:
            ep.messages.append({"role": "assistant", "content": choice.message["text"]})
        run.replies = []

    def answer(self, run: Run, route: str, body: dict, outs: list, tops: list | None = None) -> dict:
        """The OpenAI response for `outs` (ids, log-probs, ended per choice), each choice kept to join the chain
        once the agent's next request shows it went on with it."""
        stops = body.get("stop") or []
        stops = [stops] if isinstance(stops, str) else list(stops)
        parse = route == "chat/completions" and bool(body.get("tools")) and body.get("tool_choice") != "none"
        with self.tokenizing:
            logprobs = bool(body.get("logprobs"))
            made = [
                self.choice(run, i, out, stops, parse, route, logprobs, tops[i] if tops else None)
                for i, out in enumerate(outs)
            ]
        run.replies = [choice for _, choice in made]
        prompt_tokens = len(run.ep.prompt_ids) + len(run.ep.ids)
        used = sum(len(choice.ids) for choice in run.replies)
        kind = "chat.completion" if route == "chat/completions" else "text_completion"
        return response(kind, f"grpo-{run.key}-{run.turn}", self.model_name, [w for w, _ in made], prompt_tokens, used)

    def choice(self, run: Run, index: int, out: tuple, stops: list[str], parse: bool, route: str, logprobs: bool, top):
        """One sampled reply: (its wire form, the Choice that joins the chain if the agent goes on with it)."""
        ids, logps, ended = out
        ids, logps, stopped = at_stop(self.tokenizer, ids, logps, stops)
        forced, opening = run.forced
        text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if stopped:
            text = text[: min(text.find(s) for s in stops if s in text)]
        read = opening + text if forced else text
        content, calls = parse_turn(self, forced + ids, read, set(self.eos)) if parse else (text, [])
        good = [c for c in calls if "error" not in c]
        reason = "tool_calls" if good else "stop" if ended or stopped else "length"
        lp = None
        if logprobs and logps is not None:
            named = [[(self.tokenizer.decode([t]), v) for t, v in alts] for alts in top[: len(ids)]] if top else None
            lp = wire_logprobs([self.tokenizer.decode([t]) for t in ids], logps, named)
        if route != "chat/completions":
            return text_choice(index, text, reason, lp), Choice({"text": text}, ids, logps, 0)
        wire = chat_choice(index, content, good, run.calls, reason, lp)
        return wire, Choice(normal(wire["message"]), ids, logps, len(calls), forced)

    def finish(self, run: Run) -> None:
        """The step is over: the last answer joins the chain (its first choice) if it reached the agent."""
        if run.replies and run.delivered:
            self.take(run, run.replies[0])
        elif run.replies:  # an answer that never reached the agent is not its trajectory
            run.ep.unanswered += 1


def cut(out: tuple, room: int) -> tuple:
    """A row's (ids, log-probs, ended) kept within `room` tokens (a batch decodes to its longest request's cap)."""
    ids, logps, ended = out
    if len(ids) > room:
        return ids[:room], (logps[:room] if logps is not None else None), False
    return ids, logps, ended


def at_stop(tokenizer, ids: list[int], logps, stops: list[str]):
    """The ids up to the token that completes the first stop string (kept: the model wrote it), or all of them."""
    if not stops:
        return ids, logps, False
    text = tokenizer.decode(ids, skip_special_tokens=True)
    if not any(s in text for s in stops):
        return ids, logps, False
    for k in range(1, len(ids) + 1):
        if any(s in tokenizer.decode(ids[:k], skip_special_tokens=True) for s in stops):
            return ids[:k], (logps[:k] if logps is not None else None), True
    return ids, logps, True
