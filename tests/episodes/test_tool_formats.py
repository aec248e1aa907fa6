"""Tool-call formats (grpo_cli/episodes/tool_formats.py): each format rendered by a chat template that
writes it, parsed back to the same calls (parallel calls, nested JSON arguments), malformed calls as
errors the model reads, the format detected from the template, and the pre-flight round trip.

The templates below are written for these tests, each in the shape of the models' own (the assistant's
tool calls as that family's template writes them); they are not the models' files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_cli.config import EnvConfig, SamplerConfig, TrainConfig
from grpo_cli.episodes.driver import with_env
from grpo_cli.episodes.environments import EnvSpec
from grpo_cli.episodes.tool_formats import TOOL_FORMATS, detect_format, resolve_format, round_trip
from grpo_cli.errors import GrpoError
from grpo_cli.generate.base import make_generator, register_generator
from grpo_cli.generate.hf import HFGenerator
from grpo_cli.models.loading import load_model, load_tokenizer
from helpers import forget_generator, grpo

INPUTS = Path(__file__).parents[1] / "inputs"

USER = "{%- for m in messages %}{%- if m.role == 'user' %}{{ '<u>' + m.content + '</u>' }}"
TOOL = "{%- elif m.role == 'tool' %}{{ '<t>' + m.content + '</t>' }}"
GEN = "{%- endif %}{%- endfor %}{%- if add_generation_prompt %}{{ '<a>' }}{%- endif %}"
TOOLS = "{%- if tools %}{{ '<tools>' }}{%- for t in tools %}{{ t | tojson }}{%- endfor %}{{ '</tools>' }}{%- endif %}"


def template(assistant: str, header: str = "") -> str:
    """A chat template: the tools, user and tool turns, and `assistant` for an assistant turn (the
    generation prompt is `<a>`), with `header` as text only a template of that family holds."""
    return header + TOOLS + USER + "{%- elif m.role == 'assistant' %}{{ '<a>' }}" + assistant + TOOL + GEN


TEMPLATES = {
    "hermes": template(
        "{{ m.content }}{%- for c in m.tool_calls or [] %}{{ '<tool_call>\\n' }}"
        "{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}"
        "{{ '\\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>' }}"
    ),
    "qwen3_coder": template(
        "{{ m.content }}{%- for c in m.tool_calls or [] %}{{ '\\n<tool_call>\\n<function=' + c.function.name + '>\\n' "
        "}}"
        "{%- for k, v in c.function.arguments | items %}{{ '<parameter=' + k + '>\\n' }}"
        "{{ v | tojson if v is mapping or (v is sequence and v is not string) else v | string }}"
        "{{ '\\n</parameter>\\n' }}{%- endfor %}{{ '</function>\\n</tool_call>' }}{%- endfor %}{{ '<|im_end|>' }}"
    ),
    "glm": template(
        "{{ m.content }}{%- for c in m.tool_calls or [] %}{{ '\\n<tool_call>' + c.function.name }}"
        "{%- for k, v in c.function.arguments | items %}{{ '\\n<arg_key>' + k + '</arg_key>\\n<arg_value>' }}"
        "{{ v if v is string else v | tojson }}{{ '</arg_value>' }}{%- endfor %}{{ '\\n</tool_call>' }}{%- endfor %}"
        "{{ '<|user|>' }}"
    ),
    "harmony": template(
        "{%- for c in m.tool_calls or [] %}{%- if not loop.first %}{{ '<|start|>assistant' }}{%- endif %}"
        "{{ '<|channel|>commentary to=functions.' + c.function.name + ' <|constrain|>json<|message|>' }}"
        "{{ c.function.arguments | tojson }}{{ '<|call|>' }}{%- endfor %}"
        "{%- if not m.tool_calls %}{{ '<|channel|>final<|message|>' + m.content + '<|return|>' }}{%- endif %}"
    ),
    "mistral": template(
        "{%- if m.tool_calls %}{{ '[TOOL_CALLS][' }}{%- for c in m.tool_calls %}"
        "{%- if c.id is not string or c.id | length != 9 %}"
        "{{ raise_exception('Tool call IDs should be alphanumeric strings with length 9!') }}{%- endif %}"
        "{{ {'name': c.function.name, 'arguments': c.function.arguments, 'id': c.id} | tojson }}"
        "{%- if not loop.last %}{{ ', ' }}{%- endif %}{%- endfor %}{{ ']</s>' }}"
        "{%- else %}{{ m.content + '</s>' }}{%- endif %}"
    ),
    "pythonic": template(
        "{%- if m.tool_calls %}{{ '[' }}{%- for c in m.tool_calls %}{{ c.function.name + '(' }}"
        "{%- for k, v in c.function.arguments | items %}{{ k + '=' }}{{ v | tojson }}"
        "{%- if not loop.last %}{{ ', ' }}{%- endif %}{%- endfor %}{{ ')' }}{%- if not loop.last %}{{ ', ' }}"
        "{%- endif %}{%- endfor %}{{ ']<|eot_id|>' }}{%- else %}{{ m.content + '<|eot_id|>' }}{%- endif %}",
        header="{#- Respond in the format [func_name1(params_name1=params_value1), func_name2(params)] #}",
    ),
    "llama3_json": template(
        "{%- if m.tool_calls %}{%- for c in m.tool_calls %}"
        "{{ '{\"name\": \"' + c.function.name + '\", ' }}{{ '\"parameters\": ' }}{{ c.function.arguments | tojson }}"
        "{{ '}' }}{%- if not loop.last %}{{ '; ' }}{%- endif %}{%- endfor %}{{ '<|eot_id|>' }}"
        "{%- else %}{{ m.content + '<|eot_id|>' }}{%- endif %}"
    ),
}
SPECIAL = [
    "<|im_end|>",
    "<|user|>",
    "<|start|>",
    "<|channel|>",
    "<|constrain|>",
    "<|message|>",
    "<|call|>",
    "<|return|>",
    "<|end|>",
    "[TOOL_CALLS]",
    "</s>",
    "<|eot_id|>",
    "<|python_tag|>",
]
CALLS = [
    {"name": "weather", "arguments": {"query": {"city": "Paris", "days": [1, 2]}, "units": "metric"}},
    {"name": "add", "arguments": {"a": 3, "b": 4.5}},
]


def tokenizer(chat_template: str) -> PreTrainedTokenizerFast:
    """A character tokenizer whose format markers are special tokens, as in the models' vocabularies."""
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(["<unk>", "<pad>", *SPECIAL, *chars])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    out = PreTrainedTokenizerFast(
        tokenizer_object=tok, unk_token="<unk>", pad_token="<pad>", eos_token="</s>", additional_special_tokens=SPECIAL
    )
    out.chat_template = chat_template
    return out


def rendered_turn(tok, calls: list[dict]) -> str:
    """What the template writes for an assistant turn making `calls`: the text after the generation prompt."""
    user = [{"role": "user", "content": "hi"}]
    head = tok.apply_chat_template(user, tokenize=False, add_generation_prompt=True)
    turn = {
        "role": "assistant",
        "content": "",
        "tool_calls": [{"type": "function", "id": f"call{i:05d}", "function": c} for i, c in enumerate(calls)],
    }
    full = tok.apply_chat_template(user + [turn], tokenize=False)
    assert full.startswith(head)
    return full[len(head) :]


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_each_format_parses_back_the_calls_its_template_writes(name):
    tok = tokenizer(TEMPLATES[name])
    assert detect_format(tok.chat_template) == name
    for calls in (CALLS, CALLS[1:]):  # parallel calls with nested arguments, and a single call
        _, parsed = TOOL_FORMATS[name].parse(rendered_turn(tok, calls))
        assert parsed == calls, (name, rendered_turn(tok, calls))
    found, spec = resolve_format("auto", tok)
    assert found == name and round_trip(tok, spec) is None


def reworded(template: str, markers: tuple[str, ...]) -> str:
    """The template with each marker string split in two inside its literal (Jinja's ~ joins the halves when it
    renders) and its header comment dropped: it writes the same calls, but its text holds no marker string."""
    for m in markers:
        template = template.replace(m, m[:1] + "' ~ '" + m[1:])
    return re.sub(r"\{#.*?#\}", "", template, flags=re.S)


@pytest.mark.parametrize("name", list(TEMPLATES))
def test_auto_reads_the_format_a_template_writes_not_the_words_it_holds(name, tmp_path, capsys):
    """A fine-tuned model's edited template: the same calls, none of the family's marker strings. `auto` and
    `grpo tools` find the format by parsing back what the template writes."""
    tok = tokenizer(reworded(TEMPLATES[name], TOOL_FORMATS[name].detect))
    assert not any(m in tok.chat_template for m in TOOL_FORMATS[name].detect)
    assert rendered_turn(tok, CALLS) == rendered_turn(tokenizer(TEMPLATES[name]), CALLS)  # it writes the same
    found, spec = resolve_format("auto", tok)
    assert found == name and round_trip(tok, spec) is None
    path = model_dir(tmp_path, name, chat_template=tok.chat_template)
    assert grpo("tools", f"model.path={path}") == 0
    out = "".join(capsys.readouterr())
    assert f"env.tool_format=auto reads {name}" in out and f"  ok  {name}" in out, out


@pytest.mark.parametrize("name", ["hermes", "mistral", "pythonic", "llama3_json"])
def test_a_template_whose_end_of_turn_is_another_token_still_parses(name):
    """The family's end-of-turn token replaced by <|end|> (eos stays </s>): the parsers strip what this template
    writes after a turn, read from the template itself, not one family's list."""
    family_end = {"hermes": "<|im_end|>", "mistral": "</s>", "pythonic": "<|eot_id|>", "llama3_json": "<|eot_id|>"}
    tok = tokenizer(TEMPLATES[name].replace(family_end[name], "<|end|>"))
    assert "<|end|>" in rendered_turn(tok, CALLS)
    found, spec = resolve_format("auto", tok)
    assert found == name and round_trip(tok, spec) is None
    ids = tok(rendered_turn(tok, CALLS), add_special_tokens=False)["input_ids"]
    assert spec.parse(tok.decode(ids, skip_special_tokens=not spec.special))[1] == CALLS
    if spec.special:  # the family's own parser, unaided, refuses it: what the stripping is for
        assert TOOL_FORMATS[name].parse(tok.decode(ids))[1] != CALLS


@pytest.mark.parametrize(
    "name, text",
    [
        ("hermes", '<tool_call>\n{"name": "add", "arguments": {"a": 1}\n</tool_call>'),  # a brace short
        ("hermes", '<tool_call>{"name": "add", "arguments": {"a": 1}}'),  # never closed
        ("hermes", '<tool_call>{"arguments": {"a": 1}}</tool_call>'),  # no name
        ("qwen3_coder", "<tool_call>\n<function=add>\n<parameter=a>\n1\n</parameter>\n</tool_call>"),  # no </function>
        ("glm", "<tool_call>add\n<arg_key>a</arg_key>\n<arg_value>1</arg_value>"),  # never closed
        ("harmony", '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 1'),  # no <|call|>
        (
            "harmony",
            "<|channel|>commentary to=functions.add <|constrain|>json<|message|>[1, 2]<|call|>",
        ),  # not an object
        ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 1}'),  # cut short
        ("mistral", "[TOOL_CALLS]add[ARGS]{a: 1}"),  # arguments not JSON
        ("pythonic", "[add(1, 2)]"),  # positional arguments
        ("pythonic", "[add(a=1]"),  # not Python
        ("llama3_json", '{"name": "add", "parameters": {"a": 1}'),  # cut short
    ],
)
def test_a_malformed_call_is_an_error_the_model_reads(name, text):
    content, calls = TOOL_FORMATS[name].parse(text)
    assert len(calls) == 1 and calls[0]["error"].startswith("malformed tool call ("), calls


def test_text_without_a_call_is_an_answer_in_every_format():
    for name, spec in TOOL_FORMATS.items():
        content, calls = spec.parse("The answer is 42.")
        assert calls == [] and content == "The answer is 42.", name
    assert TOOL_FORMATS["harmony"].parse("<|channel|>final<|message|>42<|return|>") == ("42", [])
    assert TOOL_FORMATS["mistral"].parse('Let me add.[TOOL_CALLS]add[ARGS]{"a": 1}')[0] == "Let me add."


def test_auto_names_the_problem_when_the_template_writes_no_known_format():
    plain = tokenizer(USER + "{%- elif m.role == 'assistant' %}{{ '<a>' + m.content }}" + GEN)
    assert detect_format(plain.chat_template) is None
    with pytest.raises(
        GrpoError,
        match=r"env.tool_format=auto: the model's chat template writes tool calls in no "
        r"format grpo-cli knows",
    ):
        resolve_format("auto", plain)
    found, spec = resolve_format("hermes", plain)  # named: the round trip finds the template drops the calls
    assert found == "hermes" and "wrote no call" in round_trip(plain, spec)


def test_a_named_format_that_is_not_the_templates_fails_the_round_trip():
    llama = tokenizer(TEMPLATES["llama3_json"])
    _, hermes = resolve_format("hermes", llama)
    why = round_trip(llama, hermes)
    assert why is not None and "parsed back as no call" in why  # never read as an answer in silence


# ---- through an episode: the turn as the model's ids, special tokens and all ---------------------------


class Writes(HFGenerator):
    """A generator whose k-th turn of an episode is SCRIPT[k], tokenized (a format's markers become their
    special tokens, as a model samples them), then the end-of-turn token."""

    SCRIPT: list[str] = []

    def complete(self, model, contexts, sampling, seeds=None, *, with_logprobs=False):
        out = []
        for ctx in contexts:
            turn = self.tokenizer.decode(ctx).count("<a>") - 1
            ids = self.tokenizer(self.SCRIPT[min(turn, len(self.SCRIPT) - 1)], add_special_tokens=False)["input_ids"]
            ids = ids + [self.tokenizer.convert_tokens_to_ids(END)]
            out.append((ids, [-0.5] * len(ids) if with_logprobs else None, True))
        return out


END = "<|eot_id|>"


def model_dir(tmp_path, name: str, chat_template: str | None = None):
    """A random 2-layer Llama with the test tokenizer, `name`'s template (or `chat_template`), and <|eot_id|>
    ending each turn."""
    chat_template = chat_template or TEMPLATES[name]
    tok = tokenizer(chat_template.replace("'</s>'", repr(END)).replace("'<|im_end|>'", repr(END)))
    tok.eos_token = END
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(tok),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
            bos_token_id=None,
        )
    )
    out = tmp_path / name
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


@pytest.mark.parametrize(
    "name, call",
    [
        ("llama3_json", '{"name": "add", "parameters": {"a": 2, "b": 3}}'),  # read as an answer before: tool use 0
        ("mistral", '[TOOL_CALLS][{"name": "add", "arguments": {"a": 2, "b": 3}, "id": "call00000"}]'),
        ("harmony", '<|channel|>commentary to=functions.add <|constrain|>json<|message|>{"a": 2, "b": 3}<|call|>'),
    ],
)
def test_an_episode_calls_the_tool_in_the_models_own_format(name, call, tmp_path):
    register_generator("writes", Writes)
    try:
        Writes.SCRIPT = [call, "5"]
        tok = load_tokenizer(str(model_dir(tmp_path, name)))
        settings = TrainConfig().generator
        settings.name = "writes"
        spec = EnvSpec(EnvConfig(tools=["trl_env.py:add"]), str(INPUTS))
        gen = with_env(
            make_generator(settings, tok, chat_template=True, precision=None, device="cpu"),
            spec,
            tok,
            chat_template=True,
        )
        prompt = tok.apply_chat_template(
            [{"role": "user", "content": "2+3?"}], tools=spec.schemas, tokenize=False, add_generation_prompt=True
        )
        (ep,) = gen.generate(
            load_model(str(tmp_path / name), device="cpu"), [prompt], 1, SamplerConfig(128, temperature=0)
        ).episodes
        assert ep.tool_calls == 1 and ep.errors == 0 and ep.messages[1]["content"] == "5", ep.messages
        assert ep.messages[0]["tool_calls"][0]["id"] == "call00000" and ep.final_text == "5"

        spec = EnvSpec(EnvConfig(tools=["trl_env.py:add"], tool_format="hermes"), str(INPUTS))
        with pytest.raises(
            GrpoError,
            match=r"env.tool_format=hermes cannot read the model's tool calls: the chat "
            r"template writes a call as .*, which parsed back as no call",
        ):
            with_env(
                make_generator(settings, tok, chat_template=True, precision=None, device="cpu"),
                spec,
                tok,
                chat_template=True,
            )
    finally:
        forget_generator("writes")


def test_grpo_tools_names_the_format_and_fails_when_none_reads_the_calls(tmp_path, capsys):
    for name in ("mistral", "pythonic"):
        assert grpo("tools", f"model.path={model_dir(tmp_path, name)}") == 0
        out = "".join(capsys.readouterr())
        assert f"env.tool_format=auto reads {name}" in out and f"  ok  {name}" in out, out
        assert "  --  hermes: parsed back as no call" in out
    assert grpo("tools", f"model.path={model_dir(tmp_path, 'mistral')}", "env.tool_format=hermes") == 2
    assert (
        "env.tool_format=hermes cannot read this model's tool calls; use env.tool_format=mistral"
        in capsys.readouterr().err
    )
    plain = model_dir(tmp_path, "plain", USER + "{%- elif m.role == 'assistant' %}{{ '<a>' + m.content }}" + GEN)
    assert grpo("tools", f"model.path={plain}") == 2
    err = capsys.readouterr().err
    assert "No tool-call format reads the calls the chat template of" in err and "Traceback" not in err


def test_a_template_that_renders_content_parts_as_a_python_list_is_warned_about_before_training():
    """TRL keeps a tool result given as content parts as parts; a template that prints them with ~ shows the
    model their Python repr. The pre-flight note names it and the fix; a template that renders parts, or
    cannot render them at all (the episode says so when a tool returns them), gets none."""
    from grpo_cli.episodes.notes import parts_note

    as_repr = TEMPLATES["hermes"].replace(TOOL, "{%- elif m.role == 'tool' %}{{ '<t>' ~ m.content ~ '</t>' }}")
    note = parts_note(tokenizer(as_repr))
    assert note is not None and "renders a tool result given as content parts as a Python list" in note
    assert "return a string from your tools" in note
    as_text = TEMPLATES["hermes"].replace(
        TOOL,
        "{%- elif m.role == 'tool' %}{{ '<t>' }}{%- if m.content is string %}{{ m.content }}{%- else %}"
        "{%- for p in m.content %}{{ p.text }}{%- endfor %}{%- endif %}{{ '</t>' }}",
    )
    assert parts_note(tokenizer(as_text)) is None
    assert parts_note(tokenizer(TEMPLATES["hermes"])) is None  # '+' with a list: cannot render parts at all
