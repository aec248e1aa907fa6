"""Sampling groups of completions and scoring their tokens under a policy.

The Rollout is the batch object that travels the loop (DESIGN.md): generation fills the token
fields, the trainer adds rewards, advantages and whichever log-probabilities the config needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor
from transformers import GenerationConfig


@dataclass
class Rollout:
    prompts: list[str]  # [n] distinct prompts
    group_size: int  # G
    input_ids: Tensor  # [n*G, P+T] left-padded prompt followed by the completion
    attention_mask: Tensor  # [n*G, P+T] 1 on real prompt tokens and on completion tokens up to EOS
    completion_mask: Tensor  # [n*G, T] 1 on completion tokens up to and including EOS
    truncated: Tensor  # [n*G] bool: hit max_new_tokens without EOS
    completions: list[str]  # [n*G] decoded, special tokens dropped
    pad_token_id: int = 0
    rewards: Optional[Tensor] = None  # [n, G]
    advantages: Optional[Tensor] = None  # [n*G]
    old_logp: Optional[Tensor] = None  # [n*G, T] pi_theta_old, only when mu > 1
    ref_logp: Optional[Tensor] = None  # [n*G, T] pi_ref, only when beta != 0
    extra: dict = field(default_factory=dict)

    @property
    def completion_len(self) -> int:
        return self.completion_mask.shape[1]

    def select_groups(self, groups: list[int]) -> "Rollout":
        """The rollout restricted to whole groups (token fields only; scores are added later)."""
        G = self.group_size
        rows = torch.tensor([g * G + j for g in groups for j in range(G)], dtype=torch.long)
        return Rollout(
            prompts=[self.prompts[g] for g in groups], group_size=G,
            input_ids=self.input_ids[rows], attention_mask=self.attention_mask[rows],
            completion_mask=self.completion_mask[rows], truncated=self.truncated[rows],
            completions=[self.completions[i] for i in rows.tolist()], pad_token_id=self.pad_token_id,
        )


def concat_rollouts(rolls: list[Rollout]) -> Rollout:
    """Rollouts of the same group size joined: prompts re-padded on the left, completions on the right."""
    if len(rolls) == 1:
        return rolls[0]
    T = max(r.completion_len for r in rolls)
    P = max(r.input_ids.shape[1] - r.completion_len for r in rolls)

    def pad(r: Rollout, t: Tensor, fill: int) -> Tensor:
        return F.pad(t, (P - (r.input_ids.shape[1] - r.completion_len), T - r.completion_len), value=fill)

    return Rollout(
        prompts=[p for r in rolls for p in r.prompts], group_size=rolls[0].group_size,
        input_ids=torch.cat([pad(r, r.input_ids, r.pad_token_id) for r in rolls]),
        attention_mask=torch.cat([pad(r, r.attention_mask, 0) for r in rolls]),
        completion_mask=torch.cat([F.pad(r.completion_mask, (0, T - r.completion_len)) for r in rolls]),
        truncated=torch.cat([r.truncated for r in rolls]),
        completions=[c for r in rolls for c in r.completions], pad_token_id=rolls[0].pad_token_id,
    )


def completion_mask(completion_ids: Tensor, eos_ids: list[int]) -> tuple[Tensor, Tensor]:
    """Mask of tokens up to and including the first EOS, and whether each row never reached one."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))  # [B, T]
    has_eos = is_eos.any(dim=1)
    T = completion_ids.shape[1]
    first = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, T, dtype=torch.long))
    mask = torch.arange(T, device=completion_ids.device)[None, :] <= first[:, None]
    return mask.long(), ~has_eos


def eos_token_ids(model, tokenizer) -> list[int]:
    ids = getattr(model.generation_config, "eos_token_id", None) or tokenizer.eos_token_id
    ids = ids if isinstance(ids, list) else [ids]
    return sorted({int(i) for i in ids if i is not None})


@torch.no_grad()
def generate(
    model,
    tokenizer,
    prompts: list[str],
    group_size: int = 1,
    *,
    max_new_tokens: int,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    greedy: bool = False,
) -> Rollout:
    """G completions per prompt in one batched, KV-cached `generate` with left padding."""
    prompts = list(prompts)
    device = next(model.parameters()).device
    enc = tokenizer(prompts, return_tensors="pt", padding=True, padding_side="left").to(device)
    eos = eos_token_ids(model, tokenizer)
    gen_cfg = GenerationConfig(
        do_sample=not greedy,
        temperature=temperature if not greedy else None,
        top_p=top_p if not greedy else None,
        top_k=top_k if not greedy else None,
        max_new_tokens=max_new_tokens,
        num_return_sequences=group_size,
        eos_token_id=eos,
        pad_token_id=tokenizer.pad_token_id,
    )
    was_training = model.training
    model.eval()
    sequences = model.generate(**enc, generation_config=gen_cfg)  # [n*G, P+T']
    model.train(was_training)
    P = enc["input_ids"].shape[1]
    completion_ids = sequences[:, P:]
    if completion_ids.shape[1] == 0:  # max_new_tokens=0 or an immediate stop: keep one column
        completion_ids = torch.full((sequences.shape[0], 1), eos[0], device=device)
        sequences = torch.cat([sequences, completion_ids], dim=1)
    mask, truncated = completion_mask(completion_ids, eos)
    prompt_mask = enc["attention_mask"].repeat_interleave(group_size, dim=0)
    # Tokens after EOS are padding and must not be attended to or scored.
    sequences = torch.where(torch.cat([prompt_mask, mask], 1).bool(), sequences, tokenizer.pad_token_id)
    completions = tokenizer.batch_decode(completion_ids.masked_fill(mask == 0, tokenizer.pad_token_id), skip_special_tokens=True)
    return Rollout(
        prompts=list(prompts),
        group_size=group_size,
        input_ids=sequences,
        attention_mask=torch.cat([prompt_mask, mask], dim=1),
        completion_mask=mask,
        truncated=truncated,
        completions=completions,
        pad_token_id=tokenizer.pad_token_id,
    )


def token_logprobs(
    model,
    input_ids: Tensor,
    attention_mask: Tensor,
    completion_len: int,
    *,
    temperature: float = 1.0,
    chunk_tokens: int = 1024,
    with_entropy: bool = False,
) -> tuple[Tensor, Optional[Tensor]]:
    """log pi(y_t | x, y_<t) for the last `completion_len` tokens of each row: [B, T].

    The policy is the sampler's tempered distribution softmax(logits / temperature), so ratios
    compare like with like. Logits come from the LM head applied to `chunk_tokens` positions at a
    time, as chosen logit minus logsumexp, so no float32 [B, T, vocab] log-softmax of the batch ever
    exists: with Qwen's 151,936-token vocabulary a 1,024-position chunk is 0.6 GB, where 8 rows of
    512 tokens would be 2.5 GB. Positions count real tokens only, as `generate` does with left padding.
    """
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    hidden = model.base_model(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state  # [B, L, H]
    B, T = input_ids.shape[0], completion_len
    hidden = hidden[:, -T - 1 : -1].reshape(B * T, -1)  # [B*T, H]: the states that predict each completion token
    targets = input_ids[:, -T:].reshape(B * T)
    head = model.get_output_embeddings()
    logps, entropies = [], []
    for start in range(0, B * T, chunk_tokens):
        logits = head(hidden[start : start + chunk_tokens]).float() / temperature  # [chunk, V]
        lse = logits.logsumexp(dim=-1)
        logps.append(logits.gather(-1, targets[start : start + chunk_tokens, None]).squeeze(-1) - lse)
        if with_entropy:
            with torch.no_grad():
                entropies.append(lse - (torch.softmax(logits, dim=-1) * logits).sum(-1))
    logp = torch.cat(logps).view(B, T)
    return logp, (torch.cat(entropies).view(B, T) if with_entropy else None)
