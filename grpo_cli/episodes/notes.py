"""What a run with tools or an environment is warned of before its first step (run/build.py prints them):
episodes that would run past the model's positions, an environment whose calls must run one at a time,
and a chat template that ignores `tools=`."""

from __future__ import annotations

from grpo_cli.episodes.tool_formats import ignores_tools


def env_notes(cfg, env, model, tokenizer, prompts: list[str]) -> list[str]:
    """The warnings for this run's environment (none without one)."""
    if env is None:
        return []
    notes = [context_note(cfg.env, model, tokenizer, prompts, cfg.data.chat_template)]
    if env.shared_draws and cfg.env.concurrency > 1 and not cfg.env.workers:
        notes.append(
            f"{', '.join(env.shared_draws)} holds the shared random generator (bound before grpo gave each "
            "episode its own), so concurrent calls would not repeat: the environment is called one episode "
            "at a time; call random.random() and the like through their module, draw from self.rng, or run "
            "it in environment workers (env.workers=N), where each call has the generator to itself."
        )
    if env.kind == "tools" and ignores_tools(tokenizer):
        notes.append(
            "the model's chat template ignores tools=, so the model never sees the tools' descriptions (it "
            "can still call tools it was trained to call, as the built-in tool model does); see grpo tools."
        )
    return [n for n in notes if n]


def context_note(cfg, model, tokenizer, prompts: list[str], chat_template: bool) -> str | None:
    """A warning when the longest prompt plus env.max_tokens runs past the model's positions (an episode
    that long is scored where the model was never trained), or None."""
    from grpo_cli.data.prompts import encode_prompts

    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if not positions or not prompts:
        return None
    longest = max(len(ids) for ids in encode_prompts(tokenizer, list(prompts), chat_template))
    if longest + cfg.max_tokens <= positions:
        return None
    return (
        f"the longest prompt ({longest} tokens) plus env.max_tokens={cfg.max_tokens} exceeds the model's "
        f"{positions} positions; lower env.max_tokens to {max(positions - longest, 1)} or less."
    )
