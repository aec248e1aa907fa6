"""The Rollout: the batch object that travels the loop. Generation (generation.py) fills the token
fields; the step adds rewards, advantages and whichever log-probabilities the config needs.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor


# What each per-row field spans, so selecting and joining rollouts is written once, field by field:
# "sequence" [rows, P+T] (prompt left-padded, completion right-padded), "completion" [rows, T], "row" [rows].
SEQUENCE, COMPLETION, ROW = "sequence", "completion", "row"


def _rows(kind: str, default=None):
    return field(default=default, metadata={"rows": kind})


@dataclass
class Rollout:
    prompts: list[str]  # [n] distinct prompts
    group_size: int  # G
    input_ids: Tensor = _rows(SEQUENCE)  # [n*G, P+T] left-padded prompt followed by the completion
    attention_mask: Tensor = _rows(SEQUENCE)  # [n*G, P+T] 1 on real prompt tokens and on completion tokens up to EOS
    completion_mask: Tensor = _rows(COMPLETION)  # [n*G, T] 1 on tokens the model generated (up to and including EOS):
    # the action mask; an episode's environment tokens (episodes.py) are 0 here and 1 in attention_mask
    truncated: Tensor = _rows(ROW)  # [n*G] bool: hit max_new_tokens without EOS
    completions: list[str] = field(default_factory=list)  # [n*G] decoded, special tokens dropped
    pad_token_id: int = 0
    rewards: Optional[Tensor] = None  # [n, G]
    advantages: Optional[Tensor] = None  # [n*G]
    old_logp: Optional[Tensor] = None  # [n*G, T] pi_theta_old, only when mu > 1
    ref_logp: Optional[Tensor] = None  # [n*G, T] pi_ref, only when beta != 0
    weight: Optional[Tensor] = _rows(ROW)  # [n*G] 1 for a real row, 0 for padding (a rank's share topped up); None = all real
    sampler_logp: Optional[Tensor] = _rows(COMPLETION)  # [n*G, T] the sampler's own log-probs of its tokens (vLLM), 0 off the mask
    behaviour_logp: Optional[Tensor] = _rows(COMPLETION)  # [n*G, T] log-probs under the weights that sampled, when those
    # were older than the policy trained on it (rollout_worker.py: computed there, in the training precision)
    version: Optional[int] = None  # the pushed weights' version (updates applied) that sampled it; None = the policy itself
    answers: Optional[list] = None  # [n] each group's reference answer, once scored
    episodes: Optional[list] = None  # [n*G] multi-turn: each row's episodes.Episode (messages, counts); None = one turn
    extra: dict = field(default_factory=dict)  # per-term rewards ("reward_terms": {name: [n, G]}) for logging

    @property
    def completion_len(self) -> int:
        return self.completion_mask.shape[1]

    def completion_ids(self) -> list[list[int]]:
        """Each completion's token ids, up to and including EOS (what TRL-style rewards get as completion_ids);
        an episode's are all its tokens after the prompt, the environment's included."""
        T = self.completion_len
        ids, mask = self.input_ids[:, -T:].tolist(), self.attention_mask[:, -T:].sum(1).tolist()
        return [row[: int(n)] for row, n in zip(ids, mask)]

    def select_groups(self, groups: list[int]) -> "Rollout":
        """The rollout restricted to whole groups (token fields only; scores are added later)."""
        G = self.group_size
        rows = torch.tensor([g * G + j for g in groups for j in range(G)], dtype=torch.long)
        tensors = {f.name: None if getattr(self, f.name) is None else getattr(self, f.name)[rows] for f in ROW_FIELDS}
        return Rollout(prompts=[self.prompts[g] for g in groups], group_size=G, pad_token_id=self.pad_token_id,
                       version=self.version,
                       completions=[self.completions[i] for i in rows.tolist()],
                       episodes=None if self.episodes is None else [self.episodes[i] for i in rows.tolist()], **tensors)


ROW_FIELDS = [f for f in fields(Rollout) if "rows" in f.metadata]


def concat_rollouts(rolls: list[Rollout]) -> Rollout:
    """Rollouts of the same group size joined: prompts re-padded on the left, completions on the right."""
    if len(rolls) == 1:
        return rolls[0]
    T = max(r.completion_len for r in rolls)
    P = max(r.input_ids.shape[1] - r.completion_len for r in rolls)

    def padded(r: Rollout, f) -> Tensor:
        t, kind = getattr(r, f.name), f.metadata["rows"]
        if t is None:  # a weight only some parts have: theirs are real rows
            return torch.ones(r.input_ids.shape[0], device=r.input_ids.device)
        fill = r.pad_token_id if f.name == "input_ids" else 0
        if kind == SEQUENCE:
            return F.pad(t, (P - (r.input_ids.shape[1] - r.completion_len), T - r.completion_len), value=fill)
        return F.pad(t, (0, T - r.completion_len), value=fill) if kind == COMPLETION else t

    # A field is joined when every part has it; a weight when any part has one.
    joined = {f.name: torch.cat([padded(r, f) for r in rolls])
              if (any if f.name == "weight" else all)(getattr(r, f.name) is not None for r in rolls) else None
              for f in ROW_FIELDS}
    episodes = [e for r in rolls for e in r.episodes] if all(r.episodes is not None for r in rolls) else None
    versions = {r.version for r in rolls}
    return Rollout(prompts=[p for r in rolls for p in r.prompts], group_size=rolls[0].group_size, episodes=episodes,
                   version=versions.pop() if len(versions) == 1 else None,
                   completions=[c for r in rolls for c in r.completions], pad_token_id=rolls[0].pad_token_id, **joined)


def completion_mask(completion_ids: Tensor, eos_ids: list[int]) -> tuple[Tensor, Tensor]:
    """Mask of tokens up to and including the first EOS, and whether each row never reached one."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))  # [B, T]
    has_eos = is_eos.any(dim=1)
    T = completion_ids.shape[1]
    first = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, T, dtype=torch.long))
    mask = torch.arange(T, device=completion_ids.device)[None, :] <= first[:, None]
    return mask.long(), ~has_eos
