"""Tool calls in the model's text, one parser per format (`env.tool_format`), chosen by name or detected
from the chat template (`auto`, the default). Each parser returns (the text outside the calls, the calls):
a call is {"name": str, "arguments": dict}, or {"error": why} for a call the model wrote badly, which
the episode answers with an error message, as TRL does.

How it works in detail: docs/internals.md, grpo_cli/episodes/tool_formats.py.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from grpo_cli.errors import GrpoError


@dataclass(frozen=True)
class ToolFormat:
    parse: Callable[[str], tuple[str, list[dict]]]  # the turn's text -> (content, calls)
    detect: tuple[str, ...]  # strings that a chat template writing this format holds, every one
    special: bool  # its markers are special tokens: the turn is decoded with them kept


TOOL_FORMATS: dict[str, ToolFormat] = {}


def register_tool_format(name: str, detect: tuple[str, ...] = (), special: bool = False):
    """`env.tool_format=name` parses calls with the decorated function; `auto` picks it for a chat template
    whose calls it reads back (`detect`: strings such a template holds, which break ties between formats)."""

    def add(fn):
        TOOL_FORMATS[name] = ToolFormat(fn, tuple(detect), special)
        return fn

    return add


def detect_format(template: str | None) -> str | None:
    """The first format whose marker strings the chat template holds, every one, or None. A hint only:
    `auto` reads the calls the template writes (detect), and markers break ties between readers."""
    for name, spec in TOOL_FORMATS.items():
        if template and spec.detect and all(m in template for m in spec.detect):
            return name
    return None


def _call(name, arguments, body: str) -> dict:
    """A well-formed call, or the error the model reads (naming what it wrote: `body`)."""
    try:
        if not isinstance(name, str):
            raise ValueError("no tool name")
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        if not isinstance(arguments, dict):
            raise ValueError("arguments are not an object")
        return {"name": name, "arguments": arguments}
    except ValueError as e:  # json.JSONDecodeError is a ValueError
        return {"error": f"malformed tool call ({e}): {body[:80]!r}"}


def _json_call(body: str) -> dict:
    """{"name": ..., "arguments" or "parameters": {...}} as one call."""
    try:
        call = json.loads(body)
    except ValueError as e:
        return {"error": f"malformed tool call ({e}): {body[:80]!r}"}
    if not isinstance(call, dict):
        return _call(None, {}, body)
    return _call(call.get("name"), call.get("arguments", call.get("parameters", {})), body)


def _value(text: str):
    """A parameter written as text: JSON when it reads as JSON (numbers, lists, objects), else the string."""
    text = text.strip("\n")
    try:
        return json.loads(text)
    except ValueError:
        return text


def _blocks(text: str, open_tag: str, close_tag: str, parse_body: Callable[[str], dict]) -> tuple[str, list[dict]]:
    """Every `open_tag ... close_tag` block of `text` parsed as a call; an unclosed last block is an error."""
    calls, content = [], text
    for m in re.finditer(re.escape(open_tag) + r"(.*?)(" + re.escape(close_tag) + r"|$)", text, flags=re.S):
        content = content.replace(m.group(0), "")
        body = m.group(1).strip()
        calls.append(
            parse_body(body)
            if m.group(2)
            else {"error": f"malformed tool call (no closing {close_tag}): {body[:80]!r}"}
        )
    return content.strip(), calls


@register_tool_format("qwen3_coder", detect=("<function=", "<parameter="))
def parse_qwen3_coder(text: str) -> tuple[str, list[dict]]:
    def body(b: str) -> dict:
        m = re.fullmatch(r"<function=([^>\s]+)>(.*?)</function>", b, flags=re.S)
        if m is None:
            return {"error": f"malformed tool call (no <function=NAME>...</function>): {b[:80]!r}"}
        params = re.findall(r"<parameter=([^>\s]+)>(.*?)</parameter>", m.group(2), flags=re.S)
        return _call(m.group(1), {k: _value(v) for k, v in params}, b)

    return _blocks(text, "<tool_call>", "</tool_call>", body)


@register_tool_format("glm", detect=("<arg_key>", "<arg_value>"))
def parse_glm(text: str) -> tuple[str, list[dict]]:
    def body(b: str) -> dict:
        name = b.split("<arg_key>", 1)[0].strip()
        pairs = re.findall(r"<arg_key>(.*?)</arg_key>\s*<arg_value>(.*?)</arg_value>", b, flags=re.S)
        return _call(name or None, {k.strip(): _value(v) for k, v in pairs}, b)

    return _blocks(text, "<tool_call>", "</tool_call>", body)


@register_tool_format("hermes", detect=("<tool_call>",))
def parse_hermes(text: str) -> tuple[str, list[dict]]:
    return _blocks(text, "<tool_call>", "</tool_call>", _json_call)


@register_tool_format("harmony", detect=("<|channel|>", "<|call|>"), special=True)
def parse_harmony(text: str) -> tuple[str, list[dict]]:
    calls = []
    for m in re.finditer(
        r"to=functions\.([^\s<]+)[^<]*(?:<\|constrain\|>[^<]*)?<\|message\|>(.*?)(<\|call\|>|$)", text, flags=re.S
    ):
        calls.append(
            _call(m.group(1), m.group(2).strip() or "{}", m.group(0))
            if m.group(3)
            else {"error": f"malformed tool call (no <|call|>): {m.group(2)[:80]!r}"}
        )
    final = re.search(r"<\|channel\|>final<\|message\|>(.*?)(?:<\|return\|>|<\|end\|>|$)", text, flags=re.S)
    content = final.group(1) if final else ("" if calls or "<|channel|>" in text else text)
    return content.strip(), calls


@register_tool_format("mistral", detect=("[TOOL_CALLS]",), special=True)
def parse_mistral(text: str) -> tuple[str, list[dict]]:
    if "[TOOL_CALLS]" not in text:
        return text.strip(), []
    content, _, rest = text.partition("[TOOL_CALLS]")
    rest = rest.replace("</s>", "").strip()
    if "[ARGS]" in rest:  # the v11+ tokenizers: NAME[ARGS]{...}, repeated after [TOOL_CALLS]
        calls = []
        for part in rest.split("[TOOL_CALLS]"):
            name, _, args = part.partition("[ARGS]")
            calls.append(_call(name.strip() or None, args.strip() or "{}", part))
        return content.strip(), calls
    try:
        listed = json.loads(rest)
    except ValueError as e:
        return content.strip(), [{"error": f"malformed tool call ({e}): {rest[:80]!r}"}]
    listed = listed if isinstance(listed, list) else [listed]
    return content.strip(), [
        _call(c.get("name"), c.get("arguments", {}), rest) if isinstance(c, dict) else _call(None, {}, rest)
        for c in listed
    ]


@register_tool_format("pythonic", detect=("[func_name1(",), special=True)
def parse_pythonic(text: str) -> tuple[str, list[dict]]:
    import ast  # here: only a run with tools imports this module

    body = text.replace("<|python_start|>", "").replace("<|python_end|>", "").replace("<|eot|>", "")
    body = body.replace("<|eot_id|>", "").strip()
    if not (body.startswith("[") and body.endswith("]") and "(" in body):
        return text.strip(), []
    try:
        tree = ast.parse(body, mode="eval").body
        if not isinstance(tree, ast.List) or not all(isinstance(c, ast.Call) for c in tree.elts):
            raise ValueError("not a list of calls")
        calls = []
        for c in tree.elts:
            assert isinstance(c, ast.Call)  # checked above
            if c.args:
                raise ValueError("positional arguments")
            name = ast.unparse(c.func)
            calls.append(_call(name, {k.arg: ast.literal_eval(k.value) for k in c.keywords}, body))
    except (SyntaxError, ValueError) as e:
        return "", [{"error": f"malformed tool call ({e}): {body[:80]!r}"}]
    return "", calls


@register_tool_format("llama3_json", detect=('"parameters": ',), special=True)
def parse_llama3_json(text: str) -> tuple[str, list[dict]]:
    body = text.replace("<|python_tag|>", "").replace("<|eom_id|>", "").replace("<|eot_id|>", "").strip()
    if not body.startswith("{"):  # an answer, not a call
        return text.strip(), []
    decoder, calls, at = json.JSONDecoder(), [], 0
    while at < len(body):
        try:
            obj, end = decoder.raw_decode(body, at)
        except ValueError as e:
            calls.append({"error": f"malformed tool call ({e}): {body[at : at + 80]!r}"})
            break
        calls.append(
            _call(obj.get("name"), obj.get("parameters", obj.get("arguments", {})), body[at:end])
            if isinstance(obj, dict)
            else _call(None, {}, body[at:end])
        )
        at = end
        while at < len(body) and body[at] in " \n;":
            at += 1
    return "", calls


def schema_parser(tokenizer) -> Callable[[str], tuple[str, list[dict]]]:
    """The tokenizer's own response schema (transformers' `parse_response`) as a parser."""

    def parse(text: str) -> tuple[str, list[dict]]:
        try:
            message = tokenizer.parse_response(text)
        except Exception as e:  # noqa: BLE001 - the model's text did not fit the schema: an error it reads
            return text.strip(), [{"error": f"malformed tool call ({type(e).__name__}: {e})"}]
        calls = [c.get("function", c) for c in message.get("tool_calls") or []]
        return (message.get("content") or "").strip(), [
            _call(c.get("name"), c.get("arguments", {}), text) for c in calls
        ]

    return parse


def resolve_format(setting: str, tokenizer) -> tuple[str, ToolFormat]:
    """(the format's name, the format) that `env.tool_format=setting` means for this tokenizer: `auto` is
    the tokenizer's response schema when it has one, else the format that reads back the calls its chat
    template writes (detect). Every format strips the tokenizer's own end-of-turn markers first (end_markers)."""
    if setting == "auto":
        found = "schema" if getattr(tokenizer, "response_schema", None) else detect(tokenizer)
        if found is None:
            raise GrpoError(
                "env.tool_format=auto: the model's chat template writes tool calls in no format grpo-cli "
                f"knows ({', '.join(TOOL_FORMATS)}), or none at all; name the format the model was "
                "trained on with env.tool_format=NAME, or use a model whose template supports tools."
            )
        setting = found
    if setting == "schema":
        if not getattr(tokenizer, "response_schema", None):
            raise GrpoError(
                "env.tool_format=schema reads calls with the tokenizer's response_schema, and this "
                "tokenizer has none; use env.tool_format=auto."
            )
        return setting, with_ends(ToolFormat(schema_parser(tokenizer), (), True), end_markers(tokenizer))
    return setting, with_ends(TOOL_FORMATS[setting], end_markers(tokenizer))


PROBE = {"name": "lookup", "arguments": {"key": "two words", "n": 3, "where": {"city": "paris", "days": [1, 2]}}}
SECOND = {"name": "add", "arguments": {"a": 1, "b": 2.5}}  # beside PROBE: two parallel calls


def detect(tokenizer) -> str | None:
    """The registered format that reads back exactly what the chat template writes for the PROBE call
    (nested arguments), or None. Where several do, those that also read two parallel calls back (where the
    template writes them), then those whose marker strings the template holds; then the first registered."""
    from jinja2.exceptions import TemplateError

    ends = end_markers(tokenizer)

    def reading(calls: list[dict], among) -> list[str]:
        written = {special: rendered_call(tokenizer, special, calls) for special in (False, True)}
        parsers = {n: with_ends(TOOL_FORMATS[n], ends) for n in among}
        return [n for n, spec in parsers.items() if spec.parse(written[spec.special])[1] == calls]

    try:
        readers = reading([PROBE], TOOL_FORMATS)
    except TemplateError:  # the template cannot write a call: no format reads one
        return None
    if len(readers) > 1:
        try:
            readers = reading([PROBE, SECOND], readers) or readers
        except TemplateError:  # one call a turn: the single call's evidence stands
            pass
    template = tokenizer.chat_template or ""
    marked = [n for n in readers if TOOL_FORMATS[n].detect and all(m in template for m in TOOL_FORMATS[n].detect)]
    found = marked or readers
    return found[0] if found else None


def end_markers(tokenizer) -> tuple[str, ...]:
    """What ends an assistant turn for this tokenizer, longest first: its end-of-sequence token, the end
    tokens its generation config lists, and what its chat template writes after an assistant's words."""
    ends = {tokenizer.eos_token or ""}
    ids = _generation_eos(tokenizer)
    ends |= {str(t) for t in tokenizer.convert_ids_to_tokens(ids) if t} if ids else set()
    ends.add(_after_assistant(tokenizer))
    return tuple(sorted((e for e in ends if e.strip()), key=len, reverse=True))


def _generation_eos(tokenizer) -> list[int]:
    """The end-of-sequence ids of generation_config.json beside a local tokenizer, or none."""
    f = Path(getattr(tokenizer, "name_or_path", "") or "") / "generation_config.json"
    if not f.is_file():
        return []
    try:
        ids = json.loads(f.read_text()).get("eos_token_id")
    except ValueError as e:
        raise GrpoError(f"{f} is not valid JSON ({e}); fix it or remove it.") from None
    return [int(i) for i in (ids if isinstance(ids, list) else [ids]) if i is not None]


def _after_assistant(tokenizer) -> str:
    """What the chat template writes after an assistant turn's words (its end-of-turn), stripped; "" if none."""
    from jinja2.exceptions import TemplateError

    mark = "Q7xZ"
    try:
        text = tokenizer.apply_chat_template(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": mark}], tokenize=False
        )
    except TemplateError:
        return ""
    return text[text.rfind(mark) + len(mark) :].strip() if mark in text else ""


def without_ends(text: str, ends: tuple[str, ...]) -> str:
    """`text` without the end-of-turn markers (and whitespace) it ends with."""
    text = text.rstrip()
    while any(text.endswith(e) for e in ends):
        text = text[: -len(next(e for e in ends if text.endswith(e)))].rstrip()
    return text


def with_ends(spec: ToolFormat, ends: tuple[str, ...]) -> ToolFormat:
    """`spec` reading a turn with the tokenizer's end-of-turn markers stripped first."""
    return ToolFormat(lambda text: spec.parse(without_ends(text, ends)), spec.detect, spec.special)


def rendered_call(tokenizer, special: bool, calls: list[dict] | None = None) -> str:
    """The text of an assistant turn making `calls` (the PROBE call), as the chat template writes it and an
    episode decodes it (special tokens kept or not)."""
    user = [{"role": "user", "content": "x"}]
    turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "id": f"call{i:05d}", "function": c} for i, c in enumerate(calls or [PROBE])
        ],
    }
    head = tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(user + [turn], tokenize=False)
    common = next((i for i, (a, b) in enumerate(zip(head, full)) if a != b), min(len(head), len(full)))
    ids = tokenizer(full[common:], add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids, skip_special_tokens=not special)


def parsed_back(calls: list[dict]) -> str | None:
    """What is wrong with the PROBE call parsed back as `calls`, or None."""
    if calls == [PROBE]:
        return None
    if any("error" in c for c in calls):
        return f"parsed back as a malformed call ({next(c['error'] for c in calls if 'error' in c)[:100]})"
    return "parsed back as no call" if not calls else f"parsed back as other calls: {calls}"[:200]


def round_trip(tokenizer, spec: ToolFormat) -> str | None:
    """Why a call the chat template writes does not parse back to itself with `spec`, or None when it does."""
    text = rendered_call(tokenizer, spec.special)
    why = parsed_back(spec.parse(text)[1])
    if why is None:
        return None
    if not text.strip():
        return "the chat template wrote no call for an assistant turn that makes one (it drops tool_calls)"
    return f"the chat template writes a call as {text[:120]!r}, which {why}"


def ignores_tools(tokenizer) -> bool:
    """Whether the chat template renders a prompt the same with and without `tools=`: the model then never
    sees the tools' descriptions (it can still call tools it was taught)."""
    user = [{"role": "user", "content": "x"}]
    tool = {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a key up.",
            "parameters": {"type": "object", "properties": {"key": {"type": "string"}}, "required": ["key"]},
        },
    }
    return tokenizer.apply_chat_template(
        user, tools=[tool], tokenize=False, add_generation_prompt=True
    ) == tokenizer.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
