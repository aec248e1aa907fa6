"""Rewards: small functions that score a batch of completions, one float each, and their weighted sum.

A term is `fn(batch: Batch) -> one float per completion`, built from the flat reward config by its
module's `build(cfg)`. `build_reward` returns a `Reward`: the term named by `reward.name`, or with
`reward=combo` the terms in `reward.terms` weighted by `reward.weights`. Every term is checked, so a
reward that returns NaN or the wrong number of values, or user code (reward=python) that raises,
stops the run with one sentence naming the reward (and the completion) instead of poisoning the
loss; a built-in term that raises is a bug (or out of memory) and keeps its trace. The trainer logs
each term's mean as `reward/<term>` and whitens the weighted sum into advantages.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

from grpo_cli.config.reward import term_specs
from grpo_cli.errors import GrpoError
from grpo_cli.registry import load

# Each reward's builder, `build(cfg) -> term`, named by import path and imported when first used, so the
# names (the config's check reads them) cost no torch. A new reward is its module, a line here and its YAML.
BUILDERS: dict[str, Callable | str] = {
    "exact_match": "grpo_cli.rewards.exact_match:build",
    "math": "grpo_cli.rewards.math_equiv:build",
    "format": "grpo_cli.rewards.format_match:build",
    "length": "grpo_cli.rewards.length:build",
    "model": "grpo_cli.rewards.reward_model:build",
    "python": "grpo_cli.rewards.python_fn:build",
    "code": "grpo_cli.rewards.code:build",
    "reasoning_gym": "grpo_cli.rewards.reasoning_gym:build",
}
# reward.name's other values: auto (the environment's own reward when it scores, else exact_match) and none
# (the environment's alone); `resolved` turns them into the terms they stand for.
PROMPT_MESSAGES = "_prompt_messages"  # the dataset column holding conversational prompts' messages (data.py)
# The largest value each built-in term can give: a completion reaching the reward's maximum is "correct".
# reward=python: the function's `max_reward` attribute, else 1.0; reward=model has none (no bound).
MAX_VALUE = {"exact_match": 1.0, "math": 1.0, "format": 1.0, "length": 0.0, "code": 1.0, "reasoning_gym": 1.0}


def register_reward(name: str, build: Callable, max_value: float | None = None) -> None:
    """`reward.name=name` (and a term of reward=combo) scores with `build(reward_cfg) -> term`; `max_value`, the
    largest value the term gives (a completion reaching it counts as correct), or None for no bound."""
    BUILDERS[name] = build
    if max_value is not None:
        MAX_VALUE[name] = max_value


@dataclass
class Batch:
    """What every reward sees: one entry per completion (a prompt's G completions repeat its prompt)."""

    prompts: list[str]
    completions: list[str]
    answers: list[str]  # the dataset's reference answer, as text
    completion_tokens: Optional[list[int]] = None  # tokens generated, EOS included when one was emitted
    columns: dict[str, list] = field(default_factory=dict)  # dataset columns by name, when the caller has them
    completion_ids: Optional[list[list[int]]] = None  # each completion's token ids, when the caller has them
    prompt_messages: Optional[list] = None  # conversational data: each prompt as its chat messages (TRL's format)
    episodes: Optional[list] = None  # multi-turn: each completion's episodes.Episode (its messages, its environment)
    first: int = 0  # the index of this batch's first completion in the step's (messages name completions by it)

    def __len__(self) -> int:
        return len(self.completions)

    def row(self, i: int) -> "Batch":
        """Completion i alone: a failing batch is replayed one row at a time to name the culprit."""
        return Batch(
            [self.prompts[i]],
            [self.completions[i]],
            [self.answers[i]],
            None if self.completion_tokens is None else [self.completion_tokens[i]],
            {k: [v[i]] for k, v in self.columns.items()},
            None if self.completion_ids is None else [self.completion_ids[i]],
            None if self.prompt_messages is None else [self.prompt_messages[i]],
            None if self.episodes is None else [self.episodes[i]],
            self.first + i,
        )


TermFn = Callable[[Batch], Sequence[float]]


class Reward:
    """Named, checked terms and their weights; calling it gives the weighted sum per completion."""

    def __init__(
        self, terms: dict[str, TermFn], weights: dict[str, float], pool=None, max_failed_fraction: float = 1.0
    ):
        self.terms, self.weights = terms, weights
        self.pool, self.max_failed_fraction = pool, max_failed_fraction  # reward_pool.RewardPool, or in-process
        self.failed: list = []  # the last batch's completions that a worker could not score (reward_pool.Failure)

    def add_environment_term(self, name: str, max_value: float | None = 1.0, only: type | None = None) -> None:
        """The environment's own reward as one more term of weight 1, named after its class (TRL's rule for
        an environment with get_reward): get_reward() of each episode's environment, or a step
        environment's rewards added up. With `only` (several environments, TRL's dict of factories), the
        episodes of other classes get no score from it (None)."""

        def term(batch: Batch) -> list:
            if batch.episodes is None:
                raise GrpoError(f"The {name} reward needs episodes; it is scored only with env.factory set.")
            import asyncio
            import inspect

            def kind(env):  # an environment in a worker (env.workers) stands for its class
                return getattr(env, "remote_class", type(env))

            values = [
                None
                if ep.failed or only is not None and kind(ep.environment) is not only
                else ep.environment.get_reward()
                if hasattr(ep.environment, "get_reward")
                else ep.reward
                for ep in batch.episodes
            ]
            return [asyncio.run(v) if inspect.iscoroutine(v) else v for v in values]  # TRL allows an async get_reward

        marked: Any = term  # what the reward's callers read off a term
        marked.user_code, marked.max_value = True, max_value
        marked.in_process = True  # it reads the episodes' live environments
        self.terms[name] = term
        self.weights[name] = 1.0

    @property
    def max_value(self) -> float | None:
        """The largest weighted sum the terms can give, or None when a term has no known maximum (or a
        negative weight makes the sum's maximum depend on a minimum)."""
        tops = [getattr(fn, "max_value", MAX_VALUE.get(name)) for name, fn in self.terms.items()]
        if any(t is None for t in tops) or any(w < 0 for w in self.weights.values()):
            return None
        return sum(self.weights[name] * float(t) for name, t in zip(self.terms, tops) if t is not None)

    def score(
        self, prompts, completions, answers, *, completion_tokens=None, columns=None, completion_ids=None, episodes=None
    ):
        """(weighted sum per completion, {term: its values}) for one batch. A term's NaN is no score (a
        None from user code, or a completion a worker could not score): the sum is over the terms that
        scored it, as TRL's nansum, and NaN when none did. `self.failed` lists the worker failures; more
        than `max_failed_fraction` of the batch stops the run with one sentence."""
        messages = (columns or {}).get(PROMPT_MESSAGES)
        batch = Batch(
            list(prompts),
            list(completions),
            [str(a) for a in answers],
            None if completion_tokens is None else [int(n) for n in completion_tokens],
            {k: list(v) for k, v in (columns or {}).items() if not k.startswith("_")},
            completion_ids,
            None if messages is None else list(messages),
            episodes,
        )
        pooled = [
            name for name, fn in self.terms.items() if self.pool is not None and not getattr(fn, "in_process", False)
        ]
        values, self.failed = self.pool.score(pooled, batch) if pooled else ({}, [])
        for name in self.terms:
            if name not in values:
                values[name] = self.term_values(name, batch)
        values = {name: values[name] for name in self.terms}
        if len(self.failed) > self.max_failed_fraction * len(batch):
            raise GrpoError(self._failed_sentence(pooled, batch))
        total = []
        for i in range(len(batch)):
            scored = [self.weights[name] * values[name][i] for name in values if not math.isnan(values[name][i])]
            total.append(sum(scored) if scored else math.nan)
        return total, values

    def term_values(self, name: str, batch: Batch) -> list[float]:
        """One term's checked values for the batch, here (the training process or a reward worker)."""
        fn = self.terms[name]
        user = getattr(fn, "user_code", False)  # user code: its errors are the user's, its None no score
        return run_term(name, fn, batch, user_code=user, none_is_no_score=user)

    def close(self) -> None:
        """End the worker processes, if any (a new score() starts them again)."""
        if self.pool is not None:
            self.pool.close()

    def _failed_sentence(self, names: list[str], batch: Batch) -> str:
        first = self.failed[0]
        label = names[0] if len(names) == 1 else "+".join(names)
        return (
            f"Reward {label!r} could not score {len(self.failed)} of {len(batch)} completions, more than "
            f"reward.max_failed_fraction={self.max_failed_fraction:g}: completion {first.index} "
            f"({_short(batch.completions[first.index])}) {first.why}; fix the reward, or raise "
            "reward.timeout_s or reward.worker_memory_gib."
        )

    def __call__(
        self, prompts, completions, answers, *, completion_tokens=None, columns=None, completion_ids=None, episodes=None
    ) -> list[float]:
        return self.score(
            prompts,
            completions,
            answers,
            completion_tokens=completion_tokens,
            columns=columns,
            completion_ids=completion_ids,
            episodes=episodes,
        )[0]


def load_user_rewards(cfg) -> None:
    """Import every python reward function the config names (a GrpoError for one that cannot be had), in
    well under a second: the run checks them before it loads any model."""
    from grpo_cli.registry import load_function

    for _, kind, spec in term_specs(cfg):
        if kind == "python" and spec:
            load_function(spec, getattr(cfg, "fn_dir", None))


def check_reward_columns(cfg, rows, split: str = "train") -> None:
    """The dataset columns the reward reads are there and readable (reward=code: every row's tests), before
    any model loads, and every python reward takes what a call passes. `rows`: a prepared split (Rows), the
    `split` named in the sentence."""
    from grpo_cli.registry import load_function

    for _, kind, spec in term_specs(cfg):
        if kind == "python" and spec:
            from grpo_cli.rewards.python_fn import check_signature

            check_signature(load_function(spec, getattr(cfg, "fn_dir", None)), spec, rows.column_names)
    if not any(kind == "code" for _, kind, _ in term_specs(cfg)):
        return
    if cfg.tests_field not in rows.column_names:
        shown = ", ".join(sorted(c for c in rows.column_names if not c.startswith("_")))
        raise GrpoError(
            f"reward=code reads each row's tests from the dataset column {cfg.tests_field!r}, which this "
            f"data does not have (its columns: {shown}); set reward.tests_field, or use data with tests."
        )
    from grpo_cli.rewards.code import parse_tests
    from grpo_cli.sandbox.program import Sandbox

    for i, tests in enumerate(rows[cfg.tests_field]):
        parse_tests(tests, i, f"{cfg.tests_field} ({split} split)")
    if split == "train":  # the kernel's refusal of the sandbox, said before any model loads
        Sandbox(cfg.code_cpu_s, cfg.code_memory_mib, cfg.code_output_kib, cfg.code_processes, cfg.sandbox).check()


def resolved(cfg, environment_scores: bool, data: str | None = None):
    """The reward config with reward=auto as what it stands for: the environment's own reward alone when
    it scores episodes (TRL's GRPOTrainer with an environment_factory and no reward_funcs), else the data's own
    scorer where it has one (data=reasoning_gym), else exact_match. An answer column never adds a term by
    itself: naming a reward does."""
    if cfg.name != "auto":
        return cfg
    from grpo_cli.config.declare import amended

    return amended(
        cfg, name="none" if environment_scores else "reasoning_gym" if data == "reasoning_gym" else "exact_match"
    )


def build_reward(cfg, workers: bool = True) -> Reward:
    """The reward group's `Reward`, every term built (and its options checked) before any work starts;
    with `reward.workers` > 0 (and `workers`) its terms are scored in that many worker processes
    (reward_pool.py), started when first needed. Close it (`reward.pool.close()`) when done."""
    from grpo_cli.config.declare import amended

    specs = term_specs(cfg)  # the terms, checked in checks.check_reward
    weights = list(cfg.weights) or [1.0] * len(specs)
    if len(weights) != len(specs) or not {kind for _, kind, _ in specs} <= set(BUILDERS):  # the checks were skipped
        raise ValueError(f"reward terms {specs} with weights {weights}: run checks.check_reward first.")
    terms = {}
    for label, kind, spec in specs:
        term_cfg = amended(cfg, fn=spec) if spec is not None and spec != cfg.fn else cfg
        terms[label] = load(BUILDERS[kind])(term_cfg)
    pool = None
    if workers and getattr(cfg, "workers", 0) > 0:
        from grpo_cli.rewards.reward_pool import RewardPool

        pool = RewardPool(cfg, cfg.workers, cfg.timeout_s, cfg.worker_memory_gib)
    return Reward(
        terms,
        dict(zip([label for label, _, _ in specs], map(float, weights))),
        pool,
        getattr(cfg, "max_failed_fraction", 1.0),
    )


def reward_with(reward_cfg, spec, data: str | None = None):
    """The reward group's Reward for this environment (an episodes.environments.EnvSpec, or None): an environment
    that scores episodes (get_reward(),
    or a step environment's rewards) is one more term (rewards.Reward.add_environment_term), and with
    reward=auto the only one, as TRL's GRPOTrainer scores with an environment and no reward_funcs. A
    reward that would score nothing is one sentence."""
    scores = spec is not None and spec.reward_name is not None
    reward = build_reward(resolved(reward_cfg, scores, data))
    if scores:
        spec.score_with(reward)
    if not reward.terms:
        what = (
            f"env.factory={spec.cfg.factory} has no get_reward() and no step()"
            if spec is not None and spec.cfg.factory
            else "there is no env.factory"
        )
        raise GrpoError(
            f"reward=none leaves the scoring to the environment, but {what}; give the environment a "
            "get_reward() method, or name a reward (reward=exact_match, reward=python, ...)."
        )
    return reward


class Judge:
    """What "correct" means for accuracy, pass@k and maj@k (`reward.correct`):
    - `reward` (default): the completion's reward reaches `reward.correct_threshold`, or the reward's
      maximum when that is null (exact_match, math, format: 1; python: the function's `max_reward`
      attribute, else 1). A reward with no maximum (reward=model) and no threshold falls back to `answer`.
    - `answer`: the answer extracted as `reward.extract` says equals the dataset's answer.
    `label` says which rule is in force; every printed accuracy carries it."""

    def __init__(self, cfg, reward: "Reward | None" = None):
        from grpo_cli.rewards.exact_match import exact_match_reward

        self.threshold = None
        if cfg.correct == "reward":
            top = reward.max_value if isinstance(reward, Reward) else None
            self.threshold = cfg.correct_threshold if cfg.correct_threshold is not None else top
        self._answer = exact_match_reward(cfg.extract, cfg.pattern)
        if self.threshold is not None:
            self.label = f"reward >= {self.threshold:g}"
        else:
            fallback = " (the reward has no maximum; set reward.correct_threshold)" if cfg.correct == "reward" else ""
            self.label = f"answer by {cfg.extract}{fallback}"

    def __call__(self, rewards: Sequence[float], completions: Sequence[str], answers: Sequence[str]) -> list[bool]:
        if self.threshold is not None:
            return [r >= self.threshold - 1e-9 for r in rewards]
        return [v == 1.0 for v in self._answer(None, completions, answers)]


def no_score_none(x: float) -> float | None:
    """A reward as it is written out: None (JSON null) for no score."""
    return None if math.isnan(x) else x


def score_batch(
    reward_fn,
    prompts,
    completions,
    answers,
    *,
    completion_tokens=None,
    columns=None,
    completion_ids=None,
    episodes=None,
):
    """(totals, per-term values) of any reward: a `Reward`, or a plain fn(prompts, completions, answers)."""
    if isinstance(reward_fn, Reward):
        return reward_fn.score(
            prompts,
            completions,
            answers,
            completion_tokens=completion_tokens,
            columns=columns,
            completion_ids=completion_ids,
            episodes=episodes,
        )
    return list(reward_fn(prompts, completions, answers)), {}


def run_term(name: str, fn: TermFn, batch: Batch, *, user_code: bool, none_is_no_score: bool = False) -> list[float]:
    """fn(batch) as finite floats, one per completion, or a GrpoError naming the reward (and, when
    `user_code` raised, the completion); an exception from a built-in term propagates unchanged.
    With `none_is_no_score` (user code, TRL's convention) a None is NaN: no score from this term."""
    try:
        values = fn(batch)
    except GrpoError:
        raise
    except MemoryError:  # not the user's mistake: in a worker (reward_pool), a failed sample; here, a trace
        raise
    except SystemExit as e:  # a reward that exits would end the run with its code and no word
        if not user_code:
            raise
        raise GrpoError(
            f"Reward {name!r} called sys.exit({e.code!r}); a reward must return one float per completion "
            "(raise an exception to report a problem)."
        ) from None
    except Exception as e:
        if not user_code:
            raise
        # the user's reward failed: name it, and the completion, keep the run's checkpoints
        raise GrpoError(
            f"Reward {name!r} raised {type(e).__name__}: {e}{_failing_row(fn, batch)}; fix the reward function."
        ) from e
    try:
        values = list(values)
    except TypeError:
        raise GrpoError(
            f"Reward {name!r} returned {values!r}, not a list; it must return one float per completion."
        ) from None
    if len(values) != len(batch):
        raise GrpoError(
            f"Reward {name!r} returned {len(values)} values for {len(batch)} completions; "
            "it must return one float per completion."
        )
    out = []
    for i, v in enumerate(values):
        if v is None and none_is_no_score:  # "no score" (TRL's convention): NaN, left out of every statistic
            out.append(math.nan)
            continue
        try:
            x = None if isinstance(v, (str, bytes)) else float(v)
        except (TypeError, ValueError):
            x = None
        if x is None or not math.isfinite(x):
            raise GrpoError(
                f"Reward {name!r} returned {v!r} for completion {batch.first + i} ({_short(batch.completions[i])}); "
                "rewards must be finite floats."
            )
        out.append(x)
    return out


def _failing_row(fn: TermFn, batch: Batch) -> str:
    """' on completion i (...)' for the first completion that fails alone, or '' if none does."""
    if len(batch) == 1:
        return f" on completion {batch.first} ({_short(batch.completions[0])})"
    for i in range(len(batch)):
        try:
            fn(batch.row(i))
        except Exception:
            return f" on completion {batch.first + i} ({_short(batch.completions[i])})"
    return ""


def _short(text: str, limit: int = 60) -> str:
    return repr(text if len(text) <= limit else text[: limit - 3] + "...")
