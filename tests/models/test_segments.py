"""Block-by-block attention over packed bins (segments.py): the same log-probs, loss and gradients as the masked
sdpa forward and as each row alone, in fp32, for plain bins and shared prompts; the blocks by hand; where it
applies."""

from dataclasses import replace

import pytest
import torch
from test_packing import llama
from test_shared_prompts import T, alone, loss_and_grads, rollout

from grpo_cli.models import logprobs, packer, segments
from grpo_cli.models.loading import enable_checkpointing
from grpo_cli.models.packer import pack, packed_inputs, shared_inputs
from helpers import on_grid, scored_cells


def test_the_blocks_of_plain_bins_and_of_shared_prompts_by_hand(monkeypatch):
    """Rows [9 | 8 7], [6 | 3], [4 5 | 1], [4 5 | 2 3 10] (prompt | completion); the last two share a prompt.
    Attended block by block (the length it applies from lowered to these rows'), the micro-batch is one bin,
    longest row first: rows 3, 0, 2, 1, each causal over itself. Shared: units (rows 2 and 3: 2 + 1 + 3 = 6),
    (row 0), (row 1) in one bin; each prompt is a block, each completion a block that sees its prompt."""
    monkeypatch.setattr(packer, "GROW_FROM", 1)
    tokens = torch.tensor([9, 8, 7, 6, 3, 4, 5, 1, 4, 5, 2, 3, 10])
    lengths, prompts, offsets = [3, 2, 3, 5], [1, 1, 2, 2], [0, 3, 5, 8]
    (mb,) = pack(lengths, layout="bins", batch_rows=4, by_block=True)
    assert mb.bins == ((3, 0, 2, 1),) and mb.capacity == 13 and mb.by_block
    plain = packed_inputs(tokens, offsets, lengths, prompts, mb)
    assert plain.blocks == (((0, 5, 0, 0), (5, 8, 0, 0), (8, 11, 0, 0), (11, 13, 0, 0)),)
    shared = shared_inputs(tokens, offsets, lengths, prompts, mb)
    assert shared.input_ids.tolist() == [[4, 5, 1, 2, 3, 10, 9, 8, 7, 6, 3]]
    assert shared.blocks == (
        ((0, 2, 0, 0), (2, 3, 0, 2), (3, 6, 0, 2), (6, 7, 0, 0), (7, 9, 6, 7), (9, 10, 0, 0), (10, 11, 9, 10)),
    )
    assert shared.mask is not None  # the tree, for a model that cannot go block by block


def test_rows_shorter_than_the_length_blocks_pay_from_stay_in_bins_under_the_mask():
    """One attention call per row costs short rows more than the pairs it saves (the default task's update took
    2.5x as long row by row): a micro-batch goes block by block only when its longest row has GROW_FROM tokens."""
    short, long = [10, 12, 9], [10, packer.GROW_FROM, 9]
    (mb,) = pack(short, layout="bins", batch_rows=3, by_block=True)
    assert not mb.by_block and mb.capacity == 12
    assert packed_inputs(torch.ones(31, dtype=torch.long), [0, 10, 22], short, [2, 2, 2], mb).blocks is None
    (mb,) = pack(long, layout="shared", batch_rows=3, by_block=True)
    assert mb.by_block and mb.bins == ((1, 0, 2),) and mb.capacity == sum(long)
    (mb,) = pack(long, layout="bins", batch_rows=3)
    assert not mb.by_block


def blocks_of(packed):
    """The blocks of bins laid for the mask, from their position ids (a row restarts at 0; a shared completion
    continues its prompt's positions) and, with shared prompts, the tree: an independent reading of the layout."""
    out = []
    for b, pos in enumerate(packed.position_ids.tolist()):
        unit = packed.tree[0][b].tolist() if packed.tree else [0] * len(pos)
        branch = packed.tree[1][b].tolist() if packed.tree else [0] * len(pos)
        starts = [
            i
            for i in range(len(pos))
            if i == 0 or pos[i] != pos[i - 1] + 1 or branch[i] != branch[i - 1] or unit[i] != unit[i - 1]
        ]
        in_bin, prompt = [], {}
        for s, e in zip(starts, starts[1:] + [len(pos)]):
            if packed.tree and unit[s] < 0:
                continue  # filler
            if branch[s] == 0 or not packed.tree:
                prompt[unit[s]] = (s, e)
                in_bin.append((s, e, 0, 0))
            else:
                in_bin.append((s, e) + prompt[unit[s]])
        out.append(tuple(in_bin))
    return tuple(out)


def test_a_blocks_mask_by_hand():
    """A 2-token completion after a 3-token prompt: query 0 sees the prompt and itself, query 1 one more. With a
    window of 2 (key > query - 2), query 2 of a 3-token row no longer sees key 0; the window of 4 keeps the
    completion's query 1 (position 4) from key 0. Plain causal attention needs no mask."""
    assert segments.block_mask(2, 3, None, "cpu").int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]
    assert segments.block_mask(3, 0, 2, "cpu").int().tolist() == [[1, 0, 0], [1, 1, 0], [0, 1, 1]]
    assert segments.block_mask(2, 3, 4, "cpu").int().tolist() == [[1, 1, 1, 1, 0], [0, 1, 1, 1, 1]]
    assert segments.block_mask(3, 0, None, "cpu") is None and segments.block_mask(3, 0, 3, "cpu") is None


def test_a_sliding_window_limits_block_attention_as_the_models_own_mask_does(monkeypatch):
    """Qwen2 with a 3-position sliding window on every layer, rows up to 12 tokens: block by block (both layouts)
    against each row alone through the model's own forward, within 1e-5."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from grpo_cli.models.logprobs import LogProbRequest, enable_logprob_forward, packed_logprobs

    monkeypatch.setattr(packer, "GROW_FROM", 1)
    torch.manual_seed(0)
    model = Qwen2ForCausalLM(
        Qwen2Config(
            vocab_size=61,
            hidden_size=48,
            intermediate_size=96,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            use_sliding_window=True,
            sliding_window=3,
            max_window_layers=0,
            attn_implementation="sdpa",
        )
    )
    enable_logprob_forward(model)
    assert model.config.layer_types == ["sliding_attention"] * 2
    tokens, offsets, lengths, prompts = rollout()
    (mb,) = pack(lengths, layout="bins", batch_rows=len(lengths), by_block=True)
    reference = alone(model, tokens, offsets, lengths, prompts)
    with torch.no_grad():
        for lay in (packed_inputs, shared_inputs):
            packed = lay(tokens, offsets, lengths, prompts, mb)
            assert packed.blocks is not None
            logp, _ = packed_logprobs(model, packed, LogProbRequest(T))
            row, col = scored_cells(packed, offsets, prompts)
            assert torch.allclose(on_grid(logp.double(), row, col, reference.shape), reference, atol=1e-5, rtol=0)


def graph_nodes(tensor) -> list[str]:
    """The names of the autograd nodes `tensor` was computed by."""
    seen, stack, names = set(), [tensor.grad_fn], []
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.append(type(node).__name__)
        stack.extend(next_fn for next_fn, _ in node.next_functions)
    return names


def test_block_attention_cuts_each_tensor_once_so_the_backward_sums_no_bin_sized_zeros():
    """Three rows, one with a shared prompt, and filler, in one bin: against attention of each block by hand, and
    the backward holds one split per query, key and value, no slice per block (a slice's backward is a zero tensor
    of the whole bin; summed over every block it doubled the backward of a 24-row bin). Each position's
    gradient still reaches it: the filler's is zero, the prompt's collects the completion that reads it."""
    torch.manual_seed(0)
    blocks = (((0, 3, 0, 0), (3, 5, 0, 3), (5, 9, 0, 0), (10, 12, 0, 0)),)  # positions 9 and 12-13: filler
    q, k, v = (torch.randn(1, 2, 14, 4, requires_grad=True) for _ in range(3))
    out, _ = segments.attend(None, q, k, v, **{segments.KEYWORD: blocks})
    names = graph_nodes(out)
    assert names.count("SplitWithSizesBackward0") == 3 and "SliceBackward0" not in names
    sdpa = torch.nn.functional.scaled_dot_product_attention
    rows = lambda s, e: (q[..., s:e, :], k[..., s:e, :], v[..., s:e, :])  # noqa: E731
    expect = torch.zeros(1, 2, 14, 4)
    for s, e in ((0, 3), (5, 9), (10, 12)):
        expect[..., s:e, :] = sdpa(*rows(s, e), is_causal=True)
    keys, values = k[..., 0:5, :], v[..., 0:5, :]
    expect[..., 3:5, :] = sdpa(q[..., 3:5, :], keys, values, attn_mask=torch.ones(2, 5, dtype=torch.bool).tril(3))
    assert torch.allclose(out.transpose(1, 2), expect, atol=1e-6)
    out.pow(2).sum().backward()
    assert q.grad[..., [9, 12, 13], :].abs().max() == 0 and k.grad[..., 0:3, :].abs().min() > 0


@pytest.mark.parametrize("layout", ["bins", "shared"])
def test_block_attention_gives_the_masked_forwards_log_probs_loss_and_gradients_in_fp32(layout, monkeypatch):
    """The same packed micro-batch through sdpa block by block, and through sdpa over the whole bin under its mask
        (the path without blocks): within 1e-5, and each row alone agrees. The bins here hold several rows and filler
        (the shared layout's zeroed by the blocks), and the block path runs (its function is called once per layer, and
    builds each mask once)."""
    model = llama("sdpa")
    tokens, offsets, lengths, prompts = rollout()
    (mb,) = pack(lengths, layout="bins", batch_rows=len(lengths))
    lay = shared_inputs if layout == "shared" else packed_inputs
    packed = lay(tokens, offsets, lengths, prompts, mb)
    assert packed.input_ids.numel() > packed.real_tokens  # filler in the bins
    packed = replace(packed, blocks=blocks_of(packed))
    calls = []
    attend = segments.attend
    monkeypatch.setattr(segments, "attend", lambda *a, **k: calls.append(1) or attend(*a, **k))
    built, block_mask = [], segments.block_mask
    monkeypatch.setattr(segments, "block_mask", lambda *a: built.append(a[:3]) or block_mask(*a))
    logp_a, loss_a, grads_a = loss_and_grads(model, packed, offsets, prompts)
    assert len(calls) == model.config.num_hidden_layers
    assert 0 < len(built) == len(set(built))  # each block shape's mask built by the first layer alone
    assert model.config._attn_implementation == "sdpa"  # restored
    monkeypatch.setattr(logprobs, "can_segment", lambda model: False)
    logp_b, loss_b, grads_b = loss_and_grads(model, packed, offsets, prompts)
    assert len(calls) == model.config.num_hidden_layers
    with torch.no_grad():
        assert torch.allclose(logp_a.double(), alone(model, tokens, offsets, lengths, prompts), atol=1e-5, rtol=0)
    assert torch.allclose(logp_a, logp_b, atol=1e-5, rtol=0)
    assert abs(float(loss_a - loss_b)) <= 1e-5
    assert max((a - b).abs().max().item() for a, b in zip(grads_a, grads_b)) <= 1e-5
    assert any(a.abs().max() > 1e-3 for a in grads_a)


def test_blocks_apply_to_sdpa_on_a_cpu_only_and_not_under_gradient_checkpointing():
    assert segments.can_segment(llama("sdpa")) and not segments.can_segment(llama("eager"))
    assert not segments.can_segment(llama("sdpa").to("meta"))  # not a CPU: unmeasured there
    model = llama("sdpa")
    enable_checkpointing(model)  # under the name this transformers release gives it
    assert not segments.can_segment(model)


def test_the_models_attention_is_restored_when_the_forward_raises():
    model = llama("sdpa")
    with pytest.raises(RuntimeError, match="inside"):
        with segments.segment_attention(model, ((),)):
            assert model.config._attn_implementation == segments.NAME
            raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"


def test_a_model_whose_layers_slide_shares_prompts_only_where_the_window_is_kept():
    """The tree mask goes to transformers as a 4D mask, which it takes without the window: sharing needs rows
    attended block by block and a window no row under the tree mask (under 64 tokens) can exceed."""
    from transformers import MistralConfig, MistralForCausalLM, Qwen2Config, Qwen2ForCausalLM

    from grpo_cli.models.logprobs import can_share_prompts, sliding_window

    def qwen2(attn, **window):
        return Qwen2ForCausalLM(
            Qwen2Config(
                vocab_size=61,
                hidden_size=48,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                max_window_layers=0,
                attn_implementation=attn,
                **window,
            )
        )

    def mistral(attn, window):
        return MistralForCausalLM(
            MistralConfig(
                vocab_size=61,
                hidden_size=48,
                intermediate_size=96,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                sliding_window=window,
                attn_implementation=attn,
            )
        )

    assert sliding_window(qwen2("sdpa", sliding_window=4096).config) is None  # use_sliding_window off: no layer slides
    assert can_share_prompts(qwen2("eager", sliding_window=4096))
    sliding = dict(use_sliding_window=True, sliding_window=4096)
    assert sliding_window(qwen2("sdpa", **sliding).config) == 4096
    assert can_share_prompts(qwen2("sdpa", **sliding)) and not can_share_prompts(qwen2("eager", **sliding))
    assert not can_share_prompts(qwen2("sdpa", use_sliding_window=True, sliding_window=32))  # under 64 tokens
    assert sliding_window(mistral("eager", 4096).config) == 4096 and not can_share_prompts(mistral("eager", 4096))
    assert sliding_window(mistral("eager", None).config) is None and can_share_prompts(mistral("eager", None))
    assert can_share_prompts(llama("eager")) and can_share_prompts(llama("sdpa"))
