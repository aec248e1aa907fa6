"""Decoding through the model's layers directly (grpo_cli/generate/steps.py, direct) samples bitwise what decoding
through the model's forward samples: the same tokens and the same sampling log-probs, for SDPA and eager
attention, with padded and unpadded rows, rows leaving the batch, the cache growing, under bf16 autocast, and for
each model type it takes (checked against the forward's logits step by step)."""

from __future__ import annotations

import pytest
import torch

from grpo_cli.config import SamplerConfig
from grpo_cli.data.prompts import encode_prompts
from grpo_cli.generate import hf as generation
from grpo_cli.generate import steps as steps_module
from grpo_cli.generate.hf import completion_mask, decode, eos_token_ids
from grpo_cli.generate.steps import Steps

PADDED = ["3+4=", "12+30=", "7+7=", "50+25=", "3+4=", "1+1="]  # lengths differ: rows are left-padded
SAME_LENGTH = ["3+4=", "5+2=", "9+1=", "1+1="]
SAMPLINGS = [
    SamplerConfig(max_new_tokens=12, temperature=1.4),
    SamplerConfig(max_new_tokens=10, temperature=0.9, top_k=5, top_p=0.8),
    SamplerConfig(max_new_tokens=8, temperature=0),
]


def _model(tiny_dir, attn: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_dir), attn_implementation=attn).eval()


def _decode(model, tok, kind: str, sampling: SamplerConfig, prompts=PADDED, group_size: int = 4):
    """decode()'s ids and log-probs, each row cut after its EOS (the two paths may drop finished rows at
    different points, and what a row draws after its EOS is never read)."""
    ids = encode_prompts(tok, prompts, False)
    eos = eos_token_ids(model, tok)
    tokens, logps = decode(
        model,
        ids,
        group_size,
        sampling,
        eos_ids=eos,
        pad_id=tok.pad_token_id,
        seeds=list(range(11, 11 + len(prompts))),
        with_logprobs=True,
        steps=kind,
    )
    mask, _ = completion_mask(tokens, eos)
    return tokens.masked_fill(mask == 0, tok.pad_token_id), logps * mask


@pytest.mark.parametrize("prompts", [PADDED, SAME_LENGTH], ids=["padded", "unpadded"])
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize("sampling", SAMPLINGS, ids=["t1.4", "topk-topp", "greedy"])
def test_direct_steps_sample_the_forwards_tokens_and_logprobs_bitwise(tiny_model, tiny_dir, attn, sampling, prompts):
    _, tok = tiny_model
    model = _model(tiny_dir, attn)
    eager_ids, eager_lp = _decode(model, tok, "eager", sampling, prompts)
    direct_ids, direct_lp = _decode(model, tok, "direct", sampling, prompts)
    assert torch.equal(eager_ids, direct_ids)
    assert torch.equal(eager_lp, direct_lp)
    if not sampling.greedy:  # the comparison is over varied completions (greedy gives the tiny model's one answer)
        assert len(set(tok.batch_decode(direct_ids, skip_special_tokens=True))) > 3


def test_rows_leaving_and_the_cache_growing_change_no_token(tiny_model, tiny_dir, monkeypatch):
    """Rows leave at every read where one has ended, and the buffers start with room for 3 tokens and grow
    (several times over 12): the tokens and log-probs are still the forward's."""
    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa")
    sampling = SamplerConfig(max_new_tokens=12, temperature=1.4)
    eager = _decode(model, tok, "eager", sampling)
    built = []
    real_init = Steps.__init__

    def spy(self, *args, **kwargs):
        real_init(self, *args, **kwargs)
        built.append(self)

    monkeypatch.setattr(steps_module, "DROP_FINISHED_AT", 1.0)
    monkeypatch.setattr(steps_module, "ROOM", 3)
    monkeypatch.setattr(Steps, "__init__", spy)
    direct = _decode(model, tok, "direct", sampling)
    assert torch.equal(eager[0], direct[0]) and torch.equal(eager[1], direct[1])
    steps = built[0]
    assert steps.allowed.shape[0] < len(PADDED) * 4  # rows left
    assert steps.allowed.shape[1] > 3 + len(encode_prompts(tok, PADDED, False)[1])  # the buffers grew


def test_bf16_autocast_decodes_as_the_forward(tiny_model, tiny_dir):
    """Under bf16 autocast (trainer.precision=bf16-mixed on a CPU) the keys leave the rotary embedding in float32
    and the values in bf16: the buffers keep each dtype, as the growing cache does."""
    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa")
    sampling = SamplerConfig(max_new_tokens=6, temperature=1.0)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        eager = _decode(model, tok, "eager", sampling)
        direct = _decode(model, tok, "direct", sampling)
    assert torch.equal(eager[0], direct[0]) and torch.equal(eager[1], direct[1])


def _random_model(model_type: str):
    from transformers import AutoConfig, AutoModelForCausalLM

    shape = dict(
        vocab_size=97,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        head_dim=16,
    )
    extra = {
        "qwen2": dict(use_sliding_window=False),
        "mistral": dict(sliding_window=None),
        "qwen3": dict(use_sliding_window=False),
    }.get(model_type, {})
    config = AutoConfig.for_model(model_type, **shape, **extra)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return AutoModelForCausalLM.from_config(config).eval()


@pytest.mark.parametrize("model_type", steps_module.TYPES)
def test_each_model_type_steps_bitwise_as_its_forward(model_type):
    """Qwen2's attention biases, Qwen3's query and key norms, grouped keys and values: five steps of the same
    tokens from a padded prefill give the forward's logits exactly."""
    model = _random_model(model_type)
    assert steps_module.unsupported(model) is None
    ids = torch.tensor([[0, 0, 5, 6, 7], [1, 2, 3, 4, 5]])
    mask = (torch.arange(5) >= torch.tensor([[2], [0]])).long()
    position = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True)
        kwarg = steps_module.cache_kwarg(model)
        eager = steps_module.EagerSteps(model, getattr(out, kwarg), mask, position[:, -1] + 1)
        out = model(input_ids=ids, attention_mask=mask, position_ids=position, use_cache=True)
        direct = Steps(model, getattr(out, kwarg), mask, position[:, -1] + 1, 5)
        for token in ([8, 9], [10, 11], [12, 13], [14, 15], [16, 17]):
            tokens = torch.tensor(token)
            assert torch.equal(eager.step(tokens), direct.step(tokens))


def test_a_model_it_does_not_take_decodes_eagerly_and_an_explicit_ask_warns(tiny_model, tiny_dir):
    model = _random_model("mistral")
    model.config.sliding_window = 4
    assert "sliding-window" in steps_module.unsupported(model)
    flash = _model(tiny_dir, "sdpa")
    flash.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in steps_module.unsupported(flash)
    gemma = _random_model("llama")
    gemma.config.model_type = "gemma"  # scales its embeddings in its forward: not a type the direct path takes
    assert "'gemma'" in steps_module.unsupported(gemma)
    ids = torch.tensor([[1, 2, 3]])
    mask, position = torch.ones_like(ids), torch.tensor([3])
    with torch.no_grad():
        cache = getattr(model(input_ids=ids, use_cache=True), steps_module.cache_kwarg(model))
    with pytest.warns(RuntimeWarning, match="generator.decode=direct, but sliding-window attention"):
        steps = steps_module.decode_steps(model, cache, mask, position, 4, "direct")
    assert isinstance(steps, steps_module.EagerSteps)
    assert isinstance(steps_module.decode_steps(model, cache, mask, position, 4, "auto"), steps_module.EagerSteps)
    tiny, _ = tiny_model
    with torch.no_grad():
        cache = getattr(tiny(input_ids=ids, use_cache=True), steps_module.cache_kwarg(tiny))
    assert isinstance(steps_module.decode_steps(tiny, cache, mask, position, 4, "auto"), Steps)  # a CPU


def test_the_prefill_keeps_one_row_a_prompt_and_the_buffers_get_every_rows_copy(tiny_model, tiny_dir):
    """prefill_rows runs and keeps each distinct prompt once (PADDED has a twin: 5 of 6), naming each of the
    6 x G rows' source; the steps gather those into their buffers, equal to the cache spread to every row."""
    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa")
    ids = encode_prompts(tok, PADDED, False)
    cache, logits, mask, position, source = generation.prefill_rows(model, ids, 3, tok.pad_token_id)
    assert cache.layers[0].keys.shape[0] == 5 and mask.shape[0] == logits.shape[0] == 18
    assert source.tolist() == [r for r in (0, 1, 2, 3, 0, 4) for _ in range(3)]
    spread = generation.prefill_rows(model, ids, 3, tok.pad_token_id)[0]
    spread.batch_select_indices(source)
    steps = Steps(model, cache, mask, position, 4, source=source)
    width = mask.shape[1]
    for mine, theirs in zip(steps.layers, spread.layers):
        assert mine.keys.shape[2] == width + 4  # room for the 4 new tokens
        assert torch.equal(mine.keys[:, :, :width], theirs.keys) and torch.equal(
            mine.values[:, :, :width], theirs.values
        )


def test_a_bf16_decode_on_a_cpu_takes_the_direct_path_with_float32_attention(tiny_model, tiny_dir, monkeypatch):
    """Under bf16-mixed the hf generator on a CPU attends in float32 (packed.float32_attention), a kernel of
    another name: generator.decode=auto still takes the direct steps there (it took eager ones, silently), and
    they sample the eager steps' tokens and log-probs bitwise."""
    from types import SimpleNamespace

    from grpo_cli.models.precision import Precision

    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa")
    chosen, real = [], generation.decode_steps

    def spy(*args, **kwargs):
        steps = real(*args, **kwargs)
        chosen.append((type(steps).__name__, model.config._attn_implementation))
        return steps

    monkeypatch.setattr(generation, "decode_steps", spy)
    sampling = SamplerConfig(max_new_tokens=8, temperature=1.2)
    rolls = [
        generation.HFGenerator(
            tok, SimpleNamespace(decode=kind, matmul="auto", weights="full"), precision=Precision("bf16-mixed", "cpu")
        ).generate(model, PADDED, 3, sampling, seeds=list(range(6)), with_logprobs=True)
        for kind in ("auto", "eager")
    ]
    from grpo_cli.generate.packed import FLOAT32_SDPA

    assert chosen == [("Steps", FLOAT32_SDPA), ("EagerSteps", FLOAT32_SDPA)]
    assert torch.equal(rolls[0].tokens, rolls[1].tokens) and torch.equal(rolls[0].sampler_logp, rolls[1].sampler_logp)
    assert len(set(rolls[0].completions)) > 3  # varied completions, not one answer sampled 18 times
