"""Block-by-block attention over packed bins (segments.py): the same log-probs, loss and gradients as the masked
sdpa forward and as each row alone, in fp32, for plain bins and shared prompts; the blocks by hand; where it
applies."""

import pytest
import torch

from grpo_cli.models import logprobs, segments
from grpo_cli.models.packer import pack, packed_inputs, shared_inputs
from test_packing import llama
from test_shared_prompts import T, alone, loss_and_grads, rollout


def test_the_blocks_of_plain_bins_and_of_shared_prompts_by_hand():
    """Rows [9 | 8 7], [6 | 3], [4 5 | 1], [4 5 | 2 3 10] (prompt | completion); the last two share a prompt.
    Plain bins of 5 (the longest row), first-fit decreasing: (row 3), (row 0, row 1), (row 2), each row causal
    over itself. Shared: units (row 0), (row 1), (rows 2 and 3: 2 + 1 + 3 = 6) in bins of 6: (unit 2), (unit 0,
    unit 1); each prompt is a block, each completion a block that sees its prompt."""
    tokens = torch.tensor([9, 8, 7, 6, 3, 4, 5, 1, 4, 5, 2, 3, 10])
    lengths, prompts, offsets = [3, 2, 3, 5], [1, 1, 2, 2], [0, 3, 5, 8]
    (mb,) = pack(lengths, layout="bins", batch_rows=4)
    assert mb.bins == ((3,), (0, 1), (2,))
    plain = packed_inputs(tokens, offsets, lengths, prompts, 3, mb)
    assert plain.blocks == (((0, 5, 0, 0),), ((0, 3, 0, 0), (3, 5, 0, 0)), ((0, 3, 0, 0),))
    shared = shared_inputs(tokens, offsets, lengths, prompts, 3, mb)
    assert shared.input_ids.tolist() == [[4, 5, 1, 2, 3, 10], [9, 8, 7, 6, 3, 0]]
    assert shared.blocks == (((0, 2, 0, 0), (2, 3, 0, 2), (3, 6, 0, 2)),
                             ((0, 1, 0, 0), (1, 3, 0, 1), (3, 4, 0, 0), (4, 5, 3, 4)))


def test_a_prefix_blocks_mask_by_hand():
    """A 2-token completion after a 3-token prompt: query 0 sees the prompt and itself, query 1 one more."""
    assert segments._prefix_causal(2, 3, "cpu").int().tolist() == [[1, 1, 1, 1, 0], [1, 1, 1, 1, 1]]


@pytest.mark.parametrize("layout", ["bins", "shared"])
def test_block_attention_gives_the_masked_forwards_log_probs_loss_and_gradients_in_fp32(layout, monkeypatch):
    """The same packed micro-batch through sdpa block by block, and through sdpa over the whole bin under its mask
    (the path without segments): within 1e-5, and each row alone agrees. The bins hold filler (zeroed here), and
    the block path runs (its function is called once per layer)."""
    model = llama("sdpa")
    tokens, offsets, lengths, prompts = rollout()
    (mb,) = pack(lengths, layout="bins", batch_rows=len(lengths))
    lay = shared_inputs if layout == "shared" else packed_inputs
    packed = lay(tokens, offsets, lengths, prompts, T, mb)
    assert packed.input_ids.numel() > packed.real_tokens  # filler in the bins
    calls = []
    attend = segments.attend
    monkeypatch.setattr(segments, "attend", lambda *a, **k: calls.append(1) or attend(*a, **k))
    logp_a, loss_a, grads_a = loss_and_grads(model, packed, len(lengths))
    assert len(calls) == model.config.num_hidden_layers
    assert model.config._attn_implementation == "sdpa"  # restored
    monkeypatch.setattr(logprobs, "can_segment", lambda model: False)
    logp_b, loss_b, grads_b = loss_and_grads(model, packed, len(lengths))
    assert len(calls) == model.config.num_hidden_layers
    with torch.no_grad():
        assert torch.allclose(logp_a.double(), alone(model, tokens, offsets, lengths, prompts), atol=1e-5, rtol=0)
    assert torch.allclose(logp_a, logp_b, atol=1e-5, rtol=0)
    assert abs(float(loss_a - loss_b)) <= 1e-5
    assert max((a - b).abs().max().item() for a, b in zip(grads_a, grads_b)) <= 1e-5
    assert any(a.abs().max() > 1e-3 for a in grads_a)


def test_blocks_apply_to_sdpa_only_and_not_under_gradient_checkpointing():
    assert segments.can_segment(llama("sdpa")) and not segments.can_segment(llama("eager"))
    model = llama("sdpa")
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})
    assert not segments.can_segment(model)


def test_the_models_attention_is_restored_when_the_forward_raises():
    model = llama("sdpa")
    with pytest.raises(RuntimeError, match="inside"):
        with segments.segment_attention(model, ((),)):
            assert model.config._attn_implementation == segments.NAME
            raise RuntimeError("inside")
    assert model.config._attn_implementation == "sdpa"
