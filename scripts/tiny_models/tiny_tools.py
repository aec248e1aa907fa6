"""The built-in tool-calling model (`model.path=builtin:tiny-tools`, `experiment=tool_use`): the tiny
model's character tokenizer with braces added, a chat template that renders tool calls in the Hermes
format (`<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, as Qwen's) and tool results as
`<tool_response>...</tool_response>`, and a warm-up that teaches two ways to answer `a+b=` for
operands up to 999:
- with probability `p_tool`, call the calculator (`add`, grpo_cli/demo/tools.py) and copy its result;
- otherwise answer directly, with the tiny model's slips (a dropped carry, one too high on odd sums):
  a fifth of those targets are right, and the model, too small to add three-digit numbers, ends up
  right on 3% of held-out problems when it answers greedily.

How it works in detail: docs/internals.md, scripts/tiny_models/tiny_tools.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Callable

import torch

from grpo_cli.data.tasks import long_addition_problems
from tiny_models import tiny

CHARS = tiny.CHARS + list("{}[]")
# One Jinja template for the whole conversation: the user's text as it is, the assistant's text and
# tool calls (compact JSON) ended by <eos>, a tool's result in <tool_response> tags. No generation
# prompt: the model answers right after the prompt.
CHAT_TEMPLATE = (
    "{%- for m in messages -%}"
    "{%- if m['role'] == 'tool' -%}<tool_response>{{ m['content'] }}</tool_response>"
    "{%- elif m['role'] == 'assistant' -%}{{ m['content'] }}"
    "{%- for c in m['tool_calls'] or [] -%}<tool_call>{{ c['function'] | tojson(separators=(',', ':')) }}</tool_call>"
    "{%- endfor -%}<eos>"
    "{%- else -%}{{ m['content'] }}{%- endif -%}"
    "{%- endfor -%}"
)


def build_tokenizer():
    tok = tiny.build_tokenizer(CHARS)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def call_text(a: int, b: int) -> str:
    return (
        "<tool_call>"
        + json.dumps({"name": "add", "arguments": {"a": a, "b": b}}, separators=(",", ":"))
        + "</tool_call>"
    )


def example(a: int, b: int, rng: random.Random, p_tool: float, p_correct: float) -> list[tuple[str, bool]]:
    """(text, trained on) pieces of one warm-up sequence after the prompt."""
    if rng.random() < p_tool:
        return [
            (call_text(a, b), True),
            ("<eos>", True),
            (f"<tool_response>{a + b}</tool_response>", False),
            (str(a + b), True),
            ("<eos>", True),
        ]
    return [(tiny.noisy_answer(a, b, rng, p_correct, p_slip=0.6), True), ("<eos>", True)]


def padded_episodes(episodes: list[tuple[str, list[tuple[str, bool]]]], tokenizer):
    """Right-padded (input ids, attention mask, labels) of warm-up episodes, each a prompt (not trained on) and its
    (text, trained on) pieces."""
    rows, labels = [], []
    for prompt, pieces in episodes:
        ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        target = [-100] * len(ids)
        for text, trained in pieces:
            piece = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += piece
            target += piece if trained else [-100] * len(piece)
        rows.append(ids)
        labels.append(target)
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), tokenizer.pad_token_id)
    lab = torch.full((len(rows), width), -100)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, t) in enumerate(zip(rows, labels)):
        ids[i, : len(r)], lab[i, : len(t)], mask[i, : len(r)] = torch.tensor(r), torch.tensor(t), 1
    return ids, mask, lab


def _batch(pairs, rng, tokenizer, batch_size: int, p_tool: float, p_correct: float):
    return padded_episodes(
        [(f"{a}+{b}=", example(a, b, rng, p_tool, p_correct)) for a, b in rng.choices(pairs, k=batch_size)], tokenizer
    )


def build(
    out_dir: str | Path,
    steps: int = 1200,
    p_tool: float = 0.25,
    p_correct: float = 0.2,
    seed: int = 0,
    batch_size: int = 64,
    lr: float = 3e-3,
    log: Callable[[str], None] = print,
) -> Path:
    """Build, warm up and save the tool-calling model (training problems of data=long_addition only)."""
    torch.manual_seed(seed)
    tokenizer = build_tokenizer()
    model = tiny.build_model(len(tokenizer), seed=seed, max_positions=256)
    train = long_addition_problems(3, 10000, 200, 0)["train"]
    pairs = list(zip(train["a"], train["b"]))
    log(f"tiny tool model: {sum(p.numel() for p in model.parameters()):,} parameters, {len(pairs)} training problems")
    tiny.warm_up(
        model,
        tokenizer,
        pairs,
        steps,
        lr=lr,
        seed=seed,
        log=log,
        make_batch=lambda rng: _batch(pairs, rng, tokenizer, batch_size, p_tool, p_correct),
    )
    return tiny.save(model, tokenizer, out_dir)
