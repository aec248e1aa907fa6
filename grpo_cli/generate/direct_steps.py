"""One-token decode steps run through the model's own decoder layers, over a KV cache with room to grow.

A decode step of a transformers model spends much of its time outside the products on a CPU at a few rows:
the model's forward builds a [rows, 1, 1, length] mask from the 2D one (`create_causal_mask`), its cache
concatenates every layer's keys and values onto a new tensor (the whole context copied, every token), and
a dozen decorators and output dataclasses run around each call. Here a step calls the same modules the
model's forward calls, in the same order, with the same arguments: the embedding, the rotary embedding, each
decoder layer, the final norm and the head. Only the mask (built once per step, and none when no row is
padded, as transformers' SDPA path does) and the cache (each layer's buffers written in place) are this
module's, so the logits are bitwise those of the model's forward (tests/test_direct_decode.py). The saving
grows with the context, which the growing cache copies every step: on SmolLM2-135M (packed weights, one thread
of a 2-core AMD EPYC with AVX2, steps timed in pairs on the same tokens) a step took 0.95-0.97x the forward's
time at 4-32 rows of ~100 tokens, 0.88x at 8-16 rows of ~300 and 0.83x at 8 rows of ~800; at one row of ~100,
1.0x (docs/benchmarks.md).

`DirectSteps.reason_unsupported(model)` says why a model cannot take this path: a model type whose forward
does more around its layers than Llama's (`DIRECT_MODEL_TYPES` lists those checked to match), an attention
kernel other than SDPA or eager, sliding-window layers, or embeddings still sharded by FSDP2. The generator then decodes eagerly.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from grpo_cli.generate.packed import FLOAT32_SDPA
from grpo_cli.generate.static_cache import attention_unsupported, hf_model

# Model types whose causal-LM forward is embed -> rotary -> decoder layers -> norm -> head, with nothing else:
# each checked bitwise against the model's own forward in tests/test_direct_decode.py.
DIRECT_MODEL_TYPES = ("llama", "qwen2", "qwen3", "mistral")
ROOM = 256  # new tokens of room the buffers get at a time: a batch that stops early never holds the whole cap
# Attention kernels that take sdpa's boolean mask: sdpa, and sdpa in float32 (packed.float32_attention, which a bf16
# decode on a CPU runs in)
SDPA_KERNELS = ("sdpa", FLOAT32_SDPA)


class _Layer:
    """One layer's keys and values, [rows, kv heads, slots, head dim]; what `held()` hands to the turn cache."""

    def __init__(self, keys: Tensor, values: Tensor):
        self.keys, self.values = keys, values


class DirectSteps:
    """The decode batch's one-token steps through the model's layers (module docstring). `step(tokens)` feeds
    each live row its token and returns the next logits; `keep(index)` drops the other rows."""

    @staticmethod
    def reason_unsupported(model) -> str | None:
        hf = hf_model(model)
        model_type = getattr(hf.config, "model_type", None)
        if model_type not in DIRECT_MODEL_TYPES:
            return f"model type {model_type!r} (the direct path takes {', '.join(DIRECT_MODEL_TYPES)})"
        reason = attention_unsupported(hf.config, "direct", SDPA_KERNELS)
        if reason is not None:
            return reason
        inner = getattr(hf, "model", None)
        if not all(hasattr(inner, name) for name in ("embed_tokens", "rotary_emb", "layers", "norm")):
            return "a model without Llama's embed_tokens, rotary_emb, layers and norm"
        if type(inner.embed_tokens.weight.data) is not torch.Tensor:  # an FSDP2 shard not gathered (a DTensor)
            return "sharded embeddings (the model's own forward gathers them)"
        return None

    def __init__(self, model, prefill_cache, mask: Tensor, position: Tensor, max_new_tokens: int, drop_at: float,
                 source: Tensor | None = None):
        """`prefill_cache`: the eager prefill's cache, one row per decode row, or per distinct prompt with
        `source` each decode row's row of it (a group's G samples share their prompt's, copied straight into
        the buffers); `mask` the rows' [rows, prompt] 0/1 attention mask; `position` each row's next position
        id; `drop_at` the live share of the rows at or below which finished rows leave (each drop copies the
        cache), as for eager steps."""
        self.drop_at = drop_at
        hf = hf_model(model)
        self.inner, self.head = hf.model, hf.get_output_embeddings()
        self.additive = (getattr(hf.config, "_attn_implementation", None) or "eager") not in SDPA_KERNELS
        params = inspect.signature(type(self.inner.layers[0]).forward).parameters
        self.kwarg = next(n for n in ("cache", "past_key_values", "past_key_value") if n in params)
        self.filled, self.remaining = mask.shape[1], max_new_tokens
        self.layers = [_Layer(layer.keys, layer.values) for layer in prefill_cache.layers]
        self.allowed = mask.bool()
        self.padded = not bool(self.allowed.all())
        self.position = position.clone()
        self._grow(source)

    def _grow(self, source: Tensor | None = None) -> None:
        """Room for up to ROOM more tokens (never past the cap) in every layer's buffers and the mask; `source`
        (the first call's) each row's row of the prefill's buffers, gathered a layer at a time, so the copy
        spread to every row never exists beside the buffers."""
        room, rows, n = min(ROOM, self.remaining), self.allowed.shape[0], self.filled
        self.remaining -= room
        for layer in self.layers:
            k, v = layer.keys[:, :, :n], layer.values[:, :, :n]
            if source is not None:
                k, v = k.index_select(0, source), v.index_select(0, source)
            keys = k.new_empty(rows, k.shape[1], n + room, k.shape[3])
            values = v.new_empty(rows, v.shape[1], n + room, v.shape[3])
            keys[:, :, :n], values[:, :, :n] = k, v
            layer.keys, layer.values = keys, values
        allowed = self.allowed.new_zeros(rows, n + room)
        allowed[:, :n] = self.allowed[:, :n]
        self.allowed = allowed

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        """The cache call each attention layer makes: this step's keys and values written at the next slot,
        every written slot returned (cast to the buffers' dtypes, as the growing cache's concatenation does)."""
        layer, t = self.layers[layer_idx], self.filled
        layer.keys[:, :, t : t + 1] = key_states
        layer.values[:, :, t : t + 1] = value_states
        return layer.keys[:, :, : t + 1], layer.values[:, :, : t + 1]

    def _mask(self, dtype: torch.dtype) -> Tensor | None:
        """What the model's forward gives its layers for a one-token step: for SDPA nothing when no row is
        padded, else [rows, 1, 1, slots] boolean; for eager attention that additive, 0 or the minimum of the
        hidden states' `dtype`."""
        n = self.filled + 1
        if not self.additive:
            return self.allowed[:, None, None, :n] if self.padded else None
        return torch.where(self.allowed[:, None, None, :n], 0.0, torch.finfo(dtype).min).to(dtype)

    def step(self, tokens: Tensor) -> Tensor:
        """The logits after each live row's `tokens` ([rows]), written at the next slot."""
        if self.filled == self.allowed.shape[1]:
            self._grow()
        self.allowed[:, self.filled] = True
        position = self.position[:, None]
        hidden = self.inner.embed_tokens(tokens[:, None])
        embeddings = self.inner.rotary_emb(hidden, position_ids=position)
        mask = self._mask(hidden.dtype)
        for layer in self.inner.layers:
            out = layer(hidden, attention_mask=mask, position_ids=position, position_embeddings=embeddings,
                        use_cache=True, **{self.kwarg: self})
            hidden = out[0] if isinstance(out, tuple) else out
        self.filled += 1
        self.position = self.position + 1
        return self.head(self.inner.norm(hidden))[:, -1]

    def keep(self, index: Tensor) -> None:
        """Only the rows at `index` stay (their buffers copied, room and all; `index_select` copies whole rows at
        4-6x the speed of indexing with a tensor, measured on [32-128, heads, slots, head dim] buffers)."""
        for layer in self.layers:
            layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        self.allowed, self.position = self.allowed.index_select(0, index), self.position.index_select(0, index)
        self.padded = not bool(self.allowed[:, : self.filled].all())

    def held(self):
        """The layers' keys and values and each row's [rows, slots] mask of the slots it holds."""
        return [_Layer(layer.keys[:, :, : self.filled], layer.values[:, :, : self.filled]) for layer in self.layers], \
            self.allowed[:, : self.filled]
