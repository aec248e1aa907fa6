"""Decoding's one-token steps (`generator.decode`): eager (the model's forward over the prefill's growing cache),
or the model's own layers called one after another over a KV cache of buffers held here (`Steps`):
- direct (a CPU's default): the buffers grow by ROOM slots at a time, and a step attends over the slots written
  so far, with no mask when no row is padded, so the logits are bitwise the forward's, without its per-step mask
  building and cache concatenation;
- static (CUDA's default): the buffers hold every slot at once (prompt + max_new_tokens), and on CUDA each step is
  one CUDA graph replay over them, the slots not yet written masked out;
- compiled: static, the step's small kernels fused by torch.compile (Triton on CUDA, C++ on a CPU), then on CUDA
  captured as the graph; the first batches pay the compile.
Both take the model types whose forward is embed -> rotary -> layers -> norm -> head (`TYPES`, each checked
bitwise against its forward in tests/generate/test_steps.py), with sdpa or eager attention and no sliding window;
another model decodes eagerly."""

from __future__ import annotations

import functools
import inspect
import warnings
from typing import Any

import torch
from torch import Tensor

from grpo_cli.generate.packed import FLOAT32_SDPA

TYPES = ("llama", "qwen2", "qwen3", "mistral")  # whose causal-LM forward is embed, rotary, layers, norm, head
ROOM = 256  # new tokens of room direct steps' buffers get at a time: a batch that stops early never holds the cap
SDPA_KERNELS = ("sdpa", FLOAT32_SDPA)  # the kernels that take sdpa's boolean mask (a bf16 CPU decode's float32 one)
DROP_FINISHED_AT = 0.75  # live share of the rows at or below which finished rows leave (each drop copies the cache)
STATIC_DROP_AT = 0.5  # the same for static steps, whose drop copies every slot (and on CUDA captures again)


def hf_model(model):
    """The transformers model inside a DDP or peft wrapper (its config and forward signature)."""
    model = getattr(model, "module", model)
    get_base = getattr(model, "get_base_model", None)
    return get_base() if callable(get_base) else model


def cache_kwarg(model) -> str:
    """The name the model's forward takes its cache by: `cache` (transformers >= 5.24) or `past_key_values`."""
    return "cache" if "cache" in inspect.signature(type(hf_model(model)).forward).parameters else "past_key_values"


class EagerSteps:
    """One-token steps over the prefill's growing cache: every step's forward launched op by op."""

    @property
    def drop_at(self) -> float:
        return DROP_FINISHED_AT

    def __init__(self, model, cache, mask: Tensor, position: Tensor):
        self.model, self.cache, self.mask, self.position = model, cache, mask, position
        self.kwarg = cache_kwarg(model)

    def step(self, tokens: Tensor) -> Tensor:
        self.mask = torch.cat([self.mask, self.mask.new_ones(self.mask.shape[0], 1)], dim=1)
        out = self.model(
            input_ids=tokens[:, None],
            attention_mask=self.mask,
            position_ids=self.position[:, None],
            **{self.kwarg: self.cache},
            use_cache=True,
        )
        self.position = self.position + 1
        return out.logits[:, -1]

    def keep(self, index: Tensor) -> None:
        self.cache.batch_select_indices(index)
        self.mask, self.position = self.mask[index], self.position[index]

    def held(self):
        """The cache's layers and each row's [rows, width] mask of the positions it holds."""
        return self.cache.layers, self.mask


class _Layer:
    """One layer's keys and values, [rows, kv heads, slots, head dim]; what `held()` hands to the turn cache."""

    def __init__(self, keys: Tensor, values: Tensor):
        self.keys, self.values = keys, values


def unsupported(model) -> str | None:
    """Why `Steps` cannot take this model (the generator then decodes eagerly), or None."""
    hf = hf_model(model)
    config = hf.config
    attn = getattr(config, "_attn_implementation", None) or "eager"
    if getattr(config, "model_type", None) not in TYPES:
        return f"model type {getattr(config, 'model_type', None)!r} (these steps take {', '.join(TYPES)})"
    if attn not in (*SDPA_KERNELS, "eager"):
        return f"attention {attn!r} (these steps take sdpa or eager)"
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return "sliding-window attention"
    inner: Any = getattr(hf, "model", None)
    if not all(hasattr(inner, name) for name in ("embed_tokens", "rotary_emb", "layers", "norm")):
        return "a model without Llama's embed_tokens, rotary_emb, layers and norm"
    if type(inner.embed_tokens.weight.data) is not torch.Tensor:  # an FSDP2 shard not gathered (a DTensor)
        return "sharded embeddings (the model's own forward gathers them)"
    return None


class Steps:
    """The decode batch's one-token steps through the model's layers, over buffers held here (module docstring):
    `step(tokens)` feeds each live row its token and returns the next logits, `keep(index)` drops the other rows,
    and the object is the cache each attention layer writes its step's keys and values to (`update`)."""

    def __init__(
        self,
        model,
        prefill_cache,
        mask: Tensor,
        position: Tensor,
        max_new_tokens: int,
        *,
        static: bool = False,
        graphs: bool = False,
        compiled: bool = False,
        source: Tensor | None = None,
    ):
        """`prefill_cache`: the prefill's, one row per decode row or, with `source` (each decode row's row of it), per
        distinct prompt, gathered straight into the buffers; `mask` the rows' [rows, prompt] 0/1 mask; `position`
        each row's next position id."""
        hf = hf_model(model)
        self.inner, self.head, self.static, self.graphs = hf.model, hf.get_output_embeddings(), static, graphs
        self.compiled, self.fixed = compiled, graphs or compiled  # fixed: every slot on every step, as a graph takes
        self.forward = compile_once(type(self)._forward) if compiled else type(self)._forward
        self.proven = not compiled  # a compiled step that failed its first call falls back to the plain one
        self.drop_at = STATIC_DROP_AT if static else DROP_FINISHED_AT
        self.additive = (getattr(hf.config, "_attn_implementation", None) or "eager") not in SDPA_KERNELS
        params = inspect.signature(type(self.inner.layers[0]).forward).parameters
        self.kwarg = next(n for n in ("cache", "past_key_values", "past_key_value") if n in params)
        self.filled, self.remaining = mask.shape[1], max_new_tokens
        self.layers = [_Layer(layer.keys, layer.values) for layer in prefill_cache.layers]
        self.allowed = mask.bool()
        self.position = position.view(-1, 1).clone()
        self.graph: Any = None  # torch.cuda.CUDAGraph once captured
        self._grow(source)
        self._buffers()

    def _grow(self, source: Tensor | None = None) -> None:
        """Room for ROOM more tokens (static: every one at once; never past the cap) in every layer's buffers and
        the mask; `source` (the first call's) each row's row of the prefill's buffers, gathered a layer at a time,
        so the copy spread to every row never exists beside the buffers."""
        room = self.remaining if self.static else min(ROOM, self.remaining)
        rows, n = self.allowed.shape[0], self.filled
        self.remaining -= room
        for layer in self.layers:
            k, v = layer.keys[:, :, :n], layer.values[:, :, :n]
            if source is not None:
                k, v = k.index_select(0, source), v.index_select(0, source)
            layer.keys = torch.cat([k, k.new_zeros(rows, k.shape[1], room, k.shape[3])], dim=2)
            layer.values = torch.cat([v, v.new_zeros(rows, v.shape[1], room, v.shape[3])], dim=2)
        self.allowed = torch.cat([self.allowed[:, :n], self.allowed.new_zeros(rows, room)], dim=1)

    def _buffers(self) -> None:
        """The step's inputs as buffers (what a CUDA graph reads), and the graph, captured where asked."""
        rows, device = self.allowed.shape[0], self.allowed.device
        self.padded = not bool(self.allowed[:, : self.filled].all())
        self.ids = torch.zeros(rows, 1, dtype=torch.long, device=device)
        self.slot = torch.tensor([self.filled], device=device)  # the slot the next step writes (graphs)
        dtype = self.head.weight.dtype
        self.mask = (
            torch.zeros(rows, 1, 1, self.allowed.shape[1], dtype=dtype, device=device)
            if self.additive
            else self.allowed.view(rows, 1, 1, -1)
        )  # a view: writing `allowed` updates it
        self.graph = None
        self.logits: Tensor | None = None  # the captured graph's output
        if self.graphs:
            start = self.position.clone()
            try:
                self._capture()
            except RuntimeError as e:  # an optimisation only: the steps run without it, over the same buffers
                warnings.warn(
                    f"decoding without CUDA graphs: capturing a decode step failed ({e})", RuntimeWarning, stacklevel=3
                )
                self.graphs, self.graph, self.fixed = False, None, self.compiled  # compiled: still fixed shapes
                self._unstep(start)  # the warm-up may have run, in part or whole

    def update(self, key_states: Tensor, value_states: Tensor, layer_idx: int, *args, **kwargs):
        """The cache call each attention layer makes: this step's keys and values written at the next slot; every
        slot written so far returned, or (a graph's fixed shapes) every slot, the unwritten ones masked."""
        layer = self.layers[layer_idx]
        if self.fixed:
            layer.keys.index_copy_(2, self.slot, key_states.to(layer.keys.dtype))
            layer.values.index_copy_(2, self.slot, value_states.to(layer.values.dtype))
            return layer.keys, layer.values
        t = self.filled
        layer.keys[:, :, t : t + 1] = key_states
        layer.values[:, :, t : t + 1] = value_states
        return layer.keys[:, :, : t + 1], layer.values[:, :, : t + 1]

    def _attention_mask(self, dtype: torch.dtype) -> Tensor | None:
        """What the model's forward gives its layers for a one-token step: for sdpa nothing when no row is padded,
        else [rows, 1, 1, slots] boolean; for eager attention that additive (0 or the minimum of `dtype`)."""
        if self.fixed:
            if self.additive:
                self.mask.copy_(torch.where(self.allowed, 0.0, torch.finfo(self.mask.dtype).min)[:, None, None, :])
            return self.mask
        n = self.filled + 1
        if not self.additive:
            return self.allowed[:, None, None, :n] if self.padded else None
        return torch.where(self.allowed[:, None, None, :n], 0.0, torch.finfo(dtype).min).to(dtype)

    def _forward(self) -> Tensor:
        """One step of `ids` (all a graph holds): the next slot opened, each layer's forward, the positions moved."""
        if self.fixed:
            self.allowed.index_fill_(1, self.slot, True)
        else:
            self.allowed[:, self.filled] = True
        hidden = self.inner.embed_tokens(self.ids)
        embeddings = self.inner.rotary_emb(hidden, position_ids=self.position)
        mask = self._attention_mask(hidden.dtype)
        for layer in self.inner.layers:
            out = layer(
                hidden,
                attention_mask=mask,
                position_ids=self.position,
                position_embeddings=embeddings,
                use_cache=True,
                **{self.kwarg: self},
            )
            hidden = out[0] if isinstance(out, tuple) else out
        self.position.add_(1)
        self.slot.add_(1)
        return self.head(self.inner.norm(hidden))[:, -1]

    def _capture(self) -> None:
        """The step's forward as a CUDA graph: one warm-up forward first, on a side stream (as torch.cuda.graphs
        asks), whose slot the first real step overwrites and whose moves are set back."""
        stream, start = torch.cuda.Stream(), self.position.clone()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            self._first()
        torch.cuda.current_stream().wait_stream(stream)
        self._unstep(start)
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph):
            self.logits = self.forward(self)

    def _first(self) -> Tensor:
        """The first call of a compiled step, which compiles it: where compiling fails (no C++ compiler for a CPU's
        kernels, a model dynamo cannot trace) the step runs uncompiled, with a warning, over the same buffers."""
        if self.proven:
            return self.forward(self)
        start = self.position.clone()
        try:
            logits = self.forward(self)
        except Exception as e:  # an optimisation only, as a graph's capture
            compile_failed("decoding", "the decode step", e)
            self._unstep(start)
            self.forward = type(self)._forward
            logits = self.forward(self)
        self.proven = True
        return logits

    def _unstep(self, position: Tensor) -> None:
        """Undo a step that ran but must not count (the warm-up, or a capture that failed after it)."""
        self.allowed[:, self.filled :] = False
        self.position.copy_(position)
        self.slot.fill_(self.filled)

    def step(self, tokens: Tensor) -> Tensor:
        """The logits after each live row's `tokens` ([rows]), written at the next slot; on CUDA with a graph its
        output buffer, valid until the next step."""
        self.ids.copy_(tokens.view(-1, 1))
        if self.graph is not None:
            self.graph.replay()
            logits = self.logits
            assert logits is not None  # the graph's output, captured with it
        else:
            if self.filled == self.allowed.shape[1]:
                self._grow()
            logits = self.forward(self) if self.proven else self._first()
        self.filled += 1
        return logits

    def keep(self, index: Tensor) -> None:
        """Only the rows at `index` stay: their buffers copied, room and all (`index_select` copies whole rows at
        4-6x the speed of indexing with a tensor), and on CUDA the step captured again at that size."""
        for layer in self.layers:
            layer.keys, layer.values = layer.keys.index_select(0, index), layer.values.index_select(0, index)
        self.allowed, self.position = self.allowed.index_select(0, index), self.position.index_select(0, index)
        self.graph = self.logits = None  # free the old graph's memory before the new one is captured
        self._buffers()

    def held(self):
        """The layers' keys and values and each row's [rows, slots] mask of the slots it holds."""
        n = self.filled
        return [_Layer(layer.keys[:, :, :n], layer.values[:, :, :n]) for layer in self.layers], self.allowed[:, :n]


def decode_steps(
    model, cache, mask: Tensor, position: Tensor, max_new_tokens: int, kind: str, source: Tensor | None = None
):
    """The one-token steps of `kind` (generator.decode: static, compiled, direct, eager, or auto: static on CUDA,
    direct elsewhere); eager where the model allows no other, with a warning when one was asked for by name. `source`:
    each row's row of `cache` (generation.prefill_rows), None when the rows are the cache's."""
    cuda = mask.device.type == "cuda"
    chosen = ("static" if cuda else "direct") if kind == "auto" else kind
    reason = None if chosen == "eager" else unsupported(model)
    if reason is not None and kind != "auto":
        warnings.warn(f"generator.decode={kind}, but {reason}: decoding eagerly", RuntimeWarning, stacklevel=2)
    if chosen == "eager" or reason is not None:
        if source is not None:
            cache.batch_select_indices(source)
        return EagerSteps(model, cache, mask, position)
    static, compiled = chosen in ("static", "compiled"), chosen == "compiled"
    return Steps(
        model,
        cache,
        mask,
        position,
        max_new_tokens,
        static=static,
        graphs=static and cuda,
        compiled=compiled,
        source=source,
    )


@functools.cache
def compile_once(fn):
    """`fn` compiled once a process, shapes made dynamic once they change (torch.compile's own cache holds each
    shape's graphs and guards): the decode step's forward, the sampler (sampling.py)."""
    return torch.compile(fn, dynamic=None)


def compile_failed(doing: str, what: str, e: Exception) -> None:
    """The one warning of a compile that failed: `doing` goes on uncompiled (an optimisation only)."""
    first = str(e).splitlines()[0][:300] if str(e) else ""
    warnings.warn(
        f"{doing} without torch.compile: compiling {what} failed ({type(e).__name__}: {first})",
        RuntimeWarning,
        stacklevel=3,
    )


def distinct_rows(rows: list[list[int]]) -> tuple[list[int], list[int]]:
    """Where each distinct row first stands, and for every row the place of its distinct row among those:
    a prefill runs the distinct rows once and spreads them back by that index."""
    firsts: list[int] = []
    slots: dict[tuple[int, ...], int] = {}
    rows_of = []
    for i, row in enumerate(rows):
        rows_of.append(slots.setdefault(tuple(row), len(slots)))
        if rows_of[-1] == len(firsts):
            firsts.append(i)
    return firsts, rows_of


def left_pad(rows: list[list[int]], pad_id: int, device) -> tuple[Tensor, Tensor]:
    """[rows, width] ids, each row right-aligned after `pad_id`s, and its 0/1 attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r)
            mask[i, width - len(r) :] = 1
    return ids.to(device), mask.to(device)
