"""The Rollout: the batch object that travels the loop. Generation (generation.py) fills the token
fields; the step adds rewards, advantages and whichever log-probabilities the config needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor


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
    weight: Optional[Tensor] = None  # [n*G] 1 for a real row, 0 for padding (a rank's share topped up); None = all real
    sampler_logp: Optional[Tensor] = None  # [n*G, T] the sampler's own log-probs of its tokens (vLLM), 0 off the mask
    answers: Optional[list] = None  # [n] each group's reference answer, once scored
    extra: dict = field(default_factory=dict)  # per-term rewards ("reward_terms": {name: [n, G]}) for logging

    @property
    def completion_len(self) -> int:
        return self.completion_mask.shape[1]

    def completion_ids(self) -> list[list[int]]:
        """Each completion's token ids, up to and including EOS (what TRL-style rewards get as completion_ids)."""
        ids, mask = self.input_ids[:, -self.completion_len :].tolist(), self.completion_mask.sum(1).tolist()
        return [row[: int(n)] for row, n in zip(ids, mask)]

    def select_groups(self, groups: list[int]) -> "Rollout":
        """The rollout restricted to whole groups (token fields only; scores are added later)."""
        G = self.group_size
        rows = torch.tensor([g * G + j for g in groups for j in range(G)], dtype=torch.long)
        return Rollout(
            prompts=[self.prompts[g] for g in groups], group_size=G,
            input_ids=self.input_ids[rows], attention_mask=self.attention_mask[rows],
            completion_mask=self.completion_mask[rows], truncated=self.truncated[rows],
            completions=[self.completions[i] for i in rows.tolist()], pad_token_id=self.pad_token_id,
            weight=None if self.weight is None else self.weight[rows],
            sampler_logp=None if self.sampler_logp is None else self.sampler_logp[rows],
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
        weight=None if all(r.weight is None for r in rolls) else torch.cat([
            r.weight if r.weight is not None else torch.ones(r.input_ids.shape[0], device=r.input_ids.device)
            for r in rolls]),
        sampler_logp=None if any(r.sampler_logp is None for r in rolls) else torch.cat(
            [F.pad(r.sampler_logp, (0, T - r.completion_len)) for r in rolls]),
    )


def completion_mask(completion_ids: Tensor, eos_ids: list[int]) -> tuple[Tensor, Tensor]:
    """Mask of tokens up to and including the first EOS, and whether each row never reached one."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))  # [B, T]
    has_eos = is_eos.any(dim=1)
    T = completion_ids.shape[1]
    first = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, T, dtype=torch.long))
    mask = torch.arange(T, device=completion_ids.device)[None, :] <= first[:, None]
    return mask.long(), ~has_eos
