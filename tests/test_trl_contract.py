"""TRL's data contract for agents, point by point (TRL 1.16's GRPOTrainer with tools and environments)."""

from __future__ import annotations

import json
import shutil

import pytest

from grpo_cli.config import EnvConfig
from grpo_cli.errors import GrpoError
from grpo_cli.models.loading import load_model
from grpo_cli.rollout.episodes import Episode
from grpo_cli.rollout.generation import Sampling
from test_episodes import QWEN_TEMPLATE, Scripted, call, episode_generator, qwen_dir, scripted  # noqa: F401

# Qwen's tool template, but a tool message's content may be a list of parts (text, and an image marker)
PARTS_TEMPLATE = QWEN_TEMPLATE.replace(
    "{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}",
    "{{- '\\n<tool_response>\\n' }}{%- if m.content is string %}{{- m.content }}{%- else %}"
    "{%- for p in m.content %}{%- if p.type == 'text' %}{{- p.text }}{%- else %}{{- '<image>' }}{%- endif %}"
    "{%- endfor %}{%- endif %}{{- '\\n</tool_response>' }}")


def tool_episode(model_dir, script: list[str], **env):
    Scripted.SCRIPT = script
    gen, tok, spec = episode_generator(model_dir, EnvConfig(tools=["trl_env.py:look"], **env))
    model = load_model(str(model_dir), device="cpu")
    prompt = tok.apply_chat_template([{"role": "user", "content": "x"}], tools=spec.schemas, tokenize=False,
                                     add_generation_prompt=True)
    return gen.generate(model, [prompt], 1, Sampling(96, greedy=True), columns={"answer": ["0"]}).episodes[0], tok


def test_a_tool_result_given_as_content_parts_is_kept_as_parts(qwen_dir, scripted, tmp_path):
    """TRL passes a list result through as the message's content; so does grpo: the transcript keeps the
    parts, the template renders them, and a text part is still bounded by env.max_tokens."""
    parts_dir = tmp_path / "parts"
    shutil.copytree(qwen_dir, parts_dir)
    config = json.loads((parts_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = PARTS_TEMPLATE
    (parts_dir / "tokenizer_config.json").write_text(json.dumps(config))
    (parts_dir / "chat_template.jinja").unlink(missing_ok=True)
    ep, tok = tool_episode(parts_dir, [call("look", thing="cat"), "done"], max_tokens=400)
    tool = ep.messages[1]
    assert tool["content"] == [{"type": "text", "text": "a picture of cat"}, {"type": "image", "url": "file://cat.png"}]
    assert "<tool_response>\na picture of cat<image>\n</tool_response>" in tok.decode(ep.ids)
    assert "[tool look] a picture of cat[image]" in ep.transcript() and ep.non_string == 0

    # a text part longer than env.max_tokens could hold (8 characters a token) is cut; the other parts are kept
    gen, _, _ = episode_generator(parts_dir, EnvConfig(tools=["trl_env.py:look"], max_tokens=400))
    ep = Episode(prompt_ids=[], seed=0)
    (message,) = gen._tool_messages(ep, [{"name": "look", "arguments": {"thing": "cat", "times": 1000}}], ["call00000"])
    text = message["content"][0]["text"]
    assert len(text) < 3300 and text.endswith("... [truncated: 12,800 more characters]")
    assert ep.truncated_results == 1 and message["content"][1] == {"type": "image", "url": "file://cat.png"}


def test_a_template_that_cannot_render_parts_is_one_sentence(qwen_dir, scripted):
    with pytest.raises(GrpoError, match="cannot render a tool result given as a list of content parts"):
        tool_episode(qwen_dir, [call("look", thing="cat"), "done"], max_tokens=400)
