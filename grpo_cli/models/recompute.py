"""Pointwise recompute: each decoder layer's norms and MLP keep only their matrix products' outputs for the
backward, and redo the elementwise work (RMSNorm's square, mean and scaling; SiLU and the gate's product) there.

Autograd keeps, per token of each layer, what every elementwise operation needs for its backward: the norm's
input and its normalized copy, the gate's output, its SiLU, the up projection's output and their product. Most
of those are cheap to compute again and large to hold (the MLP's are the intermediate size, 2.7x the hidden size
on SmolLM2). Here the norms and the MLP run under torch's selective activation checkpointing
(`torch.utils.checkpoint` with `create_selective_checkpoint_contexts`): the outputs of matrix products are kept,
everything else is recomputed in the backward from them. The backward runs the same operations on the same
values as without it, so gradients are bitwise the same (tests/models/test_recompute.py).

How it works in detail: docs/internals.md, grpo_cli/models/recompute.py.
"""

from __future__ import annotations

import functools
import types

import torch
from torch.utils.checkpoint import checkpoint, create_selective_checkpoint_contexts

from grpo_cli.models.logprobs import text_config

# what is kept: the outputs of matrix products (a linear layer is mm, or addmm with a bias; bmm for batched ones)
KEPT = [torch.ops.aten.mm.default, torch.ops.aten.addmm.default, torch.ops.aten.bmm.default]
NORMS = ("input_layernorm", "post_attention_layernorm")
AUTO_MIN_HIDDEN = 512  # auto's threshold on the hidden size (module docstring)


def _contexts():
    return create_selective_checkpoint_contexts(KEPT)


def _recomputed(self, *args, **kwargs):
    """The module's class forward, under selective checkpointing when autograd records it (its input, the first
    argument, needs a gradient). Bound to the module as a method (types.MethodType), so a deep copy of the model
    (a reference) calls its own weights."""
    hidden = args[0] if args else next(iter(kwargs.values()), None)
    if torch.is_grad_enabled() and isinstance(hidden, torch.Tensor) and hidden.requires_grad:
        forward = functools.partial(type(self).forward, self)
        return checkpoint(forward, *args, use_reentrant=False, context_fn=_contexts, **kwargs)
    return type(self).forward(self, *args, **kwargs)


def decoder_parts(model: torch.nn.Module) -> list[torch.nn.Module]:
    """The modules pointwise recompute wraps: each decoder layer's MLP and its two norms (a layer with an `mlp`,
    an `input_layernorm` and a `post_attention_layernorm`, as Llama, Qwen2/3, Mistral and their kin have)."""
    parts = []
    for module in model.modules():
        if all(isinstance(getattr(module, name, None), torch.nn.Module) for name in ("mlp", *NORMS)):
            parts += [module.mlp, *(getattr(module, name) for name in NORMS)]
    return parts


def recompute_wanted(setting, hidden_size: int) -> bool:
    """Whether model.recompute_pointwise=`setting` (auto, true or false) applies to a model of this hidden size."""
    setting = str(setting).lower()
    return setting == "true" or (setting == "auto" and hidden_size >= AUTO_MIN_HIDDEN)


def wanted(model: torch.nn.Module, setting) -> bool:
    """recompute_wanted for `model`, by its (text) config's hidden size."""
    text = text_config(getattr(model, "config", None))
    return recompute_wanted(setting, getattr(text, "hidden_size", None) or 0)


def recompute_pointwise(model: torch.nn.Module, setting="true") -> int:
    """Wrap `model`'s decoder norms and MLPs (module docstring) where `setting` asks for it (`wanted`); returns
    how many modules are wrapped, 0 for a model without such layers or not wanted. A module whose forward is
    already its own (this wrapper, or another library's) is left as it is, so wrapping twice does nothing more."""
    parts = decoder_parts(model) if wanted(model, setting) else []
    for module in parts:
        if "forward" not in vars(module):
            module.forward = types.MethodType(_recomputed, module)
    return sum(getattr(vars(m).get("forward"), "__func__", None) is _recomputed for m in parts)
