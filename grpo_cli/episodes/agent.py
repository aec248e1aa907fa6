"""Agents written as ordinary code (`env.agent=FILE.py:FUNC`; docs/how-to/agents.md): the user's function
drives the episode through an OpenAI-style client pointed at the run's own endpoint (endpoint.py), and the
trainer records the exact tokens it sampled.

`async def FUNC(client, model, row) -> float | dict` (a plain `def` gets a synchronous client and runs on its
own thread). Each request's prompt is rendered by the chat template; a request that extends the episode's
last one (its messages, then the reply it got, then tool or user messages) continues the same token sequence:
the reply's sampled ids, then the new messages' ids as the in-process episodes append them (driver.EnvTokens).
A request that does not starts a new chain, and the episode trains on its last chain (a prefix break, counted).
Requests from all episodes are gathered into decode batches (`AgentGenerator.serve`).
"""

from __future__ import annotations

import copy
import threading
import time
import warnings
from dataclasses import dataclass, field, replace
from typing import Any

from grpo_cli.episodes.agent_host import AgentHost, load_agent
from grpo_cli.episodes.chains import Chains, Run, cut
from grpo_cli.episodes.endpoint import Endpoint, Refusal, request_options
from grpo_cli.episodes.episode import Episode, episodes_rollout, unseeded
from grpo_cli.episodes.rng import bound_globally
from grpo_cli.errors import GrpoError
from grpo_cli.generate.base import replace_live
from grpo_cli.generate.hf import eos_token_ids
from grpo_cli.generate.turn_cache import count_prefill
from grpo_cli.samples.rollout import Rollout, group_seed

MODEL_NAME = "policy"  # the model name the endpoint answers to


class AgentSpec:
    """What env.agent names, loaded: the function and whether it is a coroutine function."""

    kind, workers, cls = "agent", None, None
    schemas: list[dict] = []  # the agent shows its own tools in its requests
    tools: list = []
    reward_name = "agent"  # its returned reward is the reward term `agent`

    def __init__(self, cfg):
        try:
            import openai  # noqa: F401 - the client handed to the agent
        except ImportError:
            raise GrpoError(
                "env.agent needs the openai package for the client it hands the agent; "
                "pip install 'grpo-cli[agent]' (or pip install openai)."
            ) from None
        self.cfg = cfg
        if getattr(cfg, "workers", 0):  # the agents run in helper processes: this one never imports them
            from grpo_cli.episodes.agent_workers import AgentWorkers

            self.workers = AgentWorkers(cfg)
            self.fn, self.max_reward, self.shared_draws = None, self.workers.max_reward, []
            return
        self.fn = load_agent(cfg)
        self.max_reward = float(getattr(self.fn, "max_reward", 1.0))
        self.shared_draws = bound_globally([self.fn])

    def schemas_for(self, row: dict) -> list[dict]:
        return []  # the agent sends its own tools with each request

    def score_with(self, reward) -> None:
        reward.add_environment_term(self.reward_name, self.max_reward)


@dataclass
class Request:
    run: Run
    context: list[int]
    seeds: list[int]
    max_new: int
    logprobs: bool
    sampling: tuple[float, float]  # temperature, top_p
    top: int = 0  # top_logprobs: the alternatives asked per token
    event: threading.Event = field(default_factory=threading.Event)
    result: list | Refusal | None = None  # (ids, logps, finished) per choice, or a Refusal
    tops: list | None = None  # per choice, per token: the `top` most likely (id, log-prob)


class AgentGenerator:
    """A generator (hf, ...) serving the user's agent through the endpoint: `generate` runs one episode per
    prompt and group member, and returns a Rollout whose rows are their trained chains."""

    takes_columns = True

    def __init__(self, base, spec: AgentSpec, tokenizer, *, chat_template: bool, system_prompt: str | None = None):
        self.base, self.spec, self.cfg, self.tokenizer = base, spec, spec.cfg, tokenizer
        self.system_prompt = system_prompt  # chat_template: always on (a rule refuses env.agent without it)
        self.returns_logprobs, self.needs_weights = base.returns_logprobs, base.needs_weights
        self.chains = Chains(tokenizer, self.cfg, MODEL_NAME)
        self.endpoint = Endpoint(self.answer, MODEL_NAME, self.sent)
        self.host: Any = spec.workers or AgentHost(spec.fn, self.report)  # where the agents run
        if spec.workers is not None:
            spec.workers.bind(self.report, self.endpoint)
        self.stopped = threading.Event()  # the step ended: no more of its agents start
        self.runs: dict[str, Run] = {}
        self.cond = threading.Condition()
        self.queue: list[Request] = []
        self.records: list[list[dict]] = []  # the last generate's requests, per episode (for tests and debugging)

    def update(self, model) -> None:
        self.base.update(model)

    def sleep(self) -> None:
        self.base.sleep()

    def close(self) -> None:
        self.endpoint.close()
        self.host.close()
        self.base.close()

    # -- one step's episodes ---------------------------------------------------------------------------
    def generate(self, model, prompts, group_size, sampling, seeds=None, *, with_logprobs=False, columns=None):
        prompts, G = list(prompts), group_size
        seeds = self.base.group_seeds(prompts, sampling, seeds)
        columns = columns or {}
        self.eos = eos_token_ids(model, self.tokenizer)
        self.chains.start(self.eos)
        self.sampling, self.with_logprobs = sampling, with_logprobs
        runs = []
        for i in range(len(prompts)):
            row = self._row({k: v[i] for k, v in columns.items()})
            for j in range(G):
                seed = group_seed(seeds[i], "episode", j) if seeds is not None else unseeded(i, j)
                key = f"{group_seed(seed, 'key', self.endpoint.key):x}"
                runs.append(Run(key, Episode(prompt_ids=[], seed=seed), row))
        self.runs = {r.key: r for r in runs}
        for r in runs:
            self.endpoint.open(r.key)
        if self.spec.workers is not None:
            self.spec.workers.revive()
        self.stopped = stopped = threading.Event()
        threading.Thread(target=self._admit, args=(runs, stopped), name="grpo-agent-admit", daemon=True).start()
        session = getattr(self.base, "session", None)
        try:
            if session is None:
                self.serve(model, runs)
            else:
                with session() as turns:
                    turns.keep = True  # an episode's next request may come in another batch
                    self.serve(model, runs)
        finally:
            for r in runs:
                self.endpoint.close_episode(r.key)
            with self.cond:
                self.stopped.set()
                self.cond.notify_all()
                for request in self.queue:  # the step ended (a failure of its own) with requests unanswered
                    request.result = Refusal(410, "The step ended before this request was served.", "episode_closed")
                    request.event.set()
                self.queue = []
        return self._rollout(model, prompts, G, runs, with_logprobs)

    def _row(self, row: dict) -> dict:
        """What the agent gets: the dataset row, its prompt as chat messages (the system prompt included)."""
        from grpo_cli.data.prompts import USER_PROMPT, chat_messages
        from grpo_cli.rewards import PROMPT_MESSAGES

        value = row.get(PROMPT_MESSAGES) or row.get(USER_PROMPT)
        out = {k: v for k, v in row.items() if not k.startswith("_")}
        out["prompt"] = chat_messages(value, self.system_prompt) if value is not None else []
        return out

    def _admit(self, runs: list[Run], stopped: threading.Event) -> None:
        """Start the episodes' agents in order, each once fewer than env.concurrency run (on the host: this
        process, or the agent workers)."""
        for r in runs:
            with self.cond:
                self.cond.wait_for(
                    lambda: stopped.is_set() or sum(x.admitted and not x.done for x in runs) < self.cfg.concurrency
                )
                if stopped.is_set():
                    return
                r.admitted, r.since = True, time.monotonic()
                self.cond.notify_all()
            where = self._where(r)
            row = {**copy.deepcopy(r.row), "_endpoint": where}
            r.cancel = self.host.start(r.key, row, group_seed(r.ep.seed, "rng"), where)

    def report(self, key: str, reward: float | None, metrics: dict, failed: str | None) -> None:
        """An agent ended: its reward and metrics, or why it failed (the episode then goes unscored; the run goes
        on). One that was timed out already stays so."""
        with self.cond:
            run = self.runs.get(key)
            if run is None or run.done:
                return
            if failed is None and reward is not None:
                run.ep.reward, run.ep.metrics = reward, metrics
            else:
                run.ep.failed = failed or "the agent returned no reward"
            run.done = True
            self.cond.notify_all()

    def _where(self, run: Run) -> dict:
        return {"base_url": self.endpoint.base_url(run.key), "api_key": self.endpoint.key, "model": MODEL_NAME}

    # -- the decode batches -----------------------------------------------------------------------------
    def serve(self, model, runs: list[Run]) -> None:
        """Decode batches of the waiting requests until every episode is done. A batch goes once every agent that
        runs (or has a free slot to start in) waits on a request, as the in-process driver's turn waits for every
        episode: so the batches, and the bits each row gets, do not depend on timing. An agent whose own work
        holds a batch past env.timeout_s is timed out (_watch), and the batch goes without it."""
        while True:
            with self.cond:
                batch = self._gather(runs)
            if batch is None:
                return
            self._decode(model, batch)

    def _gather(self, runs: list[Run]) -> list[Request] | None:
        first = None
        while True:
            self._watch(runs)
            running = [r for r in runs if r.admitted and not r.done]
            if not self.queue and all(r.done and not r.unsent for r in runs):
                return None
            if self.queue:
                now = time.monotonic()
                first = first or now
                starting = len(running) < self.cfg.concurrency and any(not (r.admitted or r.done) for r in runs)
                waiting = all(r.queued for r in running) and not starting
                if waiting or now - first >= self.cfg.timeout_s:
                    batch, self.queue = self.queue, []
                    return batch
            self.cond.wait(timeout=0.005 if self.queue else 0.05)

    def _watch(self, runs: list[Run]) -> None:
        """An agent that has held control past env.timeout_s (its own code, between two requests) is timed out:
        its episode closes, unscored, and the agent is cancelled where it can be."""
        now = time.monotonic()
        for r in runs:
            if r.admitted and not r.done and not r.in_request and now - r.since > self.cfg.timeout_s:
                r.done, r.ep.failed = True, f"timeout: the agent ran {self.cfg.timeout_s:g} s without a request"
                r.ep.timeouts += 1
                self.endpoint.close_episode(r.key)
                if r.cancel is not None:
                    r.cancel()

    def _decode(self, model, batch: list[Request]) -> None:
        """The batch's requests decoded together, those asking other sampling settings (env.agent_sampling=request)
        in a batch of their own each."""
        for settings in dict.fromkeys(q.sampling for q in batch):
            self._decode_alike(model, [q for q in batch if q.sampling == settings], *settings)

    def _decode_alike(self, model, batch: list[Request], temperature: float, top_p: float) -> None:
        contexts = [q.context for q in batch for _ in q.seeds]
        seeds = [s for q in batch for s in q.seeds]
        sampling = replace(
            self.sampling, max_new_tokens=max(q.max_new for q in batch), temperature=temperature, top_p=top_p
        )
        with_logprobs = self.with_logprobs or any(q.logprobs for q in batch)
        try:
            outs = self.base.complete(
                model, contexts, sampling, None if sampling.greedy else seeds, with_logprobs=with_logprobs
            )
        except BaseException:
            for q in batch:
                q.result = Refusal(500, "Generation failed; the run's console says why.", "server_error")
                q.event.set()
            raise
        count_prefill([q.run.ep for q in batch for _ in q.seeds], contexts, getattr(self.base, "turns", None), 0)
        at = 0
        for q in batch:
            q.result = [cut(out, q.max_new) for out in outs[at : at + len(q.seeds)]]
            at += len(q.seeds)
            if q.top:
                q.tops = [alternatives(model, q.context, ids, temperature, q.top) for ids, _, _ in q.result]
        with self.cond:
            for q in batch:
                q.run.queued = False
                q.event.set()

    def _sampling(self, body: dict) -> tuple[float, float]:
        """(temperature, top_p) a request samples with: the run's, or with env.agent_sampling=request the request's
        where it gives them (held-out scoring stays greedy whatever the agent asks)."""
        run = (self.sampling.temperature, self.sampling.top_p)
        if self.cfg.agent_sampling != "request" or self.sampling.greedy:
            return run
        temperature, top_p = body.get("temperature"), body.get("top_p")
        temperature, top_p = run[0] if temperature is None else temperature, run[1] if top_p is None else top_p
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not 0 <= temperature <= 2:
            raise Refusal(400, "temperature must be a number from 0 to 2.", "invalid_temperature")
        if isinstance(top_p, bool) or not isinstance(top_p, (int, float)) or not 0 < top_p <= 1:
            raise Refusal(400, "top_p must be a number above 0 and at most 1.", "invalid_top_p")
        return float(temperature), float(top_p)

    # -- one request (on the endpoint's threads) -------------------------------------------------------
    def sent(self, key: str, reached: bool) -> None:
        """An answer was written (`reached`: to an agent still waiting for it). Until then the step does not end:
        whether the reply joins the chain must not depend on which thread runs first."""
        run = self.runs.get(key)
        if run is not None:
            with self.cond:
                run.unsent, run.delivered, run.since = False, reached, time.monotonic()
                self.cond.notify_all()

    def answer(self, key: str, route: str, body: dict) -> dict:
        run = self.runs.get(key)
        if run is None:
            raise Refusal(410, "This episode has closed.", "episode_closed")
        with run.lock:
            with self.cond:
                run.in_request = True
            try:
                return self._answer(run, route, body)
            finally:
                with self.cond:
                    run.in_request, run.since = False, time.monotonic()

    def _answer(self, run: Run, route: str, body: dict) -> dict:
        if run.done:
            raise Refusal(410, "This episode has closed: its agent ran past env.timeout_s.", "episode_closed")
        n, max_new, logprobs, top = request_options(body, self.sampling.max_new_tokens)
        sampling = self._sampling(body)
        context = self.chains.context(run, route, body)
        room = self.cfg.max_tokens - len(run.ep.ids) - len(run.forced[0])  # a forced call's opening counts
        seeds = [group_seed(run.ep.seed, "turn", run.turn, *(("choice", c) if c else ())) for c in range(n)]
        request = Request(run, context, seeds, max(1, min(max_new, room)), logprobs, sampling, top)
        with self.cond:
            run.queued, run.delivered = True, False
            self.queue.append(request)
            self.cond.notify_all()
        request.event.wait()
        if isinstance(request.result, Refusal):
            raise request.result
        assert request.result is not None
        run.turn += 1
        run.ep.requests += 1
        out = self.chains.answer(run, route, body, request.result, request.tops)
        with self.cond:
            run.unsent = True  # until the endpoint has written it (sent)
        run.records.append({"prompt_ids": context, "choices": [(ids, logps) for ids, logps, _ in request.result]})
        return out

    # -- the step's rollout ------------------------------------------------------------------------------
    def _rollout(self, model, prompts, G: int, runs: list[Run], with_logprobs: bool) -> Rollout:
        """Each episode's last chain, its delivered last reply joined (the first choice), as a Rollout row."""
        failed = [r.ep.failed for r in runs if r.ep.failed]
        for i, r in enumerate(runs):
            self.chains.finish(r)
            if not r.ep.prompt_ids:  # the agent made no request: its row's prompt, one EOS
                r.ep.prompt_ids = self.base.encode([prompts[i // G]])[0]
        self.records = [r.records for r in runs]
        if failed:
            warnings.warn(
                f"{len(failed)} of {len(runs)} agents failed this step; the first: {failed[0]}",
                RuntimeWarning,
                stacklevel=2,
            )
        return episodes_rollout(prompts, G, [r.ep for r in runs], with_logprobs, self.eos, model, self.tokenizer)


def alternatives(model, context: list[int], ids: list[int], temperature: float, k: int) -> list[list[tuple]]:
    """For each sampled token, the `k` most likely tokens and their log-probs under the tempered policy, read off
    one forward pass over the context and the reply (top_logprobs; the sampled token's own log-prob is the
    sampler's)."""
    import torch

    if not ids:
        return []
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            device = next(model.parameters()).device
            logits = model(torch.tensor([context + ids], device=device)).logits[0, len(context) - 1 : -1].float()
    finally:
        model.train(was_training)
    logps = (logits / temperature if temperature > 0 else logits).log_softmax(-1)
    values, tokens = logps.topk(min(k, logps.shape[-1]), dim=-1)
    return [list(zip(t, v)) for t, v in zip(tokens.tolist(), values.tolist())]


def with_agent(generator, spec: AgentSpec, tokenizer, **kwargs) -> AgentGenerator:
    agent = AgentGenerator(generator, spec, tokenizer, **kwargs)
    replace_live(generator, agent)
    return agent
