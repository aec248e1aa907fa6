"""Token log-probabilities through the model's own forward, lean under gradient.

`enable_logprob_forward(model)` gives a causal LM's `forward` one more keyword, `logprobs=`: with a
`LogProbRequest`, forward runs the model's body, then applies the LM head a chunk of positions at a
time and returns `(logp [B, T], entropy [B, T] or None)` for the last T tokens of each row instead of
logits. Because this happens inside `forward`, every wrapper's hooks run: DDP's gradient all-reduce,
FSDP's unshard and reshard, PEFT's adapters (and `disable_adapter()`). Without `logprobs=`, forward is
the model's own, so generation and `save_pretrained` are unaffected.

How it works in detail: docs/internals.md, grpo_cli/models/logprobs.py.
"""

from __future__ import annotations

import types
from contextlib import contextmanager
from dataclasses import dataclass, replace

import torch
from torch import Tensor
from torch.utils.checkpoint import checkpoint

from grpo_cli.models.packer import GROW_FROM, Packed
from grpo_cli.models.segments import can_segment, segment_attention

# Positions per head chunk: about 64M logits (256 MB in float32) at a time, whatever the vocabulary.
CHUNK_LOGITS = 1 << 26
# Config attributes of architectures whose forward changes the head's logits before returning them.
LOGIT_TRANSFORMS = ("final_logit_softcapping", "logit_scale", "logits_scaling")


@dataclass(frozen=True)
class LogProbRequest:
    completion_len: int  # T: score the last T tokens of each row
    temperature: float = 1.0  # the sampler's: ratios compare the tempered distributions
    with_entropy: bool = False
    entropy_grad: bool = False  # the entropy with its gradient (an entropy bonus); else a constant
    chunk_tokens: int | None = None  # positions per head chunk; None = CHUNK_LOGITS // vocab
    packed: Packed | None = None  # set: input_ids are packed bins (packer.py), and these states predict these targets


def enable_logprob_forward(model) -> None:
    """Patch this model instance's forward (not its class) to accept `logprobs=LogProbRequest(...)`."""
    if getattr(model.forward, "__func__", None) is _forward:
        return
    model.forward = types.MethodType(_forward, model)


def _forward(self, *args, logprobs: LogProbRequest | None = None, **kwargs):
    if logprobs is None:
        return type(self).forward(self, *args, **kwargs)
    return _logprob_forward(self, logprobs, **kwargs)


def _logprob_forward(
    self, req: LogProbRequest, *, input_ids: Tensor, attention_mask: Tensor | None, position_ids: Tensor, **_ignored
) -> tuple[Tensor, Tensor | None]:
    T = req.completion_len
    if req.packed is not None:  # attention_mask None: transformers finds the rows from the position ids
        with _packed_attention(self, req.packed) as (mask, keywords):
            hidden = self.base_model(
                input_ids=input_ids, attention_mask=mask, position_ids=position_ids, use_cache=False, **keywords
            ).last_hidden_state  # [bins, capacity, H]
        states = hidden.reshape(-1, hidden.shape[-1])[req.packed.states]  # [K, H]
        return _from_head(self.get_output_embeddings(), states, req.packed.targets, req)
    targets = input_ids[:, -T:]  # [B, T]
    if any(getattr(self.config, key, None) is not None for key in LOGIT_TRANSFORMS):
        logits = (
            type(self)
            .forward(
                self,
                input_ids=input_ids,
                attention_mask=attention_mask,
                position_ids=position_ids,
                use_cache=False,
                logits_to_keep=T + 1,
            )
            .logits[:, :-1]
        )  # [B, T, V]
        logp, entropy = _from_head(lambda x: x, logits.reshape(-1, logits.shape[-1]), targets.reshape(-1), req)
    else:
        hidden = self.base_model(
            input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
        ).last_hidden_state  # [B, L, H]
        states = hidden[:, -T - 1 : -1].reshape(-1, hidden.shape[-1])  # [B*T, H]: the states predicting each token
        logp, entropy = _from_head(self.get_output_embeddings(), states, targets.reshape(-1), req)
    return logp.view(-1, T), entropy.view(-1, T) if entropy is not None else None


@contextmanager
def _packed_attention(model, packed: Packed):
    """How a packed forward attends: block by block where the packer laid it so and the model can (segments.py),
    else through the model's own attention with the shared layout's tree mask (or none: the position ids'
    restarts mark the rows). Yields (mask, keywords)."""
    if packed.blocks is not None and can_segment(model):
        with segment_attention(model, packed.blocks) as keywords:
            yield None, keywords
    else:
        yield tree_mask_for(model, packed.mask), {}


def tree_mask_for(model, mask: Tensor | None) -> Tensor | None:
    """A shared-prompt layout's boolean mask as the attention takes it: as is for sdpa (True = attend), added
    to the scores (0 or the dtype's lowest) for eager attention. transformers passes a 4D mask through."""
    if mask is None or getattr(model.config, "_attn_implementation", "sdpa") != "eager":
        return mask
    dtype = model.get_input_embeddings().weight.dtype
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, torch.finfo(dtype).min)


def _from_head(head, states: Tensor, targets: Tensor, req: LogProbRequest):
    """log pi(target) (and entropy) of each position, `head` applied a chunk of positions at a time: [K] each."""
    vocab = getattr(head, "out_features", None) or states.shape[-1]
    chunk = req.chunk_tokens or max(1, CHUNK_LOGITS // vocab)
    lean = torch.is_grad_enabled() and states.requires_grad
    logps, entropies = [], []
    for s in range(0, states.shape[0], chunk):
        args = (
            head,
            states[s : s + chunk],
            targets[s : s + chunk],
            req.temperature,
            req.with_entropy,
            req.entropy_grad,
        )
        logp, entropy = checkpoint(_chunk, *args, use_reentrant=False) if lean else _chunk(*args)
        logps.append(logp)
        entropies.append(entropy)
    if not logps:  # nothing to score (a packed micro-batch without completion tokens)
        empty = states.new_zeros(0, dtype=torch.float32)
        return empty, empty if req.with_entropy else None
    return torch.cat(logps), torch.cat(entropies) if req.with_entropy else None


def _chunk(head, states: Tensor, targets: Tensor, temperature: float, with_entropy: bool, entropy_grad: bool = False):
    """Chosen logit minus logsumexp in float32, of softmax(head(states) / temperature)."""
    logits = head(states).float()  # [chunk, V]
    if temperature != 1.0:
        logits = logits / temperature
    if not entropy_grad:
        return TokenLogProb.apply(logits, targets, with_entropy)
    # An entropy bonus differentiates the entropy too: autograd's own ops, as _entropy computes it (the values
    # are invariant to the shift, so the detached max changes no gradient; exp over its sum, as torch.softmax's
    # float32 kernel on a CPU was 6e-6 off).
    shifted = logits - logits.amax(-1, keepdim=True).detach()
    e = shifted.exp()
    total = e.sum(-1, keepdim=True)
    entropy = total.squeeze(-1).log() - (e / total * shifted).sum(-1)
    return shifted.gather(-1, targets[:, None]).squeeze(-1) - total.squeeze(-1).log(), entropy


ENTROPY_BYTES = 16 << 20  # the shifted logits of this many bytes of rows at a time


def _entropy(logits: Tensor, top: Tensor, total: Tensor, p: Tensor) -> Tensor:
    """H = log(total) - sum_v p_v (logit_v - max), on logits shifted by their row's max: their products with p
    are small where p is large, so the sum keeps float32's precision (unshifted, lse - sum_v p_v logit_v
    cancels two numbers of the logits' size). The products are summed by torch's reduction, not a batched
    matrix product, whose float32 accumulation on a CPU was 1e-4 off over 32,000 terms. The shift is taken
    a few rows at a time, so the only [K, V] temporary stays the probabilities."""
    entropy = total.squeeze(-1).log()
    rows = max(1, ENTROPY_BYTES // (logits.shape[-1] * logits.element_size()))
    for i in range(0, len(logits), rows):
        part = slice(i, i + rows)
        entropy[part] -= (logits[part] - top[part]).mul_(p[part]).sum(-1)
    return entropy


class TokenLogProb(torch.autograd.Function):
    """log softmax(logits)[target] and, as a constant, the entropy of softmax(logits): [K] each from
    float32 logits [K, V], with one [K, V] temporary (the probabilities). The backward,
    d logp / d logits = onehot(target) - p, is written into the saved probabilities in place, so the saved
    tensors serve one backward (a second, under retain_graph, raises). Autograd's composition of logsumexp,
    gather and softmax makes at least eight [K, V] tensors a checkpointed chunk (one zero-filled for the
    gather's gradient), this two: on a CPU a fresh one costs page faults over its whole size (0.75 s for
    1,365 x 49,152 on the EPYC of docs/benchmarks.md, 30x the arithmetic)."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, with_entropy: bool):
        top = logits.amax(-1, keepdim=True)
        p = torch.sub(logits, top).exp_()  # the one [K, V] temporary: exp(logit - max), then softmax
        total = p.sum(-1, keepdim=True)
        lse = (top + total.log()).squeeze(-1)
        logp = logits.gather(-1, targets[:, None]).squeeze(-1) - lse
        p.div_(total)
        entropy = None
        if with_entropy:
            entropy = _entropy(logits, top, total, p)
            ctx.mark_non_differentiable(entropy)
        ctx.save_for_backward(p, targets)
        ctx.spent = False
        return logp, entropy

    @staticmethod
    def backward(ctx, grad_logp: Tensor, _grad_entropy):
        if ctx.spent:
            raise RuntimeError("TokenLogProb's backward ran twice: its gradient overwrites the saved probabilities")
        ctx.spent = True
        p, targets = ctx.saved_tensors
        grad = p.mul_(-grad_logp[:, None])  # -g p, then + g at each row's target
        grad.scatter_add_(-1, targets[:, None], grad_logp[:, None])
        return grad, None, None


# Attention implementations that read packed rows from position ids (transformers' packed-sequence support).
PACKABLE_ATTENTION = ("sdpa", "eager", "flash_attention_2", "flash_attention_3", "flex_attention")
# Those that take a 4D mask, the shared-prompt layout's tree (packer.shared_inputs).
TREE_ATTENTION = ("sdpa", "eager")


def lm_config(model):
    """The innermost causal LM's config, through DDP (.module) and PEFT (attribute forwarding)."""
    return getattr(getattr(model, "module", model), "config", None)


def text_config(config):
    """The decoder's part of a config: its text config where it has one (a vision-language model's), else itself."""
    return config.get_text_config() if hasattr(config, "get_text_config") else config


def can_pack(model) -> bool:
    """Whether `model`'s forward can take packed rows: an attention that reads position-id restarts, and
    a head whose logits are not transformed after it (those models go through their own full forward)."""
    config = lm_config(model)
    return (
        config is not None
        and getattr(config, "_attn_implementation", None) in PACKABLE_ATTENTION
        and not any(getattr(config, key, None) is not None for key in LOGIT_TRANSFORMS)
    )


def can_share_prompts(model) -> bool:
    """Whether `model` can take the shared-prompt layout: packed rows and an attention that reads a 4D mask.
    transformers takes a 4D mask as it is, without a sliding window, so a model whose layers slide shares
    only where its rows go block by block (which keep the window) and the rows left under the tree mask
    (shorter than packer.GROW_FROM) are within the window."""
    config = lm_config(model)
    if not (can_pack(model) and getattr(config, "_attn_implementation", None) in TREE_ATTENTION):
        return False
    window = sliding_window(config)
    return window is None or (attends_by_block(model) and window >= GROW_FROM)


def sliding_window(config) -> int | None:
    """The window of the model's sliding-window layers; None where no layer slides (Qwen2 names each layer's
    kind; Mistral's window, when set, is every layer's)."""
    window, kinds = getattr(config, "sliding_window", None), getattr(config, "layer_types", None)
    if not window or (kinds is not None and "sliding_attention" not in kinds):
        return None
    return int(window)


def attends_by_block(model) -> bool:
    """Whether `model` (or the causal LM inside its wrappers) can attend packed rows block by block (segments.py)."""
    return can_segment(model, lm_config(model))


def one_bin(model) -> bool:
    """Variable-length kernels take the whole micro-batch as one sequence of rows."""
    return str(getattr(lm_config(model), "_attn_implementation", "")).startswith(("flash", "flex"))


def padded_logprobs(model, input_ids: Tensor, attention_mask: Tensor, request: LogProbRequest):
    """The last `request.completion_len` tokens of padded rows scored: ([B, T], [B, T] or None). Positions
    count real tokens only, as generation does with left padding."""
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, logprobs=request)


def packed_logprobs(model, packed: Packed, request: LogProbRequest):
    """A packed micro-batch's scored tokens (`packed.index` of the rollout's): ([K], [K] or None)."""
    return model(
        input_ids=packed.input_ids,
        attention_mask=None,
        position_ids=packed.position_ids,
        logprobs=replace(request, packed=packed),
    )
