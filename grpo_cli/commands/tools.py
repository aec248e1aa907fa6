"""`grpo tools`: the tool-call format a model's chat template writes (what `env.tool_format=auto` picks),
and for every format whether a call rendered through the template parses back to itself: the check
`grpo train` makes before its first step with tools. It composes `grpo train`'s config, so the model is
named as there (model=..., model.path=..., env.tool_format=...); only the tokenizer is loaded."""

from __future__ import annotations

from grpo_cli.episodes.tool_formats import TOOL_FORMATS, ignores_tools, parsed_back, rendered_call, resolve_format
from grpo_cli.errors import GrpoError


def run_tools(cfg, console) -> dict:
    """Print each format's round trip; a GrpoError (exit 2) when the format the config names, or every
    format, cannot read the model's calls. Returns {"format": chosen, "round_trip": {format: why or None}}."""
    from grpo_cli.models.loading import load_tokenizer

    path, setting = cfg.model.path, cfg.env.tool_format
    tok = load_tokenizer(path, cfg.model.trust_remote_code)
    try:  # the call as an episode decodes it: special tokens dropped, or kept (formats whose markers are special)
        written = {special: rendered_call(tok, special) for special in (False, True)}
    except Exception as e:  # noqa: BLE001 - the template's own failure: no format can read what it cannot write
        raise GrpoError(
            f"The chat template of {path} cannot render a tool call ({type(e).__name__}: {e}); train "
            "tools with a model whose template writes tool calls."
        ) from None
    results = {}
    for name in (["schema"] if getattr(tok, "response_schema", None) else []) + list(TOOL_FORMATS):
        spec = resolve_format(name, tok)[1]
        results[name] = parsed_back(spec.parse(written[spec.special])[1])
    try:
        chosen, why_not = resolve_format(setting, tok)[0], None
    except GrpoError as e:
        chosen, why_not = None, str(e)
    console.print(
        f"{path}: env.tool_format={setting}" + (f" reads {chosen}" if chosen and setting != chosen else ""),
        highlight=False,
    )
    console.print(
        f"the chat template writes a call as {written[True][:200]!r}; read back by each format:", highlight=False
    )
    for name, why in results.items():
        console.print(f"  {'ok' if why is None else '--'}  {name}" + (f": {why}" if why else ""), highlight=False)
    if ignores_tools(tok):
        console.warn(
            "the chat template ignores tools=, so the model never sees the tools' descriptions; it can "
            "still call tools it was trained to call."
        )
    readable = [name for name, why in results.items() if why is None]
    if not readable:
        raise GrpoError(
            f"No tool-call format reads the calls the chat template of {path} writes; train tools with a "
            "model whose template writes tool calls."
        )
    if why_not or (chosen is not None and results.get(chosen) is not None):
        raise GrpoError(
            why_not
            or f"env.tool_format={setting} cannot read this model's tool calls; use "
            f"env.tool_format={readable[0]} (or auto)."
        )
    return {"format": chosen, "round_trip": results}
