"""The forward of a flat rollout: the step's micro-batches laid as the model takes them best (packer.py), and
each token's log-probability under a model, as the update, the reference, the old policy and a behaviour policy
score it."""

from __future__ import annotations

from functools import partial
from typing import Callable

import torch
from torch import Tensor

from grpo_cli.models.distributed import SINGLE, Dist
from grpo_cli.models.logprobs import (
    LogProbRequest,
    attends_by_block,
    can_pack,
    can_share_prompts,
    lm_config,
    one_bin,
    packed_logprobs,
    padded_logprobs,
)
from grpo_cli.models.packer import pack, packed_inputs, shared_inputs
from grpo_cli.models.precision import Precision
from grpo_cli.samples.rollout import Rollout
from grpo_cli.samples.settings import StepSettings


def forward_layout(model, settings: StepSettings) -> str:
    """How the step lays rows out for `model`'s forward (packer.py): in bins where packing is on and the
    model can take packed rows (with shared prompts where it takes a tree mask), one padded row each otherwise."""
    if not (settings.packing and can_pack(model)):
        return "padded"
    if settings.shared_prompts and can_share_prompts(model):
        return "shared"
    return "one_bin" if one_bin(model) else "bins"


def pair_cost(model) -> float:
    """A position pair's attention FLOPs against a token's weight FLOPs, about 4d against 24d^2 a layer for
    hidden size d: what sharing a prompt trades (packer.share_units)."""
    return 1.0 / (6 * max(int(getattr(lm_config(model), "hidden_size", 0) or 0), 1))


class StepBatch:
    """A rollout as the step's forwards take it, built once per step and used by every pass: the packer's
    micro-batches and each one's forward inputs (packed bins, or rows of the padded view). Every forward's
    results are flat: one per scored token, with where that token lies among the rollout's tokens."""

    def __init__(
        self,
        roll: Rollout,
        settings: StepSettings,
        dist: Dist = SINGLE,
        layout: str = "padded",
        pair_cost: float = 0.0,
        by_block: bool = False,
    ):
        self.roll, self.T = roll, roll.completion_len
        lengths = roll.lengths.tolist()
        self.parts = pack(
            lengths,
            layout=layout,
            token_budget=settings.max_tokens,
            batch_rows=settings.micro_batch_size,
            dist=dist,
            pair_cost=pair_cost,
            by_block=by_block,
            padded_length=int(roll.prompt_lengths.max()) + self.T if roll.rows else 1,
        )
        self.row_of_token = roll.row_of_token()  # [N] each token's row
        self._padded: tuple[Tensor, Tensor, Tensor, Tensor] | None = (
            None  # the padded view, built for a forward that cannot take packed rows
        )
        offsets, prompts = roll.offsets.tolist(), roll.prompt_lengths.tolist()
        layouts: dict[str, Callable] = {
            "padded": lambda *a: None,
            "shared": partial(shared_inputs, pair_cost=pair_cost),
        }
        lay = layouts.get(layout, packed_inputs)
        self.packed = [lay(roll.tokens, offsets, lengths, prompts, mb) for mb in self.parts]

    @classmethod
    def for_model(cls, roll: Rollout, settings: StepSettings, model, dist: Dist = SINGLE) -> "StepBatch":
        """Laid out as `model`'s forward takes it best (forward_layout, pair_cost, logprobs.attends_by_block)."""
        return cls(roll, settings, dist, forward_layout(model, settings), pair_cost(model), attends_by_block(model))

    def logprobs(self, model, i: int, request: LogProbRequest) -> tuple[Tensor, Tensor | None, Tensor]:
        """Micro-batch i's scored tokens under `model`: (log-probs [K], entropies [K] or None, their places in the
        rollout's tokens [K])."""
        packed = self.packed[i]
        if packed is not None and can_pack(model) and (packed.tree is None or can_share_prompts(model)):
            return (*packed_logprobs(model, packed, request), packed.index)
        if self._padded is None:  # the golden comparison's layout, or a model that cannot take packed rows
            self._padded = padded_view(self.roll)
        ids, mask, index, valid = self._padded
        rows = self.parts[i].rows.to(ids.device)
        logp, entropy = padded_logprobs(model, ids[rows], mask[rows], request)  # [b, T]
        valid = valid[rows]
        return logp[valid], None if entropy is None else entropy[valid], index[rows][valid]


def padded_view(roll: Rollout) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The rollout as padded rows: (input_ids, attention_mask) [rows, P+T], each prompt left-padded to the longest
    P and what follows it right-padded to T, and (index, valid) [rows, T]: where each of the T columns' tokens
    lies in the rollout's tokens, and whether the row has one there."""
    P, T, device = int(roll.prompt_lengths.max()), roll.completion_len, roll.tokens.device
    row = torch.repeat_interleave(torch.arange(roll.rows), roll.lengths)
    col = torch.arange(roll.tokens.shape[0]) - roll.offsets[row] + (P - roll.prompt_lengths)[row]
    row, col = row.to(device), col.to(device)
    input_ids = torch.full((roll.rows, P + T), roll.pad_token_id, dtype=roll.tokens.dtype, device=device)
    input_ids[row, col] = roll.tokens
    attention_mask = torch.zeros((roll.rows, P + T), dtype=torch.long, device=device)
    attention_mask[row, col] = 1
    cols = torch.arange(T)[None, :]
    valid = cols < roll.completion_lengths[:, None]
    index = (roll.offsets + roll.prompt_lengths)[:, None] + cols
    return input_ids, attention_mask, index.where(valid, 0).to(device), valid.to(device)


def score_tokens(model, batch: StepBatch, temperature: float, precision: Precision) -> Tensor:
    """Each token's log-probability under `model`, without gradients: [N], 0 on prompt tokens."""
    roll = batch.roll
    out = torch.zeros(roll.tokens.shape, device=roll.tokens.device)
    request = LogProbRequest(batch.T, temperature)
    with torch.no_grad(), precision.autocast():
        for i in range(len(batch.parts)):
            logp, _, index = batch.logprobs(model, i, request)
            out[index] = logp.float()
    return out


def score(
    model, roll: Rollout, temperature: float, settings: StepSettings, precision: Precision, dist: Dist = SINGLE
) -> Tensor:
    """Each token's log-probability under `model`, without gradients: [N] (0 on prompt tokens), in
    micro-batches as the step would form them."""
    return score_tokens(model, StepBatch.for_model(roll, settings, model, dist), temperature, precision)
