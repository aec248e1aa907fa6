"""Attention over a packed micro-batch's rows, one row (or shared-prompt branch) at a time.

A packed bin (packer.py) holds several rows end to end. transformers' sdpa attends over a whole bin with a
block-diagonal mask: every query meets every key of the bin, and the mask throws most of the products away
(the long workload's bins were 10-18% dense; docs/benchmarks.md, "Figures behind the code"). Here each block
of a bin attends only to what it sees:
- a row (or a shared unit's prompt): causal over itself;
- a shared-prompt completion (packer.shared_inputs): its prompt, and causally itself, the query `i` of an
  `m`-token completion seeing the prompt's `n` keys and its own first `i + 1`.

How it works in detail: docs/internals.md, grpo_cli/models/segments.py.
"""

from __future__ import annotations

from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor

NAME = "grpo_cli_segments"
KEYWORD = "grpo_segments"
MASKS = "grpo_segment_masks"  # a forward's block masks by (m, n), built by its first layer and read by the rest

Blocks = tuple[tuple[tuple[int, int, int, int], ...], ...]  # per bin: (start, end, prefix_start, prefix_end)


def attend(
    module,
    query: Tensor,
    key: Tensor,
    value: Tensor,
    attention_mask=None,
    dropout: float = 0.0,
    scaling: float | None = None,
    **kwargs,
) -> tuple[Tensor, None]:
    """transformers' attention signature: query [bins, heads, L, d], key and value [bins, kv heads, L, d];
    returns [bins, L, heads, d]. The blocks come as the `grpo_segments` keyword; a layer's `sliding_window`
    (Qwen2, Mistral) limits each query to that many positions back, as the model's own mask does."""
    blocks: Blocks = kwargs[KEYWORD]
    window = kwargs.get("sliding_window")
    masks = kwargs.get(MASKS, {})
    gqa = query.shape[1] != key.shape[1]
    out = []
    for in_bin, *in_qkv in zip(blocks, query.split(1), key.split(1), value.split(1)):
        cut = _spans(in_bin, query.shape[2])
        qs, ks, vs = (cut(t) for t in in_qkv)
        pieces, at = [], 0
        for start, end, p_start, p_end in in_bin:
            if end <= start:
                continue
            if start > at:
                pieces.append(query.new_zeros(1, query.shape[1], start - at, value.shape[-1]))
            q, k, v = qs(start, end), ks(start, end), vs(start, end)
            if p_end > p_start:
                k, v = torch.cat([ks(p_start, p_end), k], 2), torch.cat([vs(p_start, p_end), v], 2)
            shape = (end - start, p_end - p_start, window)
            if shape not in masks:
                masks[shape] = block_mask(*shape, q.device)
            mask = masks[shape]
            pieces.append(
                F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None, scale=scaling, enable_gqa=gqa
                )
            )
            at = end
        if at < query.shape[2]:
            pieces.append(query.new_zeros(1, query.shape[1], query.shape[2] - at, value.shape[-1]))
        out.append(torch.cat(pieces, 2) if len(pieces) > 1 else pieces[0])
    return torch.cat(out, 0).transpose(1, 2).contiguous(), None


def _spans(in_bin, length: int):
    """`cut`: `cut(tensor)` splits a bin's [1, heads, length, d] tensor once, at every block's and prefix's
    bounds, and returns `span`, where `span(start, end)` is the positions [start, end) as a piece of that split
    (or a few joined). Slicing each block separately would cost every slice's backward a zero tensor of the whole
    bin, summed into the gradient: O(blocks x bin) work that doubled the backward of a 24-row bin."""
    bounds = sorted(
        {0, length}
        | {
            x
            for start, end, p_start, p_end in in_bin
            if end > start
            for x in (start, end) + ((p_start, p_end) if p_end > p_start else ())
        }
    )
    sizes = [e - s for s, e in zip(bounds, bounds[1:])]
    index = {x: i for i, x in enumerate(bounds)}

    def cut(tensor: Tensor):
        parts = tensor.split(sizes, 2)
        return lambda start, end: (
            parts[index[start]] if index[end] - index[start] == 1 else torch.cat(parts[index[start] : index[end]], 2)
        )

    return cut


def block_mask(m: int, n: int, window: int | None, device) -> Tensor | None:
    """[m, n + m], True where query i of an m-token block sees key j of its n prefix keys and its own: all
    of the prefix and its own first i + 1, within `window` positions back (key > query - window); None where
    that is plain causal attention (no prefix, no window shorter than the block)."""
    if not n and (not window or window >= m):
        return None
    query, key = torch.arange(n, n + m, device=device)[:, None], torch.arange(n + m, device=device)[None]
    keep = key <= query
    return keep & (key > query - window) if window else keep


def register() -> None:
    from transformers import AttentionInterface

    AttentionInterface.register(NAME, attend)


def can_segment(model, config=None) -> bool:
    """Whether `model` can attend block by block: sdpa attention (`config`, default the model's), layers not
    recomputed, on a CPU (where it was measured; on a GPU a call per row costs launches, unmeasured, and
    flash_attention_2 already attends row by row)."""
    config = config if config is not None else getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        return False
    weight = next(model.parameters(), None)
    return (
        weight is not None
        and weight.device.type == "cpu"
        and not any(getattr(m, "gradient_checkpointing", False) is True for m in model.modules())
    )


@contextmanager
def segment_attention(model, blocks: Blocks):
    """Within it, `model`'s attention takes these blocks; yields the keywords its forward passes on."""
    register()
    config = model.config
    before = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield {KEYWORD: blocks, MASKS: {}}
    finally:
        config._attn_implementation = before
