"""What a run with tools or an environment is warned of before its first step (run/build.py prints them):
episodes that would run past the model's positions, an environment whose calls must run one at a time,
a chat template that ignores `tools=`, and one that renders a tool result's content parts as a Python list."""

from __future__ import annotations

from grpo_cli.episodes.tool_formats import ignores_tools


def env_notes(env_cfg, data, env, model, tokenizer, prompts: list[str]) -> list[str]:
    """The warnings for this run's environment (none without one): the env and data groups' settings."""
    if env is None:
        return []
    notes = [context_note(env_cfg, model, tokenizer, prompts, data.chat_template)]
    if env.shared_draws and env_cfg.concurrency > 1 and not env_cfg.workers:
        notes.append(
            f"{', '.join(env.shared_draws)} holds the shared random generator (bound before grpo gave each "
            "episode its own), so concurrent calls would not repeat: the environment is called one episode "
            "at a time; call random.random() and the like through their module, draw from self.rng, or run "
            "it in environment workers (env.workers=N), where each call has the generator to itself."
        )
    if env.kind == "tools":
        notes.append(parts_note(tokenizer))
    if env.kind == "tools" and ignores_tools(tokenizer):
        notes.append(
            "the model's chat template ignores tools=, so the model never sees the tools' descriptions (it "
            "can still call tools it was trained to call, as the built-in tool model does); see grpo tools."
        )
    return [n for n in notes if n]


def parts_note(tokenizer) -> str | None:
    """A warning when the chat template renders a tool result given as content parts ([{"type": "text", ...}],
    as TRL keeps them) as a Python list: the model would read the repr, not the text; None when it renders the
    text, or cannot render parts at all (the episode says so when a tool returns them)."""
    from jinja2.exceptions import TemplateError

    text = "Q7xZ result"
    parts = [{"type": "text", "text": text}]
    call = {"type": "function", "id": "call00000", "function": {"name": "f", "arguments": {}}}
    chat = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "", "tool_calls": [call]}]
    try:
        rendered = tokenizer.apply_chat_template(
            [*chat, {"role": "tool", "name": "f", "tool_call_id": "call00000", "content": parts}], tokenize=False
        )
    except (TemplateError, TypeError):  # it cannot render parts at all: the episode says so if a tool returns them
        return None
    if repr(parts) not in rendered and "'type': 'text'" not in rendered:
        return None
    return (
        "the model's chat template renders a tool result given as content parts as a Python list "
        f"({repr(parts)[:40]}...), so the model reads the repr, not the text; return a string from your tools "
        "(join the parts' text), or use a template that renders content parts."
    )


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
