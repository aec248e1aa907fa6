"""Decoding over a static KV cache (grpo_cli/generate/steps.py, static) samples exactly what eager decoding
samples: the same tokens and the same sampling log-probs, with finished rows leaving the batch, for SDPA
and eager attention, and on CUDA with each step replayed as a CUDA graph (run there by `make gpu-check`;
on a machine without CUDA those cases skip, saying so)."""

from __future__ import annotations

import warnings

import pytest
import torch

from grpo_cli.config import SamplerConfig
from grpo_cli.data.prompts import encode_prompts
from grpo_cli.generate import hf as generation
from grpo_cli.generate import sampling as sampling_module
from grpo_cli.generate import steps as steps_module
from grpo_cli.generate.hf import HFGenerator, completion_mask, decode, eos_token_ids
from grpo_cli.generate.steps import Steps
from helpers import with_batch_sizes

DEVICES = [
    "cpu",
    pytest.param(
        "cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
    ),
]
PROMPTS = ["3+4=", "12+30=", "7+7=", "50+25=", "3+4=", "1+1="]


def _model(tiny_dir, attn: str, device: str):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(tiny_dir), attn_implementation=attn).to(device).eval()


def _decode(model, tok, kind: str, sampling: SamplerConfig, group_size: int = 4, read_eos_every: int | None = None):
    """decode()'s ids and log-probs, each row cut after its EOS (what a row draws after its EOS while it
    stays in the batch is never read, and the two paths drop finished rows at different points)."""
    ids = encode_prompts(tok, PROMPTS, False)
    seeds = list(range(11, 11 + len(PROMPTS)))
    eos = eos_token_ids(model, tok)
    tokens, logps = decode(
        model,
        ids,
        group_size,
        sampling,
        eos_ids=eos,
        pad_id=tok.pad_token_id,
        seeds=seeds,
        with_logprobs=True,
        steps=kind,
        read_eos_every=read_eos_every,
    )
    mask, _ = completion_mask(tokens, eos)
    return tokens.masked_fill(mask == 0, tok.pad_token_id).cpu(), (logps * mask).cpu()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("attn", ["sdpa", "eager"])
@pytest.mark.parametrize(
    "sampling",
    [
        SamplerConfig(max_new_tokens=12, temperature=1.4),
        SamplerConfig(max_new_tokens=10, temperature=0.9, top_k=5, top_p=0.8),
        SamplerConfig(max_new_tokens=8, temperature=0),
    ],
    ids=["t1.4", "topk-topp", "greedy"],
)
def test_static_steps_sample_the_eager_tokens_and_logprobs(tiny_model, tiny_dir, device, attn, sampling):
    _, tok = tiny_model
    model = _model(tiny_dir, attn, device)
    eager_ids, eager_lp = _decode(model, tok, "eager", sampling)
    static_ids, static_lp = _decode(model, tok, "static", sampling)
    assert torch.equal(eager_ids, static_ids)
    torch.testing.assert_close(static_lp, eager_lp, atol=1e-5, rtol=1e-5)
    texts = set(tok.batch_decode(static_ids, skip_special_tokens=True))
    assert len(texts) > (1 if sampling.greedy else 4)  # the comparison is over varied completions


@pytest.mark.parametrize("device", DEVICES)
def test_finished_rows_leave_the_static_batch_without_changing_a_token(tiny_model, tiny_dir, device, monkeypatch):
    """With rows dropped as soon as any finishes, the static steps' batch really shrinks (a new cache, and
    on CUDA a new graph), and the tokens are those of decoding every row to the end."""
    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa", device)
    sampling = SamplerConfig(max_new_tokens=12, temperature=1.5)
    runs = {}
    for name, drop_at in (("drop", 1.0), ("keep", -1.0)):
        monkeypatch.setattr(steps_module, "STATIC_DROP_AT", drop_at)
        runs[name] = with_batch_sizes(model, lambda: _decode(model, tok, "static", sampling))
    ((drop, drop_lp), drop_rows), ((keep, keep_lp), keep_rows) = runs["drop"], runs["keep"]
    W = drop.shape[1]
    assert torch.equal(drop, keep[:, :W]) and (keep[:, W:] == tok.pad_token_id).all()
    torch.testing.assert_close(drop_lp, keep_lp[:, :W], atol=1e-5, rtol=1e-5)
    assert len(set(drop_rows[1:])) > 1 and min(drop_rows[1:]) < keep_rows[1]  # the batch shrank, more than once
    if device == "cuda":  # a forward per capture (warm-up, capture), not per token: replays run no Python
        assert len(keep_rows) < W
    else:
        assert len(keep_rows) == W  # the prefill and one forward per token after the first


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("kind", ["eager", "static"])
def test_reading_the_end_flags_every_few_tokens_changes_no_token_before_an_eos(
    tiny_model, tiny_dir, device, kind, monkeypatch
):
    """On a GPU the host reads which rows have ended every few tokens, not every one: rows that ended in
    between sample a few tokens more, and leave the batch later, but every token up to each row's EOS and
    its log-prob is what reading every token gives, and the batch still stops once all have ended."""
    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa", device)
    monkeypatch.setattr(steps_module, "STATIC_DROP_AT", 1.0)  # rows leave at every read where one has ended
    monkeypatch.setattr(steps_module, "DROP_FINISHED_AT", 1.0)
    sampling = SamplerConfig(max_new_tokens=24, temperature=1.3)
    (every, every_lp), every_rows = with_batch_sizes(
        model, lambda: _decode(model, tok, kind, sampling, read_eos_every=1)
    )
    (fifth, fifth_lp), fifth_rows = with_batch_sizes(
        model, lambda: _decode(model, tok, kind, sampling, read_eos_every=5)
    )
    W = every.shape[1]
    assert W < sampling.max_new_tokens  # every row ended: the batch stopped early
    assert fifth.shape[1] == min(-(-W // 5) * 5, sampling.max_new_tokens)  # seen at the first read after the last EOS
    assert torch.equal(every, fifth[:, :W]) and (fifth[:, W:] == tok.pad_token_id).all()
    torch.testing.assert_close(every_lp, fifth_lp[:, :W], atol=1e-5, rtol=1e-5)
    if device == "cpu":  # (on CUDA a forward runs per capture, not per token)
        assert len(set(every_rows[1:])) > 2 and len(set(fifth_rows[1:])) > 1  # rows left both batches
        assert sum(fifth_rows[1:]) > sum(every_rows[1:W])  # left later: more row-steps computed


def test_without_a_graph_each_step_attends_over_the_slots_written_so_far(tiny_model, monkeypatch):
    """On a CPU (no graph to replay fixed shapes) a static step's attention reads the prompt and the tokens
    decoded so far, not the whole buffer of prompt + max_new_tokens slots: the keys and the mask grow by one
    slot a step. (The tokens and log-probs equal eager's: the tests above.)"""
    model, tok = tiny_model
    seen = []
    sdpa = torch.nn.functional.scaled_dot_product_attention

    def recording(query, key, value, attn_mask=None, *args, **kwargs):
        seen.append((key.shape[-2], None if attn_mask is None else attn_mask.shape[-1]))
        return sdpa(query, key, value, attn_mask, *args, **kwargs)

    ids = encode_prompts(tok, PROMPTS[:2], False)
    cache, logits, mask, position, _ = generation.prefill_rows(model, ids, 1, tok.pad_token_id)
    steps = steps_module.decode_steps(model, cache, mask, position, 16, "static")
    assert isinstance(steps, Steps) and steps.allowed.shape[1] == mask.shape[1] + 16  # every slot at once
    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", recording)
    layers = model.config.num_hidden_layers
    for _ in range(3):
        steps.step(logits.argmax(-1))
    P = mask.shape[1]
    assert seen == [(n, n) for n in (P + 1, P + 2, P + 3) for _ in range(layers)]


def test_the_generator_setting_picks_the_steps_and_an_unsupported_model_decodes_eagerly(tiny_model, tiny_dir):
    """generator.decode=static on the generator gives eager's rollout; a model whose attention the static
    path cannot take (flash attention here) decodes eagerly with a warning naming why."""
    from types import SimpleNamespace

    model, tok = tiny_model
    sampling = SamplerConfig(max_new_tokens=8, temperature=1.2)
    rolls = [
        HFGenerator(tok, SimpleNamespace(decode=kind)).generate(model, PROMPTS, 3, sampling, seeds=list(range(6)))
        for kind in ("eager", "static")
    ]
    assert torch.equal(rolls[0].tokens, rolls[1].tokens) and rolls[0].completions == rolls[1].completions
    flash = _model(tiny_dir, "sdpa", "cpu")
    flash.config._attn_implementation = "flash_attention_2"
    assert "flash_attention_2" in steps_module.unsupported(flash)
    cache, logits, mask, position, _ = generation.prefill_rows(
        model, encode_prompts(tok, PROMPTS[:2], False), 1, tok.pad_token_id
    )
    with pytest.warns(RuntimeWarning, match="generator.decode=static, but attention 'flash_attention_2'"):
        steps = steps_module.decode_steps(flash, cache, mask, position, 4, "static")
    assert isinstance(steps, steps_module.EagerSteps)
    auto = steps_module.decode_steps(model, cache, mask, position, 4, "auto")
    assert isinstance(auto, Steps) and not auto.static  # a CPU: direct


def test_static_steps_under_bf16_autocast_write_each_state_in_its_cache_dtype(tiny_model, tiny_dir, monkeypatch):
    """Under bf16-mixed the keys leave the rotary embedding in float32 and the values in bf16; a transformers whose
    cache promotes the values on concatenation (5.17, found on an H100) hands the steps float32 values. Emulated
    (the prefill's values promoted to float32): the buffers keep each dtype, and the steps decode eager's tokens."""
    from grpo_cli.models.precision import Precision

    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa", "cpu")
    real_prefill = generation.prefill_rows

    def promoted_prefill(*args, **kwargs):
        cache, *rest = real_prefill(*args, **kwargs)
        for layer in cache.layers:
            layer.values = layer.values.float()
        return cache, *rest

    monkeypatch.setattr(generation, "prefill_rows", promoted_prefill)
    sampling = SamplerConfig(max_new_tokens=10, temperature=1.2)
    with Precision("bf16-mixed", "cpu").autocast():
        eager, eager_lp = _decode(model, tok, "eager", sampling)
        static, static_lp = _decode(model, tok, "static", sampling)
    assert torch.equal(eager, static)
    torch.testing.assert_close(static_lp, eager_lp, atol=0.05, rtol=0.01)


def test_noise_drawn_ahead_is_exactly_the_one_step_draws_and_survives_rows_leaving():
    """Noise draws `ahead` steps per group at once: on CPU the very numbers one draw per group and step give
    (each group's own generator, [G, vocab] a step), also as rows and whole groups leave."""
    from grpo_cli.generate.sampling import Noise

    G, V, seeds = 3, 11, [5, 6, 7, 8]
    noise = Noise(seeds, G, V, "cpu", steps=10)
    assert noise.ahead == 10
    reference = [torch.Generator().manual_seed(s) for s in seeds]
    live = torch.arange(len(seeds) * G)
    for step in range(10):
        if step == 3:
            live = live[live != 4]  # one row of group 1 leaves
        if step == 6:
            live = live[live // G != 2]  # group 2 leaves
        expected = {}
        for g in torch.unique_consecutive(live // G).tolist():
            u = torch.empty(G, V).uniform_(generator=reference[g])
            expected[g] = u.clamp(min=1e-20).log().neg().log()
        want = torch.stack([expected[r // G][r % G] for r in live.tolist()])
        assert torch.equal(noise(live), want), step


def test_sampling_costs_a_few_ops_per_token_whatever_the_number_of_groups(tiny_dir, tiny_model):
    """The host's work per token outside the model: on a GPU every op is a launch, and the launches, not the
    GPU, set decoding's pace (docs/gpu-check.md). Counted with a dispatch mode: 64 groups cost what 4 do."""
    from torch.utils._python_dispatch import TorchDispatchMode

    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa", "cpu")

    class Count(TorchDispatchMode):
        n = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    def ops_per_token(groups: int) -> float:
        prompts = [[5, 3 + i % 7] for i in range(groups)]
        counts = {}
        for T in (6, 12):
            Count.n = 0
            with Count():
                decode(
                    model,
                    prompts,
                    1,
                    SamplerConfig(max_new_tokens=T, temperature=1.0),
                    eos_ids=[10**6],
                    pad_id=0,
                    seeds=list(range(groups)),
                    steps="eager",
                )
            counts[T] = Count.n
        return (counts[12] - counts[6]) / 6

    few, many = ops_per_token(4), ops_per_token(64)
    assert many - few < 4, (few, many)  # one draw per group and token would add 60 ops or more


def test_a_capture_that_fails_decodes_without_graphs_and_says_so(tiny_model, tiny_dir, monkeypatch):
    """Graphs are an optimisation: where capturing a step fails (an op a graph cannot hold, on some transformers),
    the steps warn and run over the same static buffers without them, with eager's tokens. Simulated on CPU by
    asking for graphs with no CUDA: the capture's first CUDA call fails."""
    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa", "cpu")
    sampling = SamplerConfig(max_new_tokens=10, temperature=1.3)
    eager, eager_lp = _decode(model, tok, "eager", sampling)
    real_init = Steps.__init__

    def with_graphs(self, *args, graphs, **kwargs):
        real_init(self, *args, graphs=True, **kwargs)

    def no_stream(*args, **kwargs):
        raise RuntimeError("no CUDA here")

    monkeypatch.setattr(Steps, "__init__", with_graphs)
    monkeypatch.setattr(torch.cuda, "Stream", no_stream)
    with pytest.warns(RuntimeWarning, match=r"decoding without CUDA graphs: capturing a decode step failed \(no CUDA"):
        static, static_lp = _decode(model, tok, "static", sampling)
    assert torch.equal(eager, static)
    torch.testing.assert_close(static_lp, eager_lp, atol=1e-5, rtol=1e-5)


@pytest.mark.slow  # torch.compile builds the step's kernels first: about 30 s on a CPU (C++), a minute on a GPU
@pytest.mark.parametrize("device", DEVICES)
def test_compiled_steps_sample_the_eager_tokens_and_logprobs_across_batch_sizes(tiny_model, tiny_dir, device):
    """generator.decode=compiled: the static steps with their kernels fused by torch.compile give eager decoding's
    tokens and log-probs, for two sampler settings and batch sizes (rows leave as they finish, so the compiled step
    meets several shapes), and on CUDA the compiled step is what the graph replays."""
    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa", device)
    for sampling, group_size in ((SamplerConfig(max_new_tokens=12, temperature=1.4), 4), (SAMPLED_TOPP, 2)):
        eager_ids, eager_lp = _decode(model, tok, "eager", sampling, group_size)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # a compile that fell back would warn: not here
            compiled_ids, compiled_lp = _decode(model, tok, "compiled", sampling, group_size)
        assert torch.equal(eager_ids, compiled_ids)
        torch.testing.assert_close(compiled_lp, eager_lp, atol=1e-5, rtol=1e-5)
        assert len(set(tok.batch_decode(compiled_ids, skip_special_tokens=True))) > 4  # varied completions


SAMPLED_TOPP = SamplerConfig(max_new_tokens=10, temperature=0.9, top_k=5, top_p=0.8)


def test_a_compile_that_fails_decodes_uncompiled_and_says_so(tiny_model, tiny_dir, monkeypatch):
    """Compiling is an optimisation: where it fails (no C++ compiler for a CPU's kernels, a model dynamo cannot
    trace), the first step warns and the steps run uncompiled over the same buffers, with eager's tokens."""
    _, tok = tiny_model
    model = _model(tiny_dir, "sdpa", "cpu")
    sampling = SamplerConfig(max_new_tokens=10, temperature=1.3)
    eager, eager_lp = _decode(model, tok, "eager", sampling)

    def broken(forward):
        def run(*args):
            raise RuntimeError("InvalidCxxCompiler: no working C++ compiler found")

        return run

    monkeypatch.setattr(steps_module, "compile_once", broken)
    monkeypatch.setattr(sampling_module, "_FUSED", [sampling_module.Fused(broken(None))])
    with pytest.warns(RuntimeWarning) as warned:
        compiled, compiled_lp = _decode(model, tok, "compiled", sampling)
    said = sorted(str(w.message).split(":")[0] for w in warned)
    assert said == ["decoding without torch.compile", "sampling without torch.compile"]  # once each
    assert all("(RuntimeError: InvalidCxxCompiler: no working C++ compiler found)" in str(w.message) for w in warned)
    assert torch.equal(eager, compiled)
    torch.testing.assert_close(compiled_lp, eager_lp, atol=1e-5, rtol=1e-5)
