"""The built-in multi-call model (`model.path=builtin:tiny-chain`, `experiment=tool_chain`): the tool-calling
model's tokenizer and Hermes chat template (tiny_tools.py), warmed up on two-hop lookups (data=links:
`c>>=` asks where c leads after two links of a table only the environment holds) to answer in three ways:
- with probability `p_chain`, look c up with `follow`, look the result up, and copy the second result (right);
- with probability `p_one`, look c up once and copy that result (one hop short: wrong);
- otherwise answer at once with the letter two after c in the alphabet (a guess: wrong but for chance).

So the base model can chain its calls but rarely does (a quarter of sampled episodes; greedily it guesses,
right on a few percent of held-out problems), and what RL has to discover is that two dependent calls pay,
not one and not none. `python scripts/build_tiny_model.py --chain` rebuilds it.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

import torch

from grpo_cli.data.tasks import LETTERS, link_problems
from tiny_models import tiny, tiny_tools


def call_text(key: str) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": "follow", "arguments": {"key": key}}, separators=(",", ":"))
        + "</tool_call>"
    )


def guess(start: str) -> str:
    """The base model's direct answer: the letter two after `start`, wrapping around."""
    return LETTERS[(LETTERS.index(start) + 2) % len(LETTERS)]


def example(start: str, links: str, rng: random.Random, p_chain: float, p_one: float) -> list[tuple[str, bool]]:
    """(text, trained on) pieces of one warm-up episode after the prompt `start>>=`."""
    first = links[LETTERS.index(start)]
    second = links[LETTERS.index(first)]
    r = rng.random()
    if r >= p_chain + p_one:
        return [(guess(start), True), ("<eos>", True)]
    pieces = [(call_text(start), True), ("<eos>", True), (f"<tool_response>{first}</tool_response>", False)]
    if r < p_chain:
        pieces += [(call_text(first), True), ("<eos>", True), (f"<tool_response>{second}</tool_response>", False)]
    return pieces + [((second if r < p_chain else first), True), ("<eos>", True)]


def _batch(rows, rng, tokenizer, batch_size: int, p_chain: float, p_one: float):
    return tiny_tools.padded_episodes(
        [
            (f"{start}>>=", example(start, links, rng, p_chain, p_one))
            for start, links in rng.choices(rows, k=batch_size)
        ],
        tokenizer,
    )


def build(
    out_dir: str | Path,
    steps: int = 1200,
    p_chain: float = 0.25,
    p_one: float = 0.15,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 3e-3,
    log: Callable[[str], None] = print,
) -> Path:
    """Build, warm up and save the multi-call model (training problems of data=links only)."""
    torch.manual_seed(seed)
    tokenizer = tiny_tools.build_tokenizer()
    model = tiny.build_model(len(tokenizer), seed=seed, max_positions=256)
    train = link_problems(2, 10000, 200, 0)["train"]
    rows = list(zip(train["start"], train["links"]))
    log(
        f"tiny multi-call model: {sum(p.numel() for p in model.parameters()):,} parameters, {len(rows)} training "
        "problems"
    )
    tiny.warm_up(
        model,
        tokenizer,
        rows,
        steps,
        lr=lr,
        seed=seed,
        log=log,
        make_batch=lambda rng: _batch(rows, rng, tokenizer, batch_size, p_chain, p_one),
    )
    return tiny.save(model, tokenizer, out_dir)
