"""A model's large linear layers run on oneDNN with their weights packed while a CPU decodes (in float32, or in
bf16 under bf16 autocast, whose attention then runs in float32: `float32_attention`).

A decode step multiplies a few rows by every weight matrix, so it streams the weights from memory. torch's own
float32 product (MKL's sgemm on a CPU) takes a few rows poorly, well above the time to read the weight once;
oneDNN's product over a weight reordered once into its blocked layout comes close to it (the timings:
docs/benchmarks.md, "Figures behind the code").

How it works in detail: docs/internals.md, grpo_cli/generate/packed.py.
"""

from __future__ import annotations

import functools
import time
from contextlib import contextmanager
from typing import Any

import torch

from grpo_cli.models.runtime import returned_when_freed

MIN_WEIGHTS = 1 << 18  # elements (1 MiB in float32): smaller layers stay on torch's product
FASTER_BELOW = 0.9  # auto packs where the packed product takes under this share of torch's time


def available(dtype: torch.dtype = torch.float32) -> bool:
    """Whether this torch has oneDNN on the CPU and the packed-linear ops, in `dtype`: bfloat16 needs a CPU whose
    oneDNN multiplies bf16 (AVX-512 BW/VL/DQ or AVX-NE-CONVERT; on an AVX2-only CPU its reorder raises)."""
    ops = (
        torch.backends.mkldnn.is_available()
        and hasattr(torch.ops.mkldnn, "_linear_pointwise")
        and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
    )
    if not ops or dtype == torch.float32:
        return ops
    supported = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return dtype == torch.bfloat16 and supported is not None and bool(supported())


def _packable(module: torch.nn.Module) -> bool:
    weight = getattr(module, "weight", None)
    return (
        type(module) is torch.nn.Linear
        and "forward" not in module.__dict__
        and weight is not None
        and type(weight.data) is torch.Tensor
        and weight.dtype == torch.float32
        and weight.device.type == "cpu"
        and weight.numel() >= MIN_WEIGHTS
    )


def _packed_forward(weight: torch.Tensor, bias: torch.Tensor | None, rows: int, dtype: torch.dtype):
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach().to(dtype), rows)
    bias = None if bias is None else bias.detach().to(dtype)

    def forward(x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x.to(dtype), packed, bias, "none", [], "")

    return forward


@contextmanager
def packed_linears(model: torch.nn.Module, rows: int = 32, dtype: torch.dtype = torch.float32):
    """Within it, the model's large float32 linear layers on the CPU multiply with packed weights (module
    docstring); `rows` is the batch the layout is chosen for. `dtype` bfloat16 packs bf16 copies and multiplies
    in bf16, as bf16 autocast's `linear` does (inputs and weights in bf16, the output bf16), for a decode under
    it. Yields how many layers were packed."""
    replaced, rows = [], max(1, min(rows, 64))  # past 64 rows the layout chosen matters little
    try:
        if available(dtype):
            module: Any
            for module in model.modules():
                if _packable(module):
                    module.forward = _packed_forward(module.weight, module.bias, rows, dtype)
                    replaced.append(module)
        yield len(replaced)
    finally:
        for module in replaced:
            del module.forward


def has_packable(model: torch.nn.Module, dtype: torch.dtype = torch.float32) -> bool:
    """Whether any of the model's layers would be packed, in `dtype`."""
    return available(dtype) and any(_packable(m) for m in model.modules())


@functools.lru_cache(maxsize=None)
def packing_helps(device: torch.device, dtype: torch.dtype = torch.float32, rows: int = 8, repeats: int = 5) -> bool:
    """Whether a decode-shaped product in `dtype` (a few rows against a 8192 x 1024 weight, 32 MB in float32, so
    reading it dominates) takes under FASTER_BELOW of torch's time packed (bfloat16: torch's product under
    autocast), best of `repeats` each, on `device`."""
    if torch.device(device).type != "cpu" or not available(dtype):
        return False

    def best(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append(time.perf_counter() - start)
        return min(times)

    def timings() -> tuple[float, float]:  # its 64 MB are freed on return
        layer, x = torch.nn.Linear(1024, 8192, bias=False), torch.randn(rows, 1, 1024)
        with torch.autocast("cpu", dtype=dtype, enabled=dtype != torch.float32):
            plain = best(lambda: layer(x))
            with packed_linears(layer, rows, dtype):
                return plain, best(lambda: layer(x))

    with returned_when_freed(), torch.no_grad():  # ... and leave the process's memory
        plain, packed = timings()
    return packed < FASTER_BELOW * plain


FLOAT32_SDPA = "grpo_cli_float32_sdpa"


def _float32_sdpa(module, query, key, value, attention_mask, **kwargs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    dtype = query.dtype
    with torch.autocast("cpu", enabled=False):
        out, weights = sdpa_attention_forward(
            module, query.float(), key.float(), value.float(), attention_mask, **kwargs
        )
    return out.to(dtype), weights


@contextmanager
def float32_attention(model: torch.nn.Module):
    """Within it, a model that attends with sdpa does so in float32, outside autocast: on a CPU, bf16 autocast
    runs sdpa in bf16, 3x float32's time at 32 rows x 300 keys of a decode step (one thread, AMD EPYC with
    AVX-512 BF16), where the linear layers gain 1.8x; a bf16 decode of SmolLM2-135M spent 43% of its time
    there. The queries and keys come out of the rotary embedding in float32 already. Yields whether it
    applies (sdpa models only)."""
    config: Any = getattr(model, "config", None)
    if getattr(config, "_attn_implementation", None) != "sdpa":
        yield False
        return
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(FLOAT32_SDPA, _float32_sdpa)
    AttentionMaskInterface.register(FLOAT32_SDPA, sdpa_mask)
    config._attn_implementation = FLOAT32_SDPA
    try:
        yield True
    finally:
        config._attn_implementation = "sdpa"


def packed_weight_bytes(shape, element_bytes: int = 4) -> int:
    """The copies a CPU's decode packs (generate/packed.py), float32 or bf16 (`element_bytes`): each projection and
    the head of at least packed.MIN_WEIGHTS elements (an upper bound: generator.matmul=auto packs only where it
    measured faster)."""
    q, kv = shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_layer = [shape.hidden * q, shape.hidden * kv, shape.hidden * kv, q * shape.hidden]  # q, k, v, o
    per_layer += [shape.hidden * shape.intermediate] * 3  # gate, up, down
    large = sum(n for n in per_layer if n >= MIN_WEIGHTS) * shape.layers
    head = shape.vocab * shape.hidden
    return element_bytes * (large + (head if head >= MIN_WEIGHTS else 0))


def decode_copies(settings, shape, *, device_type: str, weight_bytes: int, act_bytes: int) -> dict[str, float]:
    """The hf back-end's memory beside the KV cache (run/plan.py): on a CPU, the packed copies decoding multiplies
    by (generator.matmul), bf16 ones under bf16 autocast."""
    if device_type != "cpu" or settings.matmul == "plain" or weight_bytes != 4 or not packed_weight_bytes(shape):
        return {}
    in_bf16 = settings.weights == "bf16" or act_bytes == 2
    return {"packed weights": packed_weight_bytes(shape, 2 if in_bf16 else 4)}
