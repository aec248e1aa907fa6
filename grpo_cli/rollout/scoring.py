"""Scoring a model's completions on held-out prompts: greedy accuracy and reward per term, sampled
accuracy, pass@k and maj@k. Shared by the trainer's held-out rows (held_out.py) and `grpo evaluate`."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from grpo_cli.config import SamplerConfig
from grpo_cli.generate.base import generate
from grpo_cli.rewards import Judge, score_batch
from grpo_cli.rewards.exact_match import answer_extractor, normalise
from grpo_cli.samples.rollout import group_seed


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are right (Chen et al. 2021, eq. 1):
    1 - C(n-c, k) / C(n, k), as the product 1 - prod_{i=n-c+1}^{n} (1 - k/i) so nothing overflows."""
    if not 1 <= k <= n or not 0 <= c <= n:
        raise ValueError(f"pass@k needs 1 <= k <= n and 0 <= c <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a right answer
        return 1.0
    return 1.0 - math.prod(1.0 - k / i for i in range(n - c + 1, n + 1))


def majority(answers: Sequence[str | None]) -> str | None:
    """The most common answer (None, no answer found, does not vote); a tie goes to the one seen first."""
    votes = Counter(a for a in answers if a is not None)
    return votes.most_common(1)[0][0] if votes else None


def maj_at_k(answers: Sequence[str | None], right, k: int) -> float:
    """Majority-vote accuracy over k samples: the fraction of the len(answers) // k disjoint blocks of
    k answers (in sampling order) whose majority answer is right; `right` is the target answer, or the
    set of answers judged correct."""
    if not 1 <= k <= len(answers):
        raise ValueError(f"maj@k needs 1 <= k <= {len(answers)} answers, got k={k}")
    right = right if isinstance(right, (set, frozenset)) else {right}
    blocks = [answers[s : s + k] for s in range(0, len(answers) - k + 1, k)]
    return sum(majority(b) in right for b in blocks) / len(blocks)


def _score(reward_fn, prompts, roll, answers, columns, tokens: list[int]):
    return score_batch(
        reward_fn,
        prompts,
        roll.completions,
        answers,
        completion_tokens=tokens,
        columns=columns,
        completion_ids=roll.completion_ids(),
        episodes=roll.episodes,
    )


@torch.no_grad()
def greedy_scores(
    generator,
    model,
    prompts,
    answers,
    reward_fn,
    judge: Judge,
    *,
    max_new_tokens: int,
    batch_size: int = 256,
    columns: dict | None = None,
    advance=None,
) -> dict:
    """Greedy completions for every prompt, scored by the reward (which also sees `columns`, the
    dataset's columns by name, when given; each term's mean is `reward/<term>`); `accuracy` is the share
    the judge calls correct (rewards.Judge: by default, reward at its maximum): with an environment, the
    success rate of whole episodes, beside their mean turns, tool calls and share that called a tool."""
    rewards, correct, lengths, truncated = [], [], [], []
    terms: dict[str, list] = {}
    episodes: list = []
    for start in range(0, len(prompts), batch_size):
        p, a = list(prompts[start : start + batch_size]), list(answers[start : start + batch_size])
        cols = {k: list(v[start : start + batch_size]) for k, v in (columns or {}).items()}
        roll = generate(generator, model, p, 1, SamplerConfig(max_new_tokens, temperature=0), columns=cols)
        tokens = roll.sampled_tokens().tolist()
        total, per_term = _score(reward_fn, p, roll, a, cols, tokens)
        rewards += total
        for name, values in per_term.items():
            terms.setdefault(name, []).extend(values)
        correct += judge(total, roll.completions, a)
        lengths += tokens
        truncated += roll.truncated.tolist()
        episodes += roll.episodes or []
        if advance:
            advance(len(p))
    n = max(len(prompts), 1)
    scored = [r for r in rewards if not math.isnan(r)]  # a completion no term scored (None) is left out, as TRL
    multi_turn = {}
    if episodes:  # how the model used its environment: turns, and the share of episodes calling a tool
        multi_turn = {
            "turns": sum(ep.turns for ep in episodes) / n,
            "tool_use_frac": sum(ep.tool_calls > 0 for ep in episodes) / n,
            "tool_calls": sum(ep.tool_calls for ep in episodes) / n,
        }
    return {
        **multi_turn,
        "accuracy": sum(correct) / n,
        "reward_mean": nanmean(rewards),
        **({"reward_none_frac": 1 - len(scored) / n} if len(scored) < len(rewards) else {}),
        **{f"reward/{name}": nanmean(values) for name, values in terms.items()},
        "completion_len": sum(lengths) / n,
        "truncated_frac": sum(truncated) / n,
        "num_prompts": len(prompts),
    }


def nanmean(values: list[float]) -> float:
    """The mean of the scored values (NaN is no score), 0 when none is."""
    scored = [v for v in values if not math.isnan(v)]
    return sum(scored) / len(scored) if scored else 0.0


def vote_key(completion: str, target: str, answer_of) -> str:
    """What maj@k votes on: the answer as the reward's extraction reads it, else the stripped text."""
    got = answer_of(completion, target)
    return got if got is not None else completion.strip()


@dataclass(frozen=True)
class Draws:
    """How sampled_scores draws: `samples` completions per prompt with the sampler's settings (its
    max_new_tokens, temperature, top_p, top_k), prompt i's noise seeded by (seed, offset + i), in batches
    of `batch_size` prompts; pass@k and maj@k for each k of `ks`."""

    samples: int
    sampler: object
    ks: tuple = ()
    seed: int = 0
    offset: int = 0
    batch_size: int = 64


@torch.no_grad()
def sampled_scores(
    generator,
    model,
    prompts,
    answers,
    reward_fn,
    judge: Judge,
    draws: Draws,
    *,
    extract: str = "last_number",
    pattern: str | None = None,
    columns: dict | None = None,
    advance=None,
) -> dict:
    """`draws.samples` completions per prompt, each scored by the reward and judged: the share correct,
    pass@k, and maj@k (the most common answer, read as `reward.extract` reads it, is right when the
    completions giving it are judged correct). Every model, and every split of the prompts over ranks,
    sees the same draws (Draws)."""
    answer_of = answer_extractor(extract, pattern)
    samples, sampler, ks, seed, offset, batch_size = (
        draws.samples,
        draws.sampler,
        draws.ks,
        draws.seed,
        draws.offset,
        draws.batch_size,
    )
    counts, votes = [], []  # correct completions per prompt; its (vote keys, keys judged correct)
    for start in range(0, len(prompts), batch_size):
        p, a = list(prompts[start : start + batch_size]), list(answers[start : start + batch_size])
        seeds = [group_seed(seed, "evaluate", offset + start + i) for i in range(len(p))]
        cols = {k: list(v[start : start + batch_size]) for k, v in (columns or {}).items()}
        roll = generate(generator, model, p, samples, sampler, seeds, columns=cols)
        per = lambda values: [v for v in values for _ in range(samples)]  # noqa: E731
        total, _ = _score(
            reward_fn, per(p), roll, per(a), {k: per(v) for k, v in cols.items()}, roll.sampled_tokens().tolist()
        )
        correct = judge(total, roll.completions, per(a))
        for i, target in enumerate(a):
            block = range(i * samples, (i + 1) * samples)
            keys = [vote_key(roll.completions[j], normalise(str(target)), answer_of) for j in block]
            counts.append(sum(correct[j] for j in block))
            votes.append((keys, {k for k, j in zip(keys, block) if correct[j]}))
        if advance:
            advance(len(p))
    n = max(len(prompts), 1)
    return {
        "sampled_accuracy": sum(counts) / (n * samples),
        **{f"pass@{k}": sum(pass_at_k(samples, c, k) for c in counts) / n for k in ks},
        **{f"maj@{k}": sum(float(maj_at_k(keys, right, k)) for keys, right in votes) / n for k in ks},
    }
