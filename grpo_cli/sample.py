"""`grpo sample`: G completions per prompt from a checkpoint, scored when an answer is given."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from rich.table import Table

from grpo_cli.errors import GrpoError
from grpo_cli.models import load_model, load_tokenizer
from grpo_cli.rewards import build_reward
from grpo_cli.rollout import generate


def run_sample(cfg, console) -> list[dict]:
    prompts = ([cfg.prompt] if cfg.prompt else []) + list(cfg.prompts)
    if not prompts:
        raise GrpoError('No prompt given; pass prompt="..." or prompts=[...].')
    torch.manual_seed(cfg.seed)
    path = cfg.checkpoint or cfg.model.path
    model = load_model(path, cfg.model.dtype, cfg.model.device, cfg.model.trust_remote_code)
    tokenizer = load_tokenizer(path, cfg.model.trust_remote_code)
    s = cfg.sampler
    roll = generate(
        model, tokenizer, prompts, s.group_size, max_new_tokens=s.max_new_tokens,
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k,
    )
    rep = [p for p in prompts for _ in range(s.group_size)]
    rewards = build_reward(cfg.reward)(
        rep, roll.completions, [cfg.answer] * len(rep), completion_tokens=roll.completion_mask.sum(1).tolist(),
    ) if cfg.answer is not None else None
    rows = [
        {"prompt": p, "completion": c, **({"reward": r} if rewards else {})}
        for p, c, r in zip(rep, roll.completions, rewards or [None] * len(rep))
    ]
    table = Table(title=f"{s.group_size} samples per prompt from {path}")
    for col in rows[0]:
        table.add_column(col)
    for r in rows:
        table.add_row(*[f"{v:.3f}" if isinstance(v, float) else repr(v) if k == "completion" else str(v) for k, v in r.items()])
    console.out.print(table)
    if cfg.output:
        out = Path(cfg.output)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text("".join(json.dumps(r) + "\n" for r in rows))
        console.print(f"wrote {len(rows)} completions to {out}")
    return rows
