"""Multi-turn episodes: the model calls tools or acts in an environment, turn after turn, and is
rewarded for the whole episode (docs/math.md, "Episodes").

A rollout of one prompt is an episode: the model generates until it stops (an end-of-sequence token);
its turn is parsed for tool calls (or handed to a step environment); the environment's answer is
rendered by the chat template and appended *as token ids*; the model continues from the joined ids;
until no tool is called, the environment says done, `env.max_turns` turns were taken or `env.max_tokens`
tokens are spent. What is trained on is exactly the ids the model generated with the environment's ids
spliced in, never re-tokenised text; the Rollout's `completion_mask` is the action mask (the model's
own tokens), so the environment's tokens are context for the loss, the KL and the entropy, and one
forward scores the whole episode.

How it works in detail: docs/internals.md, grpo_cli/episodes/driver.py.
"""

from __future__ import annotations

import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import replace
from typing import Callable

from grpo_cli.config import SamplerConfig
from grpo_cli.episodes.environments import EnvSpec, RemoteMethod, Timeout, call_with_timeout, reset_arguments
from grpo_cli.episodes.episode import EnvTokens, Episode, episodes_rollout, unseeded
from grpo_cli.episodes.kinds import ENV_KINDS
from grpo_cli.episodes.rng import global_draws, seeded
from grpo_cli.errors import GrpoError
from grpo_cli.generate.base import replace_live
from grpo_cli.generate.hf import eos_token_ids
from grpo_cli.generate.turn_cache import count_prefill
from grpo_cli.samples.rollout import Rollout, group_seed


def with_env(generator, env, tokenizer, *, chat_template: bool, system_prompt: str | None = None):
    """`generator` driven turn by turn through `env` (an environments.EnvSpec), or as it is without one."""
    if env is None:
        return generator
    episodes = EpisodeGenerator(generator, env, tokenizer, chat_template=chat_template, system_prompt=system_prompt)
    replace_live(generator, episodes)  # closed by the episode driver, with its environment workers
    return episodes


class EpisodeGenerator:
    """A generator (hf, vllm, ...) driven turn by turn through an environment: same `generate` as any
    generator, returning a Rollout whose rows are whole episodes (`roll.episodes`)."""

    takes_columns = True  # generate(..., columns=) hands each prompt's dataset row to reset()

    def __init__(self, base, spec: EnvSpec, tokenizer, *, chat_template: bool, system_prompt: str | None = None):
        self.base, self.spec, self.tokenizer, self.cfg = base, spec, tokenizer, spec.cfg
        self.chat_template, self.system_prompt = chat_template, system_prompt
        self.returns_logprobs, self.needs_weights = base.returns_logprobs, base.needs_weights
        ENV_KINDS[spec.kind].start(self)  # a kind's own checks and set-up (tools: the tool-call format)
        # names bound to the shared global generators make concurrent calls unrepeatable: those run one at a time
        # (in environment workers, each call has its process's shared generators to itself)
        self.concurrency = 1 if spec.shared_draws and spec.workers is None else self.cfg.concurrency
        self._pool = ThreadPoolExecutor(self.concurrency, "grpo-episode") if self.concurrency > 1 else None
        self.tokenizing = threading.Lock()  # a fast tokenizer is not to be used from two threads at once
        self.opened: list = []  # the last call's environments, closed once they are scored
        if not callable(getattr(base, "complete", None)):
            raise GrpoError(
                f"The generator {type(base).__name__} cannot continue an episode from its token ids (it has "
                "no complete method); use generator=hf or generator=vllm with env.tools or env.factory."
            )

    def check_tools(self) -> None:
        """The chat template renders a tool call and its result (one sentence when it cannot)."""
        EnvTokens(self.tokenizer, [self.tokenizer.eos_token_id], True).check_tools()

    def update(self, model) -> None:
        self.base.update(model)

    def sleep(self) -> None:
        self.base.sleep()

    def close_environments(self) -> None:
        """The last call's episodes are scored: an environment with a close() (an OpenEnv session) is closed."""
        opened, self.opened = self.opened, []
        for environment in opened:
            close = getattr(environment, "close", None)
            if callable(close):
                close()

    def close(self) -> None:
        self.close_environments()
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
        if self.spec.workers is not None:
            self.spec.workers.close()
        self.base.close()

    def _each(self, fn: Callable, items: list[tuple]) -> list:
        """fn(*item) for every item, in order, up to env.concurrency at a time. Should the shared global
        generators move meanwhile (an environment draws through a name bound before they were made per
        thread), the rest of the run makes its calls one at a time, and says so."""
        if self._pool is None or len(items) < 2:
            return [fn(*item) for item in items]
        before = global_draws()
        out = list(self._pool.map(lambda item: fn(*item), items))
        if global_draws() != before:
            warnings.warn(
                "an environment drew from Python's or NumPy's shared random generator during concurrent "
                "calls, so this step's transcripts may not repeat; the rest of the run calls the "
                "environment one episode at a time (draw from self.rng, or set env.concurrency=1).",
                RuntimeWarning,
                stacklevel=2,
            )
            self._pool.shutdown(wait=False)
            self._pool, self.concurrency = None, 1
        return out

    # -- one episode's environment calls --------------------------------------------------------------
    def call(self, ep: Episode, fn: Callable, *args, **kwargs):
        """fn under the episode's seed and the deadline: (value, None) or (None, the error text)."""
        t, seed = time.perf_counter(), group_seed(ep.seed, "env", ep.calls)
        try:  # one at a time, the shared generators are seeded too (a name bound to them draws from there)
            with seeded(seed) if self.concurrency == 1 else nullcontext():
                if isinstance(fn, RemoteMethod):  # env.workers: made where the environment lives
                    return fn.remote_call(args, kwargs, self.cfg.timeout_s, seed), None
                return call_with_timeout(fn, args, kwargs, self.cfg.timeout_s, seed), None
        except Timeout as e:
            ep.timeouts += 1
            return None, str(e)
        except Exception as e:  # the environment's own failure becomes what the model reads
            ep.errors += 1
            return None, str(e)
        finally:
            ep.calls += 1
            ep.seconds += time.perf_counter() - t

    def bounded(self, ep: Episode, text: str) -> str:
        """A tool result or observation cut, with a marker, to what env.max_tokens could hold (8 characters a
        token), before it is rendered and tokenized: a 50 MB result costs a slice, not a tokenizer pass."""
        limit = 8 * self.cfg.max_tokens
        if len(text) <= limit:
            return text
        ep.truncated_results += 1
        return f"{text[:limit]}... [truncated: {len(text) - limit:,} more characters]"

    def _start(self, prompt: str, prompt_ids: list[int], row: dict, seed: int) -> Episode:
        ep = Episode(prompt_ids=list(prompt_ids), seed=seed)
        ep.environment = self.spec.new(row, group_seed(seed, "rng"))
        reset = getattr(ep.environment, "reset", None)
        if reset is None:
            return ep
        text, error = self.call(ep, reset, **reset_arguments(row))
        if error is not None:
            raise GrpoError(f"env.factory={self.cfg.factory}: reset() failed ({error}); fix the environment's reset.")
        if text:
            ep.observation = text if isinstance(text, str) else None
            if not isinstance(text, str):
                raise GrpoError(
                    f"env.factory={self.cfg.factory}: reset() returned {type(text).__name__}; it must return "
                    "None or the text to append to the prompt."
                )
            with self.tokenizing:
                ep.prompt_ids = self._prompt_with(prompt, row, text)
        return ep

    def _prompt_with(self, prompt: str, row: dict, text: str) -> list[int]:
        """The prompt's ids with `text` appended to its last user message (reset()'s observation)."""
        from grpo_cli.data.prompts import USER_PROMPT, chat_messages
        from grpo_cli.rewards import PROMPT_MESSAGES

        if not self.chat_template:
            return self.base.encode([prompt + text])[0]
        value = row.get(PROMPT_MESSAGES) or row.get(USER_PROMPT)
        if value is None:
            raise GrpoError(
                "reset() returned text for the prompt, but the prompt's messages are unknown here; "
                "return None from reset() or give the data as chat messages."
            )
        messages = chat_messages(value, self.system_prompt)
        messages[-1] = {**messages[-1], "content": messages[-1]["content"] + text}
        rendered = self.tokenizer.apply_chat_template(
            messages, tools=self.spec.schemas_for(row) or None, tokenize=False, add_generation_prompt=True
        )
        return self.base.encode([rendered])[0]

    # -- the loop -------------------------------------------------------------------------------------
    def generate(
        self,
        model,
        prompts: list[str],
        group_size: int,
        sampling: SamplerConfig,
        seeds: list[int] | None = None,
        *,
        with_logprobs: bool = False,
        columns: dict | None = None,
    ) -> Rollout:
        prompts, G, cfg = list(prompts), group_size, self.cfg
        seeds = self.base.group_seeds(prompts, sampling, seeds)
        prompt_ids = self.base.encode(prompts)
        columns = columns or {}
        rows = [{k: v[i] for k, v in columns.items()} for i in range(len(prompts))]
        eos = eos_token_ids(model, self.tokenizer)
        env_tokens = EnvTokens(self.tokenizer, eos, self.chat_template)
        self.close_environments()  # the last call's episodes are scored: their environments can go
        if self.spec.workers is not None:
            self.spec.workers.release()
        t_env = time.perf_counter()
        starts = [
            (p, prompt_ids[i], rows[i], group_seed(seeds[i], "episode", j) if seeds is not None else unseeded(i, j))
            for i, p in enumerate(prompts)
            for j in range(G)
        ]
        episodes = self._each(self._start, starts)
        self.opened = [ep.environment for ep in episodes if ep.environment is not None]
        live, env_wall = list(episodes), time.perf_counter() - t_env
        session = getattr(self.base, "session", None)  # hf: each turn starts from the last one's keys and values
        with session() if session is not None else nullcontext():
            for turn in range(cfg.max_turns):
                budget = [cfg.max_tokens - len(ep.ids) for ep in live]
                turn_sampling = replace(sampling, max_new_tokens=max(1, min(sampling.max_new_tokens, max(budget))))
                turn_seeds = None if sampling.greedy else [group_seed(ep.seed, "turn", turn) for ep in live]
                contexts = [ep.prompt_ids + ep.ids for ep in live]
                outs = self.base.complete(model, contexts, turn_sampling, turn_seeds, with_logprobs=with_logprobs)
                count_prefill(live, contexts, getattr(self.base, "turns", None), turn)
                acted = [(ep, *took_turn(ep, room, out), turn, env_tokens) for ep, room, out in zip(live, budget, outs)]
                t_env = time.perf_counter()
                self._each(self._after_turn, acted)
                env_wall += time.perf_counter() - t_env
                live = [ep for ep in live if not ep.done]  # the last turn ends every episode (_after_turn)
                if not live:
                    break
        for ep in episodes:
            ep.env_wall = env_wall
        return episodes_rollout(prompts, G, episodes, with_logprobs, eos, model, self.tokenizer)

    def _after_turn(self, ep: Episode, ids: list[int], finished: bool, turn: int, env_tokens: EnvTokens) -> None:
        """The environment's answer to one episode's turn, appended (run concurrently across episodes)."""
        with self.tokenizing:
            text = self.tokenizer.decode(ids, skip_special_tokens=True)
        if not finished:  # the turn hit the token limit without ending: nothing to act on
            ep.messages.append({"role": "assistant", "content": text})
            ep.done, ep.cut = True, "tokens"
            return
        answer = ENV_KINDS[self.spec.kind].turn(self, ep, ids, text, env_tokens, turn)
        if answer is None:  # the episode ended in this turn
            return
        new, tool_name = answer
        if turn + 1 == self.cfg.max_turns:
            ep.done, ep.cut, ep.unseen = True, "turns", new
            return
        with self.tokenizing:
            suffix = env_tokens.after_turn(new, tool_name)
        if len(ep.ids) + len(suffix) >= self.cfg.max_tokens:  # no room for the answer and a reply
            ep.done, ep.cut, ep.unseen = True, "tokens", new
            return
        ep.messages += new
        ep.ids += suffix
        ep.action += [0] * len(suffix)
        ep.logps += [0.0] * len(suffix)


def took_turn(ep: Episode, room: int, out: tuple) -> tuple[list[int], bool]:
    """The model's turn (ids, log-probs, whether it ended) appended to `ep` within its `room` of tokens:
    (the turn's ids, whether it ended)."""
    ids, logps, finished = out
    if len(ids) > room:  # past the episode's token budget
        ids, logps, finished = ids[:room], (logps[:room] if logps is not None else None), False
    ep.ids += ids
    ep.action += [1] * len(ids)
    ep.logps += list(logps) if logps is not None else [0.0] * len(ids)
    ep.turns += 1
    return ids, finished
