"""Memory by the numbers: a decoder's sizes read from its config (`model_shape`), the activations autograd keeps
per token, and this process's memory as Linux and CUDA report it. The planner (run/plan.py) adds them up."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch

from grpo_cli.models.logprobs import text_config

GIB = float(1 << 30)
ALLOCATOR_SLACK = 1.6  # resident bytes per byte of the update's transient tensors (fp32, CPU, glibc), measured
CUDA_SLACK = 1.25  # allocated bytes per byte of them on CUDA (H100; 1.26 fp32 full, 1.23 bf16-mixed LoRA), measured
DTYPE_BYTES = {torch.float32: 4, torch.bfloat16: 2, torch.float16: 2}


@dataclass(frozen=True)
class Shape:
    """What the estimate reads of a decoder: sizes per layer and the parameter counts."""

    layers: int
    hidden: int
    intermediate: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    parameters: int  # all of the policy's
    trainable: int  # the ones AdamW updates (all, or a LoRA adapter's)


def kv_sizes(text) -> tuple[int, int]:
    """(key/value heads, head size) of a decoder's (text) config: the heads where it does not group them, the
    hidden size over the heads where it does not give a head size."""
    heads = text.num_attention_heads
    return getattr(text, "num_key_value_heads", None) or heads, getattr(
        text, "head_dim", None
    ) or text.hidden_size // heads


def model_shape(path: str, trust_remote_code: bool = False, lora=None) -> Shape:
    """The decoder's sizes from its config.json, and exact parameter counts from the model built on the
    meta device (no weights are read or allocated); under LoRA the adapter is added there too."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from grpo_cli.models.loading import resolve_path

    config = AutoConfig.from_pretrained(resolve_path(path), trust_remote_code=trust_remote_code)
    text = text_config(config)
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code)
    parameters = sum(p.numel() for p in model.parameters())
    trainable = parameters
    if lora is not None and lora.r:
        from grpo_cli.models.lora import add_adapter

        with torch.device("meta"):
            model = add_adapter(model, lora)
        trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    hidden = text.hidden_size
    kv_heads, head_dim = kv_sizes(text)
    return Shape(
        layers=text.num_hidden_layers,
        hidden=hidden,
        intermediate=getattr(text, "intermediate_size", None) or 4 * hidden,
        heads=text.num_attention_heads,
        kv_heads=kv_heads,
        head_dim=head_dim,
        vocab=text.vocab_size,
        parameters=parameters,
        trainable=trainable,
    )


def _status_bytes(field: str) -> float:
    """A memory figure of this process from Linux's /proc/self/status, in bytes (0 where it cannot be read)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    return 0.0


def resident_bytes() -> float:
    """This process's resident memory now."""
    return _status_bytes("VmRSS")


def peak_resident_bytes() -> float:
    """This process's peak resident memory so far (its high-water mark)."""
    return _status_bytes("VmHWM")


def current_bytes(device: torch.device) -> float:
    """Memory in use now: CUDA's allocated tensors on a GPU, the process's resident memory on CPU."""
    if device.type == "cuda":
        return float(torch.cuda.memory_allocated(device))
    return resident_bytes()


def peak_bytes(device: torch.device) -> float:
    """The peak so far: CUDA's allocated tensors on a GPU, the process's resident memory on CPU."""
    if device.type == "cuda":
        return float(torch.cuda.max_memory_allocated(device))
    return peak_resident_bytes()


def activation_bytes_per_token(
    s: Shape, row_len: int, act_bytes: int, checkpointing: bool, pointwise: bool = False
) -> float:
    """Activation bytes autograd keeps per token of a micro-batch (see the module docstring). `pointwise`:
    under model.recompute_pointwise (recompute.py) two [intermediate] tensors fewer: the MLP keeps its gate's and
    up projection's outputs but not their SiLU and product (the norms' savings are about what the checkpointed
    regions' inputs and kept outputs add back)."""
    kv = s.kv_heads * s.head_dim
    q = s.heads * s.head_dim
    # norms 2 x 2h; q, k and v (repeated to every head under a mask); attention output and o_proj's input;
    # the residual stream's width for o_proj's output; the MLP's gate, its activation, up and their product;
    # the float attention mask's row.
    k_and_v = 2 * q if kv < q else 2 * kv
    per_layer = (4 * s.hidden + q + k_and_v + 2 * q + 4 * s.intermediate) * act_bytes + 4 * row_len
    if pointwise and not checkpointing:
        per_layer -= 2 * s.intermediate * act_bytes  # measured: tests/models/test_recompute.py
    if checkpointing:  # each layer keeps its input; one layer's full set lives while it is recomputed
        return s.layers * s.hidden * act_bytes + per_layer
    return s.layers * per_layer


def noise_steps_ahead(rows: int, vocab: int, max_new_tokens: int, device_type: str) -> int:
    """How many tokens of sampling noise generation draws at once (generate/sampling.py's Noise): up to 16, within
    512 MiB on a GPU (where each draw is a launch the host pays for) and 32 MiB on a CPU."""
    budget = (512 if device_type == "cuda" else 32) << 20
    return max(1, min(16, max_new_tokens, budget // max(1, rows * vocab * 4)))


def dtype_bytes(dtype: torch.dtype) -> int:
    return DTYPE_BYTES.get(dtype, 4)
