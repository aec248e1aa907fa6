"""One-token decode steps over a static KV cache, replayed as a CUDA graph on CUDA.

Eager decoding with a growing cache launches a few hundred small kernels per token (24 layers x ~15
ops for a 0.5B model) and re-allocates the cache as it grows: on a GPU the launches, not the memory
reads, set the pace, often 10-50x above the floor of reading the weights and the KV cache once per
token. Here the cache is allocated once at its full length (prompt + max_new_tokens), every step has
the same shapes, and on CUDA the step's forward is captured once as a CUDA graph and replayed: one
launch per token.

- The prefill is the eager one (`generation.decode`'s): its cache's rows are copied into the static
  cache, so the two paths see the same prompt keys and values.
- The attention mask is a [rows, 1, 1, length] tensor the model takes as-is (transformers returns a 4D
  mask unchanged): slots not yet written, and a prompt's left padding, are masked out. Boolean for
  SDPA, additive for eager attention.
- Finished rows leave the batch when at most half the rows are live: the cache is copied to a new one
  of the live rows and, on CUDA, the step is captured again at that size (at most log2(rows) captures).

`StaticSteps.reason_unsupported(model)` says why a model cannot take this path (an attention kernel
other than SDPA or eager, sliding-window layers, a transformers without `StaticCache` layers); the
generator then decodes eagerly.
"""

from __future__ import annotations

import inspect
import warnings

import torch
from torch import Tensor


def hf_model(model):
    """The transformers model inside a DDP or peft wrapper (its config and forward signature)."""
    model = getattr(model, "module", model)
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def cache_kwarg(model) -> str:
    """The name the model's forward takes its cache by: `cache` (transformers >= 5.24; the old name
    warns) or `past_key_values`."""
    return "cache" if "cache" in inspect.signature(type(hf_model(model)).forward).parameters else "past_key_values"


def attention_unsupported(config, path: str, sdpa: tuple[str, ...] = ("sdpa",)) -> str | None:
    """Why a decode path that passes its own mask and cache (`path`: static, direct) cannot take a model of
    this config: an attention kernel other than SDPA (the names in `sdpa`) or eager, or sliding-window layers;
    None if it can."""
    attn = getattr(config, "_attn_implementation", None) or "eager"
    if attn not in (*sdpa, "eager"):
        return f"attention {attn!r} (the {path} path takes sdpa or eager)"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    return None


def _static_cache(model, length: int):
    from transformers import StaticCache

    return StaticCache(config=hf_model(model).config, max_cache_len=length)


def _cast_to_buffers(layer, visible):
    """The layer's update, with the states cast to its buffers' dtypes first (a no-op where they match). Where
    `visible()` gives a count (the slots written so far, this step's included) only those slots are returned,
    so attention reads the filled prefix of the buffers rather than all of them; None returns them whole."""
    update = type(layer).update

    def cast_update(key_states: Tensor, value_states: Tensor, *args, **kwargs):
        keys, values = update(layer, key_states.to(layer.keys.dtype), value_states.to(layer.values.dtype), *args,
                              **kwargs)
        n = visible()
        return (keys, values) if n is None else (keys[:, :, :n], values[:, :, :n])

    return cast_update


class StaticSteps:
    """The decode batch's one-token steps over a static cache (module docstring). `step(tokens)` feeds each
    live row its token and returns the next logits; `keep(index)` drops the other rows."""

    drop_at = 0.5  # live share of the rows at or below which finished rows leave (each drop re-captures)

    @staticmethod
    def reason_unsupported(model) -> str | None:
        reason = attention_unsupported(hf_model(model).config, "static cache")
        if reason is not None:
            return reason
        try:
            layers = getattr(_static_cache(model, 8), "layers", None)
        except (ImportError, TypeError, ValueError) as e:
            return f"no StaticCache for this model ({e})"
        if not layers or not all(hasattr(layer, "cumulative_length") for layer in layers):
            return "this transformers' StaticCache keeps no per-layer length"
        return None

    def __init__(self, model, prefill_cache, mask: Tensor, position: Tensor, max_new_tokens: int, *, graphs: bool):
        """`prefill_cache`: the eager prefill's cache, one row per decode row; `mask` its [rows, prompt]
        0/1 attention mask; `position` each row's next position id."""
        self.model, self.graphs, self.kwarg = model, graphs, cache_kwarg(model)
        self.additive = (getattr(hf_model(model).config, "_attn_implementation", None) or "eager") != "sdpa"
        self.filled = mask.shape[1]  # slots written: the prompt's
        self.length = self.filled + max_new_tokens
        kv = [(layer.keys, layer.values) for layer in prefill_cache.layers]
        allowed = torch.zeros(mask.shape[0], self.length, dtype=torch.bool, device=mask.device)
        allowed[:, : self.filled] = mask.bool()
        self._build(kv, allowed, position)

    def _build(self, kv: list[tuple[Tensor, Tensor]], allowed: Tensor, position: Tensor) -> None:
        """A cache of kv's rows (their first `filled` slots), the step's input buffers, and the graph."""
        self.cache = _static_cache(self.model, self.length)
        for layer, (k, v) in zip(self.cache.layers, kv):
            try:
                layer.lazy_initialization(k, v)
            except TypeError:  # transformers whose layers read the shapes from the keys alone
                layer.lazy_initialization(k)
            # The buffers keep the prefill cache's dtypes, and each step's states are cast to them, as eager
            # decoding's growing cache does: under bf16 autocast the keys leave the rotary embedding in float32
            # and the values in bf16, and transformers 5.17 holds both in float32 (its cache promotes on
            # concatenation, and its static layers allocate both in the keys' dtype), 5.24 each in its own.
            if layer.keys.dtype != k.dtype:
                layer.keys = torch.zeros_like(layer.keys, dtype=k.dtype)
            if layer.values.dtype != v.dtype:
                layer.values = torch.zeros(*layer.values.shape[:-1], v.shape[-1], dtype=v.dtype, device=v.device)
            layer.update = _cast_to_buffers(layer, self._visible)
            layer.keys[:, :, : self.filled].copy_(k[:, :, : self.filled])
            layer.values[:, :, : self.filled].copy_(v[:, :, : self.filled])
            layer.cumulative_length.fill_(self.filled)
        rows = allowed.shape[0]
        self.allowed = allowed
        self.ids = torch.zeros(rows, 1, dtype=torch.long, device=allowed.device)
        self.position = position.view(rows, 1).clone()
        self.slot = torch.tensor([self.filled], device=allowed.device)  # the slot the next step writes
        dtype = next(hf_model(self.model).parameters()).dtype
        self.mask = torch.zeros(rows, 1, 1, self.length, dtype=dtype, device=allowed.device) if self.additive \
            else allowed.view(rows, 1, 1, self.length)  # a view: writing `allowed` updates it
        self.graph, self.logits = None, None
        if self.graphs:
            try:
                self._capture()
            except RuntimeError as e:  # an optimisation only: the steps run, eagerly over the same static cache
                warnings.warn(f"decoding without CUDA graphs: capturing a decode step failed ({e})", RuntimeWarning,
                              stacklevel=2)
                self.graphs, self.graph, self.logits = False, None, None
                self._unstep(position)  # the warm-up may have run, in part or whole

    def _visible(self) -> int | None:
        """The slots a step's attention reads: all of them in a graph (it replays fixed shapes; the unwritten
        ones are masked out), else only those written so far, this step's included."""
        return None if self.graphs else self.filled + 1

    def _forward(self) -> Tensor:
        """One step on the device alone (what the graph holds): the next slot opened in the mask, the
        forward of `ids` writing it, the positions and the slot advanced."""
        self.allowed.index_fill_(1, self.slot, True)
        if self.additive:
            self.mask.copy_(torch.where(self.allowed, 0.0, torch.finfo(self.mask.dtype).min)[:, None, None, :])
        n = self._visible()
        mask = self.mask if n is None else self.mask[..., :n]
        out = self.model(input_ids=self.ids, attention_mask=mask, position_ids=self.position,
                         **{self.kwarg: self.cache}, use_cache=True)
        self.position.add_(1)
        self.slot.add_(1)
        return out.logits[:, -1]

    def _capture(self) -> None:
        """The step's forward as a CUDA graph. One warm-up forward first, on a side stream (as
        torch.cuda.graphs asks); it writes the next slot, which the first real step overwrites, and
        advances what a step advances, which is set back."""
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._forward()
        torch.cuda.current_stream().wait_stream(stream)
        self._unstep(self.position - 1)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self._forward()

    def _unstep(self, position: Tensor) -> None:
        """Undo a step that ran but must not count (the warm-up, or a capture that failed after it):
        `position` is each row's next position before it."""
        for layer in self.cache.layers:
            layer.cumulative_length.fill_(self.filled)
        self.allowed[:, self.filled :] = False
        self.position.copy_(position.view(-1, 1))
        self.slot.fill_(self.filled)

    def step(self, tokens: Tensor) -> Tensor:
        """The logits after each live row's `tokens` ([rows]), written at the next slot. On CUDA the
        graph's output buffer, valid until the next step (read it, or copy it, before)."""
        self.ids.copy_(tokens.view(-1, 1))
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
        else:
            logits = self._forward()
        self.filled += 1
        return logits

    def held(self):
        """The cache's layers and each row's [rows, length] mask of the slots it holds."""
        return self.cache.layers, self.allowed

    def keep(self, index: Tensor) -> None:
        """Only the rows at `index` stay (a new cache, re-captured on CUDA)."""
        kv = [(layer.keys[index], layer.values[index]) for layer in self.cache.layers]
        allowed, position = self.allowed[index], self.position[index]
        self.cache = self.graph = self.logits = None  # free the old before the new is allocated
        self._build(kv, allowed, position)
