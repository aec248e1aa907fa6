"""A run's end: final/ (a merged model under LoRA), the held-out scores after training, the summary `grpo train`
prints, where the time went, the model card and the hub push."""

from __future__ import annotations

import time
from dataclasses import asdict

import torch
from rich.markup import escape

from grpo_cli.models.loading import load_model
from grpo_cli.models.policies import load_policy
from grpo_cli.run.checkpoint import save_final
from grpo_cli.run.floors import bottleneck_line
from grpo_cli.run.publish import push, write_model_card
from grpo_cli.run.state import Run


def finish_run(run: Run) -> dict:
    """final/ (a merged model under LoRA), the summary, the held-out scores after training, the model
    card and the hub push. Returns the summary `grpo train` prints."""
    cfg, t = run.cfg, run.cfg.trainer
    run.policy.eval()

    def merged(trained, adapter):  # under LoRA final/ holds the base with the adapter merged in, from a fresh fp32 base
        from grpo_cli.models.lora import merged_copy

        return merged_copy(load_model(cfg.model.path, torch.float32, "cpu"), trained, adapter)

    merge = merged if cfg.model.lora.r else None
    save_final(run.run_dir, run.policy, run.tokenizer, run.dist, merge=merge, config=asdict(cfg))
    after = run.held_out.final(t.steps) if run.held_out_before or run.held_out.deferred else None  # the curve's end
    before = run.held_out_before or (
        run.held_out.initial(lambda: load_policy(cfg.model, run.precision, None)) if after is not None else None
    )
    run.metrics.close()
    rows = [r for r in run.metrics.read() if "reward_mean" in r]  # training rows, not eval/ ones
    last = rows[-20:]
    summary = {
        "steps": t.steps,
        "reward_first": rows[0]["reward_mean"] if rows else None,
        "reward_last20": sum(r["reward_mean"] for r in last) / len(last) if last else None,
        "seconds": time.perf_counter() - run.started,
        "health": ", ".join(dict.fromkeys(k.split("/", 1)[1] for r in rows for k in r if k.startswith("health/")))
        or ("not checked" if t.health == "off" else "no rule fired"),
        "run_dir": str(run.run_dir),
    }
    if after is not None and before is not None:
        summary.update(run.held_out.after(before, after))
    if run.dist.is_main and rows:  # where the time went, against the floor (floors.py)
        run.console.print(escape(bottleneck_line(rows, run.after.floors) or ""), highlight=False, soft_wrap=True)
    if run.dist.is_main:
        card = write_model_card(run.run_dir / "final", cfg, summary, run.command or "grpo train")
        if cfg.hub.push:
            summary["pushed"] = push(card.parent, cfg, run.console)
    return summary
