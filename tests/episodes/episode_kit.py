"""What the agent tests share: a small Llama with Qwen2.5's tool template and tokens, a scripted generator
registered like any plugin, and a small training config (fixtures: conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from grpo_cli.config import EnvConfig, TrainConfig
from grpo_cli.episodes.driver import with_env
from grpo_cli.episodes.environments import EnvSpec
from grpo_cli.generate.base import make_generator
from grpo_cli.generate.hf import HFGenerator
from grpo_cli.models.loading import load_tokenizer

INPUTS = Path(__file__).parents[1] / "inputs"

# Qwen2.5's tool template, trimmed to what these tests render (system tools block, user, assistant with
# tool calls, consecutive tool messages in one user turn).
QWEN_TEMPLATE = (
    "{%- if tools %}{{- '<|im_start|>system\\nYou may call tools.\\n<tools>\\n' }}"
    "{%- for t in tools %}{{- t | tojson }}{{- '\\n' }}{%- endfor %}{{- '</tools><|im_end|>\\n' }}{%- endif %}"
    "{%- for m in messages %}"
    "{%- if m.role == 'user' or m.role == 'system' %}{{- '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' "
    "}}"
    "{%- elif m.role == 'assistant' %}{{- '<|im_start|>assistant\\n' + m.content }}"
    "{%- for c in m.tool_calls or [] %}{%- if m.content or not loop.first %}{{- '\\n' }}{%- endif %}"
    '{{- \'<tool_call>\\n{"name": "\' + c.function.name + \'", "arguments": \' }}{{- c.function.arguments | tojson }}'
    "{{- '}\\n</tool_call>' }}{%- endfor %}{{- '<|im_end|>\\n' }}"
    "{%- elif m.role == 'tool' %}{%- if loop.first or messages[loop.index0 - 1].role != 'tool' %}{{- "
    "'<|im_start|>user' }}"
    "{%- endif %}{{- '\\n<tool_response>\\n' + m.content + '\\n</tool_response>' }}"
    "{%- if loop.last or messages[loop.index0 + 1].role != 'tool' %}{{- '<|im_end|>\\n' }}{%- endif %}"
    "{%- endif %}{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


def char_ids(tokenizer, text: str) -> list[int]:
    """`text` one character per token, as a model may write it (never through the added tokens)."""
    return [tokenizer.convert_tokens_to_ids(c) for c in text]


class Scripted(HFGenerator):
    """A generator whose turn k of every episode is SCRIPT[k] written character by character and ended by
    <|im_end|>; it records what it was given."""

    SCRIPT: list[str] = []
    contexts: list[list[int]] = []
    calls: list[list[list[int]]] = []  # the contexts of each call (a turn of a batch of episodes)

    def complete(self, model, contexts, sampling, seeds=None, *, with_logprobs=False):
        out = []
        Scripted.calls.append([list(c) for c in contexts])
        for ctx in contexts:
            Scripted.contexts.append(list(ctx))
            turn = self.tokenizer.decode(ctx).count("<|im_start|>assistant") - 1
            ids = (char_ids(self.tokenizer, self.SCRIPT[min(turn, len(self.SCRIPT) - 1)]) + [1])[
                : sampling.max_new_tokens
            ]
            out.append((ids, [-0.5] * len(ids) if with_logprobs else None, ids[-1] == 1))
        return out


def call(name: str, **arguments) -> str:
    return f"<tool_call>\n{json.dumps({'name': name, 'arguments': arguments})}\n</tool_call>"


def episode_generator(model_dir, env: EnvConfig, generator="scripted"):
    tokenizer = load_tokenizer(str(model_dir))
    settings = TrainConfig().generator
    settings.name = generator
    spec = EnvSpec(env, str(INPUTS))
    return (
        with_env(
            make_generator(settings, tokenizer, chat_template=True, precision=None, device="cpu"),
            spec,
            tokenizer,
            chat_template=True,
        ),
        tokenizer,
        spec,
    )


def build_qwen_dir(out):
    """A random 2-layer Llama with a character tokenizer, Qwen's special and added tokens and its template."""
    chars = [chr(c) for c in range(32, 127)] + ["\n"]
    vocab = {t: i for i, t in enumerate(["<pad>", "<|im_end|>", "<|im_start|>", "<unk>"] + chars)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        pad_token="<pad>",
        eos_token="<|im_end|>",
        unk_token="<unk>",
        padding_side="left",
        additional_special_tokens=["<|im_start|>"],
    )
    fast.add_tokens(["<tool_call>", "</tool_call>"])  # added, not special: Qwen's vocabulary has them
    fast.chat_template = QWEN_TEMPLATE
    torch.manual_seed(0)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=len(fast),
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=2,
            num_key_value_heads=2,
            max_position_embeddings=1024,
            pad_token_id=0,
            eos_token_id=1,
            bos_token_id=None,
            tie_word_embeddings=True,
        )
    )
    model.save_pretrained(out)
    fast.save_pretrained(out)
    cfg = json.loads((out / "tokenizer_config.json").read_text())
    cfg["tokenizer_class"] = "PreTrainedTokenizerFast"
    (out / "tokenizer_config.json").write_text(json.dumps(cfg))
    return out


def small_cfg(tmp_path, model_dir, **env) -> TrainConfig:
    cfg = TrainConfig(output_dir=str(tmp_path))
    cfg.model.path = str(model_dir)
    t = cfg.trainer
    t.prompts_per_step, t.steps, t.micro_batch_size, t.eval_before_after, t.eval_every = 2, 2, 8, False, 0
    t.progress, t.log_completions_every, t.log_completions_groups, t.threads = False, 1, 2, 1
    cfg.sampler.group_size, cfg.sampler.max_new_tokens = 2, 128
    cfg.data.max_operand, cfg.data.num_test, cfg.data.chat_template = 9, 20, True
    cfg.generator.name = "scripted"
    cfg.env = EnvConfig(fn_dir=str(INPUTS), **env)
    cfg.algo.beta = 0.04
    return cfg
