"""The Rollout: the batch of trajectories that travels from the rollout source to the step. Each
trajectory is one flat token sequence, its prompt followed by everything after it (the model's tokens
and, in an episode, the environment's), with no padding; per token it carries whether the model sampled
it (the loss mask) and the log-probs its sampler or behaviour policy gave it. Rows lie end to end in one
tensor, so joining rollouts or picking groups never re-pads, multi-turn is no special case, and the step's
packer (packer.py) lays the rows into micro-batches once. The padded `[rows, P+T]` view (`padded()`), left-
padded prompts and right-padded completions, is built on demand for the padded forward and for callers
that want rectangles.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Optional

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
    # the policy trained on it (rollout_worker.py: computed there, in the training precision)
    version: Optional[int] = None  # the pushed weights' version (updates applied) that sampled it; None = the policy itself
    answers: Optional[list] = None  # [n] each group's reference answer, once scored
    episodes: Optional[list] = None  # [n*G] multi-turn: each row's episodes.Episode (messages, counts); None = one turn
    extra: dict = field(default_factory=dict)  # per-term rewards ("reward_terms": {name: [n, G]}) for logging

    @classmethod
    def from_padded(cls, prompts: list[str], group_size: int, input_ids: Tensor, attention_mask: Tensor,
                    completion_mask: Tensor, truncated: Tensor, sampler_logp: Tensor | None = None,
                    **rest) -> "Rollout":
        """From padded rows: `input_ids`/`attention_mask` [B, P+T] (real tokens contiguous in each row: a
        left-padded prompt, then T completion columns right-padded), `completion_mask` and `sampler_logp`
        [B, T] over the completion columns."""
        T = completion_mask.shape[1]
        real = attention_mask.bool()
        after = real[:, -T:]  # [B, T] the tokens after each prompt
        lengths = real.sum(1).cpu()
        prompt_lengths = lengths - after.sum(1).cpu()

        def flat(completion_values: Tensor) -> Tensor:  # [B, T] on the completion columns -> [N], 0 on the prompt
            full = torch.zeros(real.shape, dtype=completion_values.dtype, device=completion_values.device)
            full[:, -T:] = completion_values
            return full[real]

        return cls(prompts=list(prompts), group_size=group_size, tokens=input_ids[real], lengths=lengths,
                   prompt_lengths=prompt_lengths, loss_mask=flat(completion_mask.long() * after),
                   truncated=truncated, sampler_logp=None if sampler_logp is None else flat(sampler_logp), **rest)

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
        return [ids[o + p : o + n] for o, p, n in zip(self.offsets.tolist(), self.prompt_lengths.tolist(),
                                                      self.lengths.tolist())]

    def completion_index(self) -> tuple[Tensor, Tensor]:
        """([rows, T] the flat index of each completion column's token, [rows, T] whether it has one), on
        the tokens' device: how per-token values go to and from the padded completion columns."""
        T, device = self.completion_len, self.tokens.device
        cols = torch.arange(T)[None, :]
        valid = cols < self.completion_lengths[:, None]
        index = (self.offsets + self.prompt_lengths)[:, None] + cols
        return index.where(valid, 0).to(device), valid.to(device)

    def completion_grid(self, values: Tensor) -> Tensor:
        """Per-token `values` [N] on the padded completion columns: [rows, T], 0 where a row has no token."""
        index, valid = self.completion_index()
        return torch.where(valid, values[index], torch.zeros((), dtype=values.dtype, device=values.device))

    def from_grid(self, grid: Tensor) -> Tensor:
        """Values on the completion columns [rows, T] as per-token values [N] (0 on the prompt)."""
        index, valid = self.completion_index()
        out = torch.zeros(self.tokens.shape, dtype=grid.dtype, device=grid.device)
        out[index[valid]] = grid[valid]
        return out

    def padded(self) -> tuple[Tensor, Tensor]:
        """The padded view: (input_ids, attention_mask) [rows, P+T], prompts left-padded to the longest P and
        completions right-padded to T (`completion_mask` is the loss mask on those T columns)."""
        P, T, device = int(self.prompt_lengths.max()), self.completion_len, self.tokens.device
        row = torch.repeat_interleave(torch.arange(self.rows), self.lengths)
        col = torch.arange(self.tokens.shape[0]) - self.offsets[row] + (P - self.prompt_lengths)[row]
        row, col = row.to(device), col.to(device)
        input_ids = torch.full((self.rows, P + T), self.pad_token_id, dtype=self.tokens.dtype, device=device)
        input_ids[row, col] = self.tokens
        attention_mask = torch.zeros((self.rows, P + T), dtype=torch.long, device=device)
        attention_mask[row, col] = 1
        return input_ids, attention_mask

    @property
    def input_ids(self) -> Tensor:
        return self.padded()[0]

    @property
    def attention_mask(self) -> Tensor:
        return self.padded()[1]

    @property
    def completion_mask(self) -> Tensor:
        return self.completion_grid(self.loss_mask).long()

    def select_groups(self, groups: list[int]) -> "Rollout":
        """The rollout restricted to whole groups (token fields only; scores are added later)."""
        G = self.group_size
        rows = [g * G + j for g in groups for j in range(G)]
        index = torch.tensor(rows, dtype=torch.long)
        starts, lengths = self.offsets[index], self.lengths[index]
        tokens = torch.repeat_interleave(starts - (lengths.cumsum(0) - lengths), lengths) + torch.arange(int(lengths.sum()))
        tokens = tokens.to(self.tokens.device)
        per_token = {k: None if getattr(self, k) is None else getattr(self, k)[tokens] for k in TOKEN_FIELDS}
        per_row = {k: None if getattr(self, k) is None else getattr(self, k)[index.to(getattr(self, k).device)]
                   for k in ROW_FIELDS}
        return Rollout(prompts=[self.prompts[g] for g in groups], group_size=G, tokens=self.tokens[tokens],
                       pad_token_id=self.pad_token_id, version=self.version, completions=[self.completions[i] for i in rows],
                       episodes=None if self.episodes is None else [self.episodes[i] for i in rows],
                       **per_token, **per_row)


def concat_rollouts(rolls: list[Rollout]) -> Rollout:
    """Rollouts of the same group size joined, row after row (no re-padding: rows are flat)."""
    if len(rolls) == 1:
        return rolls[0]

    def joined(name: str):
        parts = [getattr(r, name) for r in rolls]
        if name == "weight" and any(p is not None for p in parts):  # a weight only some parts have: theirs are real rows
            parts = [torch.ones(r.rows, device=r.tokens.device) if p is None else p for r, p in zip(rolls, parts)]
        return torch.cat(parts) if all(p is not None for p in parts) else None

    episodes = [e for r in rolls for e in r.episodes] if all(r.episodes is not None for r in rolls) else None
    versions = {r.version for r in rolls}
    return Rollout(prompts=[p for r in rolls for p in r.prompts], group_size=rolls[0].group_size, episodes=episodes,
                   version=versions.pop() if len(versions) == 1 else None, tokens=torch.cat([r.tokens for r in rolls]),
                   completions=[c for r in rolls for c in r.completions], pad_token_id=rolls[0].pad_token_id,
                   **{k: joined(k) for k in TOKEN_FIELDS + ROW_FIELDS})


@dataclass(frozen=True)
class Sampling:
    """How a generator samples (the sampler config's values)."""

    max_new_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    greedy: bool = False


def completion_mask(completion_ids: Tensor, eos_ids: list[int]) -> tuple[Tensor, Tensor]:
    """Mask of tokens up to and including the first EOS, and whether each row never reached one."""
    is_eos = torch.isin(completion_ids, torch.tensor(eos_ids, device=completion_ids.device))  # [B, T]
    has_eos = is_eos.any(dim=1)
    T = completion_ids.shape[1]
    first = torch.where(has_eos, is_eos.int().argmax(dim=1), torch.full_like(has_eos, T, dtype=torch.long))
    mask = torch.arange(T, device=completion_ids.device)[None, :] <= first[:, None]
    return mask.long(), ~has_eos


def group_seed(*parts: int | str) -> int:
    """A 63-bit seed from its parts (run seed, step, prompt index, ...), stable across processes."""
    digest = hashlib.blake2b("/".join(map(str, parts)).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & (2**63 - 1)
