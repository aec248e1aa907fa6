"""Held-out scoring of a model: greedy accuracy, mean reward, completion length, truncation."""

from __future__ import annotations

import json
from pathlib import Path

import torch

from grpo_cli.rewards import score_batch
from grpo_cli.rewards.exact_match import exact_match_reward
from grpo_cli.rollout import generate


@torch.no_grad()
def greedy_scores(model, tokenizer, prompts, answers, reward_fn, *, max_new_tokens: int, batch_size: int = 256,
                  columns: dict | None = None, check=None) -> dict:
    """Greedy completions for every prompt, scored by the reward (which also sees `columns`, the
    dataset's columns by name, when given) and by exact match (`check`, an exact_match reward:
    pass the run's own so accuracy extracts answers the way its reward does)."""
    check = check or exact_match_reward()
    rewards, correct, lengths, truncated = [], [], [], []
    for start in range(0, len(prompts), batch_size):
        p, a = list(prompts[start : start + batch_size]), list(answers[start : start + batch_size])
        roll = generate(model, tokenizer, p, max_new_tokens=max_new_tokens, greedy=True)
        rewards += score_batch(
            reward_fn, p, roll.completions, a, completion_tokens=roll.completion_mask.sum(1).tolist(),
            columns={k: list(v[start : start + batch_size]) for k, v in (columns or {}).items()},
        )[0]
        correct += check(p, roll.completions, a)
        lengths += roll.completion_mask.sum(1).tolist()
        truncated += roll.truncated.tolist()
    n = max(len(prompts), 1)
    return {
        "accuracy": sum(correct) / n,
        "reward_mean": sum(rewards) / n,
        "completion_len": sum(lengths) / n,
        "truncated_frac": sum(truncated) / n,
        "num_prompts": len(prompts),
    }


@torch.no_grad()
def sampled_accuracy(model, tokenizer, prompts, answers, *, samples: int, max_new_tokens: int,
                     temperature: float = 1.0, top_p: float = 1.0, top_k: int = 0, batch_size: int = 64,
                     check=None) -> float:
    """Fraction of `samples` completions per prompt, drawn as in training, that are right."""
    check = check or exact_match_reward()
    hits = 0
    for start in range(0, len(prompts), batch_size):
        p, a = list(prompts[start : start + batch_size]), list(answers[start : start + batch_size])
        roll = generate(model, tokenizer, p, samples, max_new_tokens=max_new_tokens,
                        temperature=temperature, top_p=top_p, top_k=top_k)
        hits += sum(check(None, roll.completions, [x for x in a for _ in range(samples)]))
    return hits / max(len(prompts) * samples, 1)


def run_evaluate(cfg, out_dir: Path, console) -> dict:
    """`grpo evaluate`: greedy scores of a checkpoint (or the base model) on a data split."""
    from grpo_cli.data import load_data
    from grpo_cli.models import load_model, load_tokenizer
    from grpo_cli.rewards import build_reward

    torch.manual_seed(cfg.seed)
    path = cfg.checkpoint or cfg.model.path
    model = load_model(path, cfg.model.dtype, cfg.model.device, cfg.model.trust_remote_code)
    tokenizer = load_tokenizer(path, cfg.model.trust_remote_code)
    data = load_data(cfg.data, tokenizer, log=console.warn)
    if cfg.split not in data:
        from grpo_cli.errors import GrpoError

        raise GrpoError(f"split={cfg.split!r} is not in data={cfg.data.name}; it has {list(data)}.")
    rows = data[cfg.split]
    if cfg.limit:
        rows = rows.select(range(min(cfg.limit, len(rows))))
    scores = greedy_scores(
        model, tokenizer, rows[cfg.data.prompt_field], rows[cfg.data.answer_field],
        build_reward(cfg.reward), max_new_tokens=cfg.sampler.max_new_tokens, columns=rows.to_dict(),
    )
    result = {"checkpoint": str(path), "split": cfg.split, **scores}
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "eval.json").write_text(json.dumps(result, indent=2) + "\n")
    console.eval_table([result])
    return result
