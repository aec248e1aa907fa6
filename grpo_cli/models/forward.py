"""The forward of a flat rollout: the step's micro-batches laid as the model takes them best (packer.py), and
each token's log-probability under a model, as the update, the reference, the old policy and a behaviour policy
score it."""

from __future__ import annotations

from functools import partial

import torch
from torch import Tensor

from grpo_cli.models.distributed import SINGLE, Dist
from grpo_cli.models.logprobs import (LogProbRequest, attends_by_block, can_pack, can_share_prompts, lm_config, one_bin,
                                     packed_logprobs, padded_logprobs)
from grpo_cli.models.packer import pack, packed_inputs, shared_inputs
from grpo_cli.models.precision import Precision
from grpo_cli.sample.rollout import Rollout
from grpo_cli.sample.settings import StepSettings


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
    micro-batches, each one's forward inputs (packed bins, or the padded view's rows), and where each
    micro-batch's completion columns lie among the rollout's per-token values."""

    def __init__(self, roll: Rollout, settings: StepSettings, dist: Dist = SINGLE, layout: str = "padded",
                 pair_cost: float = 0.0, by_block: bool = False):
        self.roll, self.T = roll, roll.completion_len
        lengths = roll.lengths.tolist()
        self.parts = pack(lengths, layout=layout, token_budget=settings.max_tokens,
                          batch_rows=settings.micro_batch_size, dist=dist, pair_cost=pair_cost, by_block=by_block,
                          padded_length=int(roll.prompt_lengths.max()) + self.T if roll.rows else 1)
        self.index, self.valid = roll.completion_index()  # [B, T]
        self.padded = roll.padded() if layout == "padded" else None
        offsets, prompts = roll.offsets.tolist(), roll.prompt_lengths.tolist()
        lay = {"padded": lambda *a: None, "shared": partial(shared_inputs, pair_cost=pair_cost)}.get(layout, packed_inputs)
        self.packed = [lay(roll.tokens, offsets, lengths, prompts, self.T, mb) for mb in self.parts]

    @classmethod
    def for_model(cls, roll: Rollout, settings: StepSettings, model, dist: Dist = SINGLE) -> "StepBatch":
        """Laid out as `model`'s forward takes it best (forward_layout, pair_cost, logprobs.attends_by_block)."""
        return cls(roll, settings, dist, forward_layout(model, settings), pair_cost(model), attends_by_block(model))

    def grid(self, values: Tensor, rows: Tensor | None = None) -> Tensor:
        """Per-token `values` [N] on the completion columns of `rows` (default all): [b, T], 0 where none."""
        index, valid = (self.index, self.valid) if rows is None else (self.index[rows], self.valid[rows])
        return torch.where(valid, values[index], torch.zeros((), dtype=values.dtype, device=values.device))

    def logprobs(self, model, i: int, request: LogProbRequest) -> tuple[Tensor, Tensor | None]:
        """Micro-batch i's token log-probs (and entropy) under `model`: [b, T] each."""
        packed = self.packed[i]
        if packed is not None and can_pack(model) and (packed.tree is None or can_share_prompts(model)):
            return packed_logprobs(model, packed, request)
        if self.padded is None:  # a model that cannot take packed rows (the policy could): scored padded
            self.padded = self.roll.padded()
        rows = self.parts[i].rows.to(self.padded[0].device)
        return padded_logprobs(model, self.padded[0][rows], self.padded[1][rows], request)


def score_tokens(model, batch: StepBatch, temperature: float, precision: Precision) -> Tensor:
    """Each token's log-probability under `model`, without gradients: [N], 0 on prompt tokens."""
    roll = batch.roll
    out = torch.zeros(roll.tokens.shape, device=roll.tokens.device)
    request = LogProbRequest(batch.T, temperature)
    with torch.no_grad(), precision.autocast():
        for i, mb in enumerate(batch.parts):
            rows = mb.rows.to(out.device)
            logp = batch.logprobs(model, i, request)[0].float()
            valid = batch.valid[rows]
            out[batch.index[rows][valid]] = logp[valid]
    return out


def score(model, roll: Rollout, temperature: float, settings: StepSettings, precision: Precision,
          dist: Dist = SINGLE) -> Tensor:
    """Each token's log-probability under `model`, without gradients: [N] (0 on prompt tokens), in
    micro-batches as the step would form them."""
    return score_tokens(model, StepBatch.for_model(roll, settings, model, dist), temperature, precision)
