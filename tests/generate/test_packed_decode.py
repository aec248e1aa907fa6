"""Decoding on a CPU with oneDNN-packed weights (grpo_cli/generate/packed.py, generator.matmul): the packed
product against a float64 one, which layers it takes and leaves, the modules restored after, and the
generator's tokens and sampling log-probs against torch's own product."""

from __future__ import annotations

import types

import pytest
import torch

from grpo_cli.config import SamplerConfig
from grpo_cli.generate import hf as generation
from grpo_cli.generate import packed
from grpo_cli.generate.hf import HFGenerator
from grpo_cli.generate.packed import MIN_WEIGHTS, has_packable, packed_linears

pytestmark = pytest.mark.skipif(not packed.available(), reason="this torch has no oneDNN packed-linear ops on the CPU")


def _linear(n_in: int, n_out: int, bias: bool = True, seed: int = 0) -> torch.nn.Linear:
    torch.manual_seed(seed)
    return torch.nn.Linear(n_in, n_out, bias=bias)


@pytest.mark.parametrize("shape", [(5, 512), (3, 1, 512), (70, 1, 512)], ids=["2d", "decode", "prefill"])
@pytest.mark.parametrize("bias", [True, False])
def test_the_packed_product_is_the_float64_product_to_float32_rounding(shape, bias):
    layer = _linear(512, 1024, bias)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    want = x.double() @ layer.weight.double().t() + (layer.bias.double() if bias else 0.0)
    with torch.no_grad(), packed_linears(layer, rows=shape[0]) as count:
        assert count == 1 and "forward" in layer.__dict__  # the packed op, not nn.Linear's own forward
        got = layer(x)
    assert got.dtype == torch.float32 and got.shape == (*shape[:-1], 1024)
    # a float32 sum of 512 products of values near 1: rounding of a few 1e-6 relative, as torch's own product
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)


def test_only_large_plain_float32_linears_are_packed_and_every_module_is_restored_after():
    class Quantised(torch.nn.Linear):  # stands for bitsandbytes' Linear4bit, a subclass of nn.Linear
        pass

    big = 1024 * 512
    assert big >= MIN_WEIGHTS > 128 * 128
    model = torch.nn.Sequential(
        _linear(512, 1024),
        _linear(128, 128),
        Quantised(512, 1024),
        _linear(512, 1024).to(torch.bfloat16),
        _linear(1024, 512),
    )
    with torch.no_grad(), packed_linears(model) as count:
        assert count == 2
        replaced = ["forward" in m.__dict__ for m in model]
    assert replaced == [True, False, False, False, True]
    assert not any("forward" in m.__dict__ for m in model)
    with pytest.raises(RuntimeError, match="boom"), torch.no_grad(), packed_linears(model):
        raise RuntimeError("boom")
    assert not any("forward" in m.__dict__ for m in model)  # restored on the way out of an error too
    assert has_packable(model) and not has_packable(torch.nn.Sequential(_linear(128, 128)))


def _wide_model(tiny_dir):
    """A Llama of the tiny tokenizer's vocabulary, wide enough that its projections are packed (random weights)."""
    import transformers

    vocab = transformers.AutoConfig.from_pretrained(str(tiny_dir)).vocab_size
    config = transformers.LlamaConfig(
        vocab_size=vocab,
        hidden_size=512,
        intermediate_size=1024,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=8,
        max_position_embeddings=128,
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=1,
        pad_token_id=0,
        initializer_range=0.1,
    )  # logits far from flat: few near-ties to round apart
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.LlamaForCausalLM(config).eval()


@pytest.mark.parametrize(
    "sampling",
    [SamplerConfig(max_new_tokens=12, temperature=1.2), SamplerConfig(max_new_tokens=8, temperature=0)],
    ids=["t1.2", "greedy"],
)
def test_the_generator_samples_the_same_tokens_and_log_probs_with_packed_weights(
    tiny_model, tiny_dir, sampling, monkeypatch
):
    _, tok = tiny_model
    model = _wide_model(tiny_dir)
    packed_layers = []

    def spy(model, rows=32, dtype=torch.float32):
        context = packed_linears(model, rows, dtype)

        class Spy:
            def __enter__(self):
                packed_layers.append(context.__enter__())

            def __exit__(self, *exc):
                return context.__exit__(*exc)

        return Spy()

    monkeypatch.setattr(generation, "packed_linears", spy)
    prompts = ["3+4=", "12+30=", "7+7=", "3+4="]
    out = {}
    for matmul in ("plain", "packed"):
        g = HFGenerator(tok, types.SimpleNamespace(decode="auto", matmul=matmul, weights="full"))
        out[matmul] = g.generate(model, prompts, 3, sampling, seeds=[5, 6, 7, 8], with_logprobs=True)
    # 2 layers x 7 projections (q, k, v, o: 512 x 512; gate, up, down: 1024 x 512), not the 59-row head
    assert packed_layers == [14]
    plain, fast = out["plain"], out["packed"]
    assert plain.completions == fast.completions
    assert len(set(plain.completions)) > (1 if sampling.greedy else 4)  # varied completions, not one repeated
    torch.testing.assert_close(fast.sampler_logp, plain.sampler_logp, rtol=0, atol=1e-4)


def test_auto_packs_nothing_for_the_tiny_model_and_packs_bf16_under_autocast(tiny_model, tiny_dir, monkeypatch):
    """The default task's model has no layer worth packing, so auto never even times the probe; a bf16-mixed
    decode packs bf16 copies where its own probe (in bf16) says so."""
    model, tok = tiny_model
    monkeypatch.setattr(packed, "available", lambda dtype=torch.float32: True)  # a CPU with oneDNN's bf16 product
    monkeypatch.setattr(generation, "packing_helps", lambda device, dtype: pytest.fail("probed with nothing to pack"))
    g = HFGenerator(tok, types.SimpleNamespace(decode="auto", matmul="auto", weights="full"))
    assert not has_packable(model) and g._packs(model, g.precision) is None
    wide, asked = _wide_model(tiny_dir), []
    monkeypatch.setattr(
        generation, "packing_helps", lambda device, dtype: asked.append(dtype) or dtype == torch.bfloat16
    )
    assert g._packs(wide, generation.Precision("bf16-mixed", "cpu")) == torch.bfloat16
    assert g._packs(wide, g.precision) is None  # auto follows the probe, asked in the decode's dtype
    assert asked == [torch.bfloat16, torch.float32]
    g.matmul = "packed"
    assert g._packs(wide, g.precision) == torch.float32  # packed does not ask it
    g.matmul = "plain"
    assert g._packs(wide, generation.Precision("bf16-mixed", "cpu")) is None


def test_a_cpu_without_onednns_bf16_product_packs_nothing_under_bf16_autocast(tiny_model, tiny_dir, monkeypatch):
    """On an AVX2-only CPU oneDNN's bf16 reorder raises: there a bf16 decode packs nothing, generator.matmul=packed
    included, and never probes; autocast's own product runs. float32 packing is unaffected."""
    _, tok = tiny_model
    monkeypatch.setattr(packed, "available", lambda dtype=torch.float32: dtype == torch.float32)
    monkeypatch.setattr(generation, "packing_helps", lambda device, dtype: pytest.fail("probed a dtype it lacks"))
    wide, bf16 = _wide_model(tiny_dir), generation.Precision("bf16-mixed", "cpu")
    for matmul in ("auto", "packed"):
        g = HFGenerator(tok, types.SimpleNamespace(decode="auto", matmul=matmul, weights="full"), precision=bf16)
        assert g._packs(wide, bf16) is None
    g.matmul = "packed"
    assert g._packs(wide, generation.Precision("fp32", "cpu")) == torch.float32
    layer, x = _linear(512, 1024), torch.randn(3, 512)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = layer(x)
        with packed_linears(layer, rows=3, dtype=torch.bfloat16) as count:
            assert count == 0 and torch.equal(layer(x), want)


def test_only_a_cpu_with_onednns_bf16_product_is_said_to_have_it():
    """packed.available(bf16) is oneDNN's own answer (on AVX2 alone its bf16 reorder raises); float32's is the ops'."""
    supported = torch.ops.mkldnn._is_mkldnn_bf16_supported()
    assert packed.available(torch.bfloat16) == supported and packed.available(torch.float16) is False
    if not supported:
        with pytest.raises(RuntimeError):
            torch.ops.mkldnn._reorder_linear_weight(torch.randn(8, 8).bfloat16(), 1)


@pytest.mark.skipif(not packed.available(torch.bfloat16), reason="this CPU's oneDNN has no bf16 product (AVX2 only)")
@pytest.mark.parametrize("shape", [(5, 512), (3, 1, 512)], ids=["2d", "decode"])
def test_the_packed_bf16_product_is_autocasts_bf16_linear(shape):
    """Packed in bf16, a layer's product is bf16 autocast's own (bf16 inputs and weights, a bf16 result), to a
    bf16 rounding of the output, and both are the float64 product of the bf16-rounded inputs to bf16's precision."""
    layer = _linear(512, 1024)
    x = torch.randn(*shape, generator=torch.Generator().manual_seed(1))
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        want = layer(x)
        with packed_linears(layer, rows=shape[0], dtype=torch.bfloat16) as count:
            got = layer(x)
    assert count == 1 and got.dtype == want.dtype == torch.bfloat16 and got.shape == want.shape
    exact = x.bfloat16().double() @ layer.weight.bfloat16().double().t() + layer.bias.bfloat16().double()
    torch.testing.assert_close(got.double(), want.double(), rtol=2**-7, atol=1e-3)  # one bf16 step apart at most
    torch.testing.assert_close(got.double(), exact, rtol=2**-7, atol=2e-3)


@pytest.mark.skipif(not packed.available(torch.bfloat16), reason="this CPU's oneDNN has no bf16 product (AVX2 only)")
def test_a_bf16_decode_samples_the_same_tokens_packed_as_under_autocasts_own_product(tiny_model, tiny_dir):
    """trainer.precision=bf16-mixed (and generator.weights=bf16, the same autocast): packed bf16 weights give
    the same completions and sampling log-probs as autocast's own bf16 product, to bf16 rounding."""
    _, tok = tiny_model
    model = _wide_model(tiny_dir)
    prompts, out = ["3+4=", "12+30=", "7+7=", "3+4="], {}
    for matmul in ("plain", "packed"):
        g = HFGenerator(
            tok,
            types.SimpleNamespace(decode="auto", matmul=matmul, weights="full"),
            precision=generation.Precision("bf16-mixed", "cpu"),
        )
        assert g._packs(model, g.precision) == (torch.bfloat16 if matmul == "packed" else None)
        out[matmul] = g.generate(
            model, prompts, 3, SamplerConfig(max_new_tokens=10, temperature=1.2), seeds=[5, 6, 7, 8], with_logprobs=True
        )
    plain, fast = out["plain"], out["packed"]
    assert plain.completions == fast.completions and len(set(plain.completions)) > 4
    torch.testing.assert_close(fast.sampler_logp, plain.sampler_logp, rtol=0, atol=0.05)


def test_float32_attention_is_sdpa_in_float32_with_the_padding_mask_and_is_restored(tiny_dir):
    """packed.float32_attention: in float32 the same logits as the model's own sdpa, left padding masked; under
    bf16 autocast closer to the float32 model than autocast's bf16 sdpa; the config restored, also on an error."""
    from grpo_cli.generate.packed import float32_attention

    model = _wide_model(tiny_dir)
    ids = torch.randint(3, 50, (3, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    mask[0, :5] = 0  # a left-padded row
    mask[2, :2] = 0

    def logits(autocast: bool, fp32_attention: bool) -> torch.Tensor:
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            with float32_attention(model) if fp32_attention else torch.autocast("cpu", enabled=autocast):
                out = model(ids, attention_mask=mask).logits.float()
        return out[mask.bool()]  # the real positions

    exact = logits(False, False)
    torch.testing.assert_close(logits(False, True), exact, rtol=1e-5, atol=1e-5)
    in_bf16, in_fp32 = (logits(True, False) - exact).abs().mean(), (logits(True, True) - exact).abs().mean()
    assert in_fp32 < in_bf16, (in_fp32, in_bf16)
    assert model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="inside"), float32_attention(model) as applied:
        assert applied and model.config._attn_implementation == packed.FLOAT32_SDPA
        raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"
    model.config._attn_implementation = "eager"
    with float32_attention(model) as applied:
        assert not applied and model.config._attn_implementation == "eager"
