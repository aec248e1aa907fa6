"""Prompts as the model reads them: text, or chat messages (TRL's conversational format) rendered by the
chat template with the tools' schemas, each checked first (one sentence for a prompt a model cannot be
asked)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Callable

from grpo_cli.errors import GrpoError

USER_PROMPT = "_user_prompt"  # the prompt before the chat template, kept beside the rendered one


def is_conversation(value) -> bool:
    """A prompt given as chat messages (TRL's conversational format): [{"role": ..., "content": ...}, ...]
    (a message without its role is still one: check_prompt names it)."""
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) for m in value)


def chat_messages(value, system_prompt: str | None) -> list[dict]:
    """A prompt as chat messages: text becomes one user message; given messages are kept (None keys that
    Arrow fills in dropped); data.system_prompt goes first unless they start with their own."""
    system = [{"role": "system", "content": system_prompt}] if system_prompt is not None else []
    if not is_conversation(value):
        return system + [{"role": "user", "content": value}]
    given = [{k: v for k, v in m.items() if v is not None} for m in value]
    return given if given[0]["role"] == "system" else system + given


ROLES = ("system", "developer", "user", "assistant", "tool")


def check_prompt(value, index: int, system_prompt: str | None, empty_ok: bool = False) -> None:
    """One sentence for a prompt a model cannot be asked: empty text, a message without a known role or
    with empty content, a conversation of system messages alone, or data.system_prompt beside a system
    message of the row's own (which of the two would the model see?)."""
    where = f"Row {index}'s prompt"
    if not is_conversation(value):
        if not str(value).strip() and not empty_ok:
            raise GrpoError(f"{where} is empty; give every row a prompt (or drop the empty rows).")
        return
    for m in value:
        role, content = m.get("role"), m.get("content")
        if role not in ROLES:
            raise GrpoError(
                f"{where} has a message whose role is {role!r}; each message needs a role, one of {', '.join(ROLES)}."
            )
        if (
            role != "assistant"
            and not empty_ok
            and (content is None or (isinstance(content, str) and not content.strip()))
        ):
            raise GrpoError(f"{where} has a {role} message with no content; give it text, or drop the message.")
    if all(m["role"] in ("system", "developer") for m in value):
        raise GrpoError(f"{where} has only system messages; add the user's message the model should answer.")
    if system_prompt is not None and value[0]["role"] == "system":
        raise GrpoError(
            f"data.system_prompt is set, but row {index}'s prompt brings its own system message; drop "
            "data.system_prompt or the rows' system messages, so the model sees one."
        )


def render_prompts(rows: list[dict], cfg, tokenizer, tools: "list[dict] | Callable | None" = None) -> list[str]:
    """The prompt text of each row: the template filled from its columns, then the chat template (with the
    tools' schemas, when an environment has tools; `tools(row)`, when they depend on the row's environment).
    A prompt of chat messages goes through the chat template as it is (its system message included)."""
    if cfg.template is None:
        values = [row[cfg.prompt_field] for row in rows]
        texts = [v if is_conversation(v) else str(v) for v in values]
    else:  # prompt_field need not exist yet: the rendered prompt is stored under it
        try:
            texts = [cfg.template.format(**row) for row in rows]
        except KeyError as e:
            raise GrpoError(
                f"data.template names the column {e.args[0]!r}, which the data does not have; it has {list(rows[0])}."
            ) from None
        except (ValueError, IndexError) as e:
            raise GrpoError(
                f"data.template {cfg.template!r} is not a format string ({e}); write columns as {{name}} "
                "and literal braces as {{ }}."
            ) from None
    for i, text in enumerate(texts):  # data=none's prompts are empty on purpose: reset() writes them
        check_prompt(
            text, i, cfg.system_prompt if cfg.chat_template else None, empty_ok=getattr(cfg, "name", "") == "none"
        )
    if not cfg.chat_template:
        if any(is_conversation(t) for t in texts):  # never str()-ed into a prompt
            raise GrpoError(
                "A prompt is given as chat messages (TRL's conversational format); set "
                "data.chat_template=true to render them with the model's chat template."
            )
        return texts
    if tokenizer is None or not getattr(tokenizer, "chat_template", None):
        raise GrpoError(
            "data.chat_template=true but the model's tokenizer has no chat template; use data.template instead."
        )
    per_row = tools if callable(tools) else (lambda row: tools)
    return [
        tokenizer.apply_chat_template(
            chat_messages(t, cfg.system_prompt), tools=per_row(row) or None, tokenize=False, add_generation_prompt=True
        )
        for t, row in zip(texts, rows)
    ]


def user_text(value) -> str:
    """What a person wrote: the text, or a conversation's last user message (for tables and logs)."""
    if not is_conversation(value):
        return str(value)
    users = [m.get("content") for m in value if m.get("role") == "user"]
    return str(users[-1] if users else value[-1].get("content"))


def render_user_prompts(rows: list[dict], cfg, tokenizer, tools: list[dict] | None = None) -> list[str]:
    """Prompts typed by a user (`grpo sample`), rendered as training renders the dataset's: `data.template`
    when the row has every column it names (a .jsonl row of the training file), else the text as is;
    then the chat template with `data.system_prompt` when `data.chat_template=true`."""
    import string

    names = {f for _, f, _, _ in string.Formatter().parse(cfg.template) if f} if cfg.template else set()
    texts = [
        {**row, "prompt": cfg.template.format(**row) if names and names <= set(row) else row["prompt"]} for row in rows
    ]
    plain = SimpleNamespace(
        template=None, prompt_field="prompt", chat_template=cfg.chat_template, system_prompt=cfg.system_prompt
    )
    return render_prompts(texts, plain, tokenizer, tools)


def check_conversations(rows: list[dict], cfg, where: str) -> None:
    """Once one row's prompt is chat messages, every row's must be (render_prompts wants the chat template)."""
    for i, row in enumerate(rows):
        value = row[cfg.prompt_field]
        if not is_conversation(value) or not all(isinstance(m.get("content"), str) for m in value):
            raise GrpoError(
                f"Row {i} of {where} is not a list of chat messages with text content like the others "
                f'({str(value)[:60]!r}); give every row\'s {cfg.prompt_field!r} as [{{"role": ..., '
                '"content": ...}, ...].'
            )


def encode_prompts(tokenizer, prompts: list[str], chat_template: bool) -> list[list[int]]:
    """Token ids of each prompt, special tokens added once: a chat-rendered prompt already holds them
    (its ids are exactly apply_chat_template(..., tokenize=True)'s); a plain prompt gets the
    tokenizer's own (BOS, where it has one)."""
    return tokenizer(list(prompts), add_special_tokens=not chat_template)["input_ids"]
