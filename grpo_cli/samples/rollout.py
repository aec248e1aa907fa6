"""The Rollout: the batch of trajectories that travels from the rollout source to the step. Each trajectory is
one flat token sequence, its prompt followed by everything after it (the model's tokens and, in an episode, the
environment's), with no padding; per token it carries whether the model sampled it (the loss mask) and the
log-probs its sampler or behaviour policy gave it. Rows lie end to end in one tensor, so joining rollouts or
picking groups never re-pads, multi-turn is no special case, and the step's packer lays the rows into
micro-batches once."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any, Optional

import torch
from torch import Tensor

# Per-token fields: each [N], one value per token of `tokens` (0 on prompt tokens).
TOKEN_FIELDS = ("loss_mask", "sampler_logp", "behaviour_logp", "ref_logp")
# Per-row fields: each [rows].
ROW_FIELDS = ("lengths", "prompt_lengths", "truncated", "weight")


@dataclass
class Rollout:
    prompts: list[str]  # [n] distinct prompts
    group_size: int  # G
    tokens: Tensor  # [N] long: every row's tokens end to end, its prompt's then everything after it; no padding
    lengths: Tensor  # [n*G] long, on the host: tokens per row
    prompt_lengths: Tensor  # [n*G] long, on the host: of them, the prompt's
    loss_mask: Tensor  # [N] long: 1 on tokens the model sampled (up to and including EOS), the action mask; 0 on the
    # prompt and on an episode's environment tokens
    truncated: Tensor  # [n*G] bool: hit max_new_tokens (or an episode's limits) without EOS
    completions: list[str] = field(default_factory=list)  # [n*G] decoded, special tokens dropped
    pad_token_id: int = 0  # what fills the padded view
    rewards: Optional[Tensor] = None  # [n, G]
    advantages: Optional[Tensor] = None  # [n*G], each row's, on its loss-mask tokens
    old_logp: Optional[Tensor] = None  # [N] pi_theta_old's, set by the step when mu > 1
    ref_logp: Optional[Tensor] = None  # [N] pi_ref's when beta != 0: set by the step, or by the worker that sampled
    weight: Optional[Tensor] = None  # [n*G] 1 for a real row, 0 for padding (a rank's share topped up); None = all real
    sampler_logp: Optional[Tensor] = None  # [N] the sampler's own log-probs of its tokens (vLLM), 0 off the loss mask
    behaviour_logp: Optional[Tensor] = None  # [N] log-probs under the weights that sampled, when those were older than
    # the policy trained on it (rollout/worker.py: computed there, in the training precision)
    version: Optional[int] = (
        None  # the pushed weights' version (updates applied) that sampled it; None = the policy itself
    )
    answers: Optional[list] = None  # [n] each group's reference answer, once scored
    episodes: Optional[list] = None  # [n*G] multi-turn: each row's episodes.Episode (messages, counts); None = one turn
    extra: dict = field(default_factory=dict)  # per-term rewards ("reward_terms": {name: [n, G]}) for logging

    @classmethod
    def of_rows(
        cls,
        prompts: list[str],
        group_size: int,
        prompt_ids: list[list[int]],
        after: list[list[int]],
        *,
        truncated: list[bool],
        sampled: list[list[int]] | None = None,
        logps: list[list[float]] | None = None,
        device=None,
        **rest,
    ) -> "Rollout":
        """From each row's prompt ids and the ids after them (`sampled`: 1 where the model sampled the token,
        default all; `logps`: the sampler's log-prob of each, 0 where it did not sample)."""
        sampled = sampled if sampled is not None else [[1] * len(ids) for ids in after]

        def flat(per_row, prompt_value, dtype):  # each row's prompt, then what follows it
            values = [v for p, a in zip(prompt_ids, per_row) for v in [*([prompt_value] * len(p)), *a]]
            return torch.tensor(values, dtype=dtype, device=device)

        mask = flat(sampled, 0, torch.long)
        tokens = torch.tensor([t for p, a in zip(prompt_ids, after) for t in [*p, *a]], dtype=torch.long, device=device)
        return cls(
            prompts=list(prompts),
            group_size=group_size,
            tokens=tokens,
            lengths=torch.tensor([len(p) + len(a) for p, a in zip(prompt_ids, after)], dtype=torch.long),
            prompt_lengths=torch.tensor([len(p) for p in prompt_ids], dtype=torch.long),
            loss_mask=mask,
            truncated=torch.tensor(truncated, dtype=torch.bool, device=device),
            sampler_logp=None if logps is None else flat(logps, 0.0, torch.float32) * mask,
            **rest,
        )

    @property
    def rows(self) -> int:
        return self.lengths.shape[0]

    @property
    def completion_lengths(self) -> Tensor:
        """[rows] tokens after each prompt (an episode's environment tokens included), on the host."""
        return self.lengths - self.prompt_lengths

    @property
    def completion_len(self) -> int:
        """T: the longest row's tokens after its prompt, the padded view's completion columns."""
        return max(int(self.completion_lengths.max()), 1) if self.rows else 1

    @property
    def offsets(self) -> Tensor:
        """[rows] where each row starts in `tokens`, on the host."""
        return self.lengths.cumsum(0) - self.lengths

    def sampled_tokens(self) -> Tensor:
        """[rows] each row's loss-mask tokens (the model's), on the host: a single-turn completion's length."""
        row = torch.repeat_interleave(torch.arange(self.rows), self.lengths)
        return torch.zeros(self.rows, dtype=torch.long).index_add_(0, row, self.loss_mask.cpu().long())

    def completion_ids(self) -> list[list[int]]:
        """Each completion's token ids, up to and including EOS (what TRL-style rewards get as completion_ids);
        an episode's are all its tokens after the prompt, the environment's included."""
        ids = self.tokens.tolist()
        return [
            ids[o + p : o + n]
            for o, p, n in zip(self.offsets.tolist(), self.prompt_lengths.tolist(), self.lengths.tolist())
        ]

    def row_of_token(self) -> Tensor:
        """[N] each token's row, on the tokens' device."""
        return torch.repeat_interleave(
            torch.arange(self.rows, device=self.tokens.device), self.lengths.to(self.tokens.device)
        )

    def select_groups(self, groups: list[int]) -> "Rollout":
        """The rollout restricted to whole groups (token fields only; scores are added later)."""
        G = self.group_size
        rows = [g * G + j for g in groups for j in range(G)]
        index = torch.tensor(rows, dtype=torch.long)
        starts, lengths = self.offsets[index], self.lengths[index]
        tokens = torch.repeat_interleave(starts - (lengths.cumsum(0) - lengths), lengths) + torch.arange(
            int(lengths.sum())
        )
        tokens = tokens.to(self.tokens.device)
        per_token: dict[str, Any] = {
            k: None if getattr(self, k) is None else getattr(self, k)[tokens] for k in TOKEN_FIELDS
        }
        per_row: dict[str, Any] = {
            k: None if getattr(self, k) is None else getattr(self, k)[index.to(getattr(self, k).device)]
            for k in ROW_FIELDS
        }
        return Rollout(
            prompts=[self.prompts[g] for g in groups],
            group_size=G,
            tokens=self.tokens[tokens],
            pad_token_id=self.pad_token_id,
            version=self.version,
            completions=[self.completions[i] for i in rows],
            episodes=None if self.episodes is None else [self.episodes[i] for i in rows],
            **per_token,
            **per_row,
        )


def concat_rollouts(rolls: list[Rollout]) -> Rollout:
    """Rollouts of the same group size joined, row after row (no re-padding: rows are flat)."""
    if len(rolls) == 1:
        return rolls[0]

    def joined(name: str):
        parts = [getattr(r, name) for r in rolls]
        if name == "weight" and any(
            p is not None for p in parts
        ):  # a weight only some parts have: theirs are real rows
            parts = [torch.ones(r.rows, device=r.tokens.device) if p is None else p for r, p in zip(rolls, parts)]
        return torch.cat(parts) if all(p is not None for p in parts) else None

    episodes = [e for r in rolls for e in (r.episodes or [])] if all(r.episodes is not None for r in rolls) else None
    versions = {r.version for r in rolls}
    return Rollout(
        prompts=[p for r in rolls for p in r.prompts],
        group_size=rolls[0].group_size,
        episodes=episodes,
        version=versions.pop() if len(versions) == 1 else None,
        tokens=torch.cat([r.tokens for r in rolls]),
        completions=[c for r in rolls for c in r.completions],
        pad_token_id=rolls[0].pad_token_id,
        **{k: joined(k) for k in TOKEN_FIELDS + ROW_FIELDS},
    )


def group_seed(*parts: int | str) -> int:
    """A 63-bit seed from its parts (run seed, step, prompt index, ...), stable across processes."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)
