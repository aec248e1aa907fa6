"""The one packer: how a step's rows become micro-batches, and how each micro-batch's rows lie in the
forward. `pack` runs once per step (step.py), and the memory planner (memory.py) asks it the same
question about the worst case, so the tokens the planner counts are the tokens the step computes.

Micro-batches: `batch_rows` consecutive rows each; or, with a token budget, as few micro-batches as keep
the positions each one's forward computes (its tokens with their padding or filler) within it (a row
longer than the budget goes alone), the same number on every rank (the largest any rank needs), rows
spread so the micro-batches hold about equal tokens (longest first, each to the lightest). So no
micro-batch computes more than `largest_micro_batch` positions, which is what the planner counts. The
loss is the whole batch's either way: every normaliser is global (docs/math.md, "Aggregation").

How it works in detail: docs/internals.md, grpo_cli/models/packer.py.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

import torch
from torch import Tensor

from grpo_cli.models.distributed import SINGLE, Dist

LAYOUTS = ("padded", "bins", "one_bin", "shared")
# Bins grow past the longest row only from this length (fill_bins): shorter rows' forwards cost their calls more
# than their positions (the default task's 10-token rows: no faster in longer bins, and the search cost 5% a step).
GROW_FROM = 64


@dataclass(frozen=True)
class MicroBatch:
    rows: Tensor  # [b] the step's rows in it, ascending
    bins: tuple[tuple[int, ...], ...] | None  # "bins"/"one_bin": each bin's rows (positions in `rows`), in order
    capacity: int  # positions per bin, or per padded row
    by_block: bool = False  # one bin, attended block by block (segments.py), not under a mask

    @property
    def positions(self) -> int:
        """The positions the forward computes: tokens, padding and filler."""
        return (len(self.bins) if self.bins is not None else len(self.rows)) * self.capacity


def pack(
    lengths: list[int],
    *,
    layout: str = "padded",
    token_budget: int = 0,
    batch_rows: int = 1,
    padded_length: int | None = None,
    dist: Dist = SINGLE,
    pair_cost: float = 0.0,
    by_block: bool = False,
) -> list[MicroBatch]:
    """The step's micro-batches of rows with these token `lengths` (see the module docstring);
    `padded_length` is a padded row's (the longest prompt plus the longest completion; default the longest row);
    `pair_cost` lets bins grow past the longest row where that costs less (fill_bins); `by_block` (the model can
    attend block by block) lays "bins" and "shared" micro-batches whose longest row has GROW_FROM tokens as one
    bin attended row by row."""
    if layout not in LAYOUTS:
        raise ValueError(f"Unknown layout {layout!r}; expected one of {', '.join(LAYOUTS)}.")
    padded = padded_length if padded_length is not None else max(lengths, default=1)

    def micro_batch(rows: list[int]) -> MicroBatch:  # "shared" is assigned rows as "bins" (shared_inputs lays them)
        if layout == "padded":
            return MicroBatch(torch.tensor(rows, dtype=torch.long), None, padded)
        sizes = [lengths[i] for i in rows]
        if by_block and layout != "one_bin" and max(sizes) >= GROW_FROM:  # no filler, no attention across rows
            return MicroBatch(torch.tensor(rows, dtype=torch.long), *fill_bins(sizes, one_bin=True), by_block=True)
        bins, capacity = fill_bins(sizes, one_bin=layout == "one_bin", pair_cost=pair_cost)
        return MicroBatch(torch.tensor(rows, dtype=torch.long), bins, capacity)

    if not token_budget:
        return [
            micro_batch(list(range(s, min(s + batch_rows, len(lengths))))) for s in range(0, len(lengths), batch_rows)
        ]
    return [
        micro_batch(rows)
        for rows in split_by_tokens(lengths, token_budget, lambda rows: micro_batch(rows).positions, dist)
    ]


def largest_micro_batch(row_len: int, *, token_budget: int = 0, batch_rows: int = 1) -> int:
    """The most positions `pack` gives one micro-batch when no row (padded or not) is longer than `row_len`:
    the budget, or one longer row alone; without a budget, `batch_rows` rows at full length. The memory
    planner counts this (memory.py)."""
    return max(token_budget, row_len) if token_budget else batch_rows * row_len


def split_by_tokens(lengths: list[int], budget: int, cost, dist: Dist = SINGLE) -> list[list[int]]:
    """Rows into as few parts as keep each one's `cost(rows)` (the positions it computes) within `budget`,
    spread evenly by tokens, the count agreed on by every rank (each holds as many rows, topped up, so any
    count up to that fits everywhere)."""
    B = len(lengths)

    def spread(k: int) -> list[list[int]]:
        parts: list[list[int]] = [[] for _ in range(k)]
        loads = [(0, j) for j in range(k)]  # loads: a heap of (tokens, part)
        for i in sorted(range(B), key=lambda i: (-lengths[i], i)):
            load, j = heapq.heappop(loads)
            parts[j].append(i)
            heapq.heappush(loads, (load + lengths[i], j))
        return parts

    def fits(parts) -> bool:
        return all(len(p) < 2 or cost(sorted(p)) <= budget for p in parts)

    k = min(max(1, math.ceil(sum(lengths) / budget)), B)
    while k < B and not fits(spread(k)):
        k += 1
    k = min(int(dist.all_max(float(k))), B)
    return [sorted(p) for p in spread(k) if p]


def fill_bins(
    lengths: list[int], one_bin: bool = False, pair_cost: float = 0.0
) -> tuple[tuple[tuple[int, ...], ...], int]:
    """First-fit decreasing of rows into bins as long as the longest row (or one bin of them all): (each bin's
    rows in the order they lie, the capacity). With `pair_cost` (a position pair's attention against a
    token's weights, as share_units), longer bins are tried too, up to one bin of them all, and the one
    whose positions and attention cost least is kept, never with more positions than the longest row's
    bins: rows of uneven length leave less filler in fewer, longer bins, which costs more attention. Not
    for rows shorter than GROW_FROM tokens."""
    if one_bin:
        return _first_fit(lengths, max(sum(lengths), 1))
    longest = max(max(lengths, default=1), 1)
    best = _first_fit(lengths, longest)
    if pair_cost <= 0 or longest < GROW_FROM:
        return best
    cost = lambda laid: len(laid[0]) * laid[1] * (1 + pair_cost * laid[1])  # noqa: E731  positions + pairs
    total, capacity = sum(lengths), longest
    while capacity < total:  # a quarter longer each time, while a bin that long could still cost less
        capacity = min(math.ceil(capacity * 1.25), total)
        if total * (1 + pair_cost * capacity) >= cost(best):  # the least any layout in such bins costs
            break
        laid = _first_fit(lengths, capacity)
        if cost(laid) < cost(best) and len(laid[0]) * capacity <= len(best[0]) * best[1]:
            best = laid
    return best


def _first_fit(lengths: list[int], capacity: int) -> tuple[tuple[tuple[int, ...], ...], int]:
    bins: list[list[int]] = []
    fill: list[int] = []
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        b = next((b for b, f in enumerate(fill) if f + lengths[i] <= capacity), len(fill))
        if b == len(fill):
            bins.append([])
            fill.append(0)
        bins[b].append(i)
        fill[b] += lengths[i]
    return tuple(tuple(b) for b in bins), capacity


@dataclass(frozen=True)
class Packed:
    """A micro-batch's rows laid end to end in bins, as tensors for the forward (logprobs.py)."""

    input_ids: Tensor  # [bins, capacity]
    position_ids: Tensor  # [bins, capacity]: each row's from 0; filler restarts too, so it is a sequence of its own
    states: Tensor  # [K] flat index (into bins * capacity) of the state that predicts each scored token
    targets: Tensor  # [K] the token ids scored
    index: Tensor  # [K] where each scored token lies in the rollout's flat tokens
    real_tokens: int  # tokens in the bins that are not filler
    # What each bin's positions attend, block by block (segments.py): (start, end, prefix start, prefix end)
    blocks: tuple[tuple[tuple[int, int, int, int], ...], ...] | None = None
    tree: tuple[Tensor, Tensor] | None = None  # "shared": each position's unit and branch [bins, capacity] (tree_mask)

    @property
    def mask(self) -> Tensor | None:
        """ "shared": [bins, 1, capacity, capacity], True where a position may attend; built when asked (an
        attention that goes block by block never needs it)."""
        return None if self.tree is None else tree_mask(*self.tree)


def ranks(sizes: Tensor) -> Tensor:
    """Each token's place in its run, for runs of these `sizes` laid end to end: [sum(sizes)]."""
    return torch.arange(int(sizes.sum())) - torch.repeat_interleave(sizes.cumsum(0) - sizes, sizes)


def packed_inputs(
    tokens: Tensor, offsets: list[int], lengths: list[int], prompt_lengths: list[int], mb: MicroBatch, fill_id: int = 0
) -> Packed:
    """The micro-batch's rows (`tokens` [N] flat, each row at its offset) laid in its bins, position ids
    restarting at 0 for every row, and where the state predicting each completion token lands (a row's
    first token has none: it is not scored)."""
    device, capacity = tokens.device, mb.capacity
    rows = mb.rows.tolist()
    start, fill, blocks = [0] * len(rows), [], []
    assert mb.bins is not None  # packed micro-batches have bins
    for b, members in enumerate(mb.bins):
        used, in_bin = 0, []
        for i in members:
            in_bin.append((used, used + lengths[rows[i]], 0, 0))  # a row: causal over itself
            start[i], used = b * capacity + used, used + lengths[rows[i]]
        fill.append(used)
        blocks.append(tuple(in_bin))
    n_bins = len(mb.bins)
    # Filler counts from 0 after each bin's rows: a sequence of its own, attended by nothing real.
    positions = (torch.arange(capacity).repeat(n_bins, 1) - torch.tensor(fill)[:, None]).flatten().clamp(min=0)
    row_len = torch.tensor([lengths[r] for r in rows])
    local = torch.repeat_interleave(torch.arange(len(rows)), row_len)  # each token's row in the micro-batch
    rank = ranks(row_len)
    dest = torch.tensor(start)[local] + rank  # each token's flat place in the bins
    source = torch.tensor([offsets[r] for r in rows])[local] + rank  # and in `tokens`
    ids = torch.full((n_bins * capacity,), fill_id, dtype=tokens.dtype, device=device)
    ids[dest.to(device)] = tokens[source.to(device)]
    positions[dest] = rank
    # Scored: every token after its row's prompt, row by row (a row's first token has no state before it).
    scored = (rank >= torch.tensor([prompt_lengths[r] for r in rows])[local]) & (rank >= 1)
    index = source[scored].to(device)
    return Packed(
        input_ids=ids.view(n_bins, capacity),
        position_ids=positions.view(n_bins, capacity).to(device),
        states=(dest[scored] - 1).to(device),
        targets=tokens[index],
        index=index,
        real_tokens=int(row_len.sum()),
        blocks=tuple(blocks) if mb.by_block else None,
    )


def share_units(
    rows: list[int], lengths: list[int], prompt_lengths: list[int], prompts: list[tuple], pair_cost: float = 0.0
) -> list[list[int]]:
    """Rows (positions in `rows`) grouped into units that lay their prompt once. A row joins the last unit of its
    prompt while that costs less than laying it alone: a unit's masked attention grows with its length squared
    (`pair_cost`: a position pair's attention against a token's weights, about 1 / (6 x hidden size)), so a
    long unit stops paying for the prompt it saves. pair_cost 0 puts all rows of a prompt in one unit."""
    open_unit: dict[tuple, int] = {}
    units: list[list[int]] = []
    size: list[int] = []
    for i, r in enumerate(rows):
        n, m = prompt_lengths[r], lengths[r] - prompt_lengths[r]
        u = open_unit.get(prompts[i]) if n else None  # a row without a prompt token has nothing to share
        if u is not None and pair_cost * (2 * size[u] * m + m * m) <= n + pair_cost * (n + m) ** 2:
            units[u].append(i)
            size[u] += m
            continue
        open_unit[prompts[i]] = len(units)
        units.append([i])
        size.append(n + m)
    return units


def unit_segments(bins, capacity: int, members, rows, offsets, lengths, prompt_lengths) -> list[tuple]:
    """Segments, in the order they lie: each unit's prompt, then each member's completion, as (flat start, start
    in the rollout's tokens, length, first position, branch, unit, the prompt's last state or -1)."""
    segments = []
    for b, in_bin in enumerate(bins):
        at = b * capacity
        for u in in_bin:
            first = rows[members[u][0]]
            n = prompt_lengths[first]
            segments.append((at, offsets[first], n, 0, 0, u, -1))
            last_prompt, at = at + n - 1 if n else -1, at + n
            for i in members[u]:
                m = lengths[rows[i]] - n
                segments.append((at, offsets[rows[i]] + n, m, n, i + 1, u, last_prompt))
                at += m
    return segments


def shared_inputs(
    tokens: Tensor,
    offsets: list[int],
    lengths: list[int],
    prompt_lengths: list[int],
    mb: MicroBatch,
    fill_id: int = 0,
    pair_cost: float = 0.0,
) -> Packed:
    """The micro-batch's rows laid with each distinct prompt once: a unit is a prompt followed by the completion
    of its rows (share_units), units fill bins first-fit decreasing, each completion's position ids continue
    from its prompt's, and the mask lets a token see the earlier tokens of its own unit that are its prompt or
    its own completion. A completion's first token is predicted by the prompt's last state. Where no row shares
    its prompt, the micro-batch's bins as packed_inputs lays them. A micro-batch attended block by block
    (`mb.by_block`) lays every unit in one bin, and a row joins its prompt's unit whatever its length: its
    attention then costs its own pairs only, however long the unit or bin."""
    host = tokens.cpu()
    rows = mb.rows.tolist()
    prompts = [tuple(host[offsets[r] : offsets[r] + prompt_lengths[r]].tolist()) for r in rows]
    pair_cost = 0.0 if mb.by_block else pair_cost
    members = share_units(rows, lengths, prompt_lengths, prompts, pair_cost)
    if len(members) == len(rows):  # no prompt is shared here: the plain layout, without a mask
        return packed_inputs(tokens, offsets, lengths, prompt_lengths, mb, fill_id)
    size = [prompt_lengths[rows[m[0]]] + sum(lengths[rows[i]] - prompt_lengths[rows[i]] for i in m) for m in members]
    bins, capacity = fill_bins(size, one_bin=mb.by_block, pair_cost=pair_cost)
    n_bins = len(bins)
    flat = n_bins * capacity
    segments = unit_segments(bins, capacity, members, rows, offsets, lengths, prompt_lengths)
    seg = torch.tensor(segments, dtype=torch.long)
    size_of = seg[:, 2]
    each = lambda column: torch.repeat_interleave(seg[:, column], size_of)  # noqa: E731  a segment's value per token
    rank = ranks(size_of)
    dest, source, branch = each(0) + rank, each(1) + rank, each(4)
    ids = torch.full((flat,), fill_id, dtype=tokens.dtype, device=tokens.device)
    ids[dest.to(tokens.device)] = tokens[source.to(tokens.device)]
    pos = torch.zeros(flat, dtype=torch.long)
    pos[dest] = each(3) + rank
    tree_branch = torch.zeros(flat, dtype=torch.long)
    tree_branch[dest] = branch
    tree_unit = -1 - torch.arange(flat)  # filler: each position a unit of its own, seeing itself only
    tree_unit[dest] = each(5)
    # Scored: every completion token but a prompt-less row's first (no state precedes it); a completion's
    # first token is predicted by its prompt's last state, every other by the state before it.
    last_prompt = each(6)
    scored = (branch > 0) & ((rank > 0) | (last_prompt >= 0))
    states = torch.where(rank == 0, last_prompt, dest - 1)[scored]
    device = tokens.device
    index = source[scored].to(device)
    return Packed(
        input_ids=ids.view(n_bins, capacity),
        position_ids=pos.view(n_bins, capacity).to(device),
        states=states.to(device),
        targets=tokens[index],
        index=index,
        real_tokens=int(dest.numel()),
        blocks=_blocks(segments, n_bins, capacity) if mb.by_block else None,
        tree=(tree_unit.view(n_bins, capacity).to(device), tree_branch.view(n_bins, capacity).to(device)),
    )


def _blocks(segments: list[tuple], n_bins: int, capacity: int) -> tuple:
    """shared_inputs' segments as each bin's attention blocks (segments.py): a prompt causal over itself, a
    completion seeing its unit's prompt (the segment that ends at its prompt's last state) and itself."""
    blocks: list[list[tuple]] = [[] for _ in range(n_bins)]
    prompt = (0, 0)
    for at, _source, length, _first, branch, _unit, _last in segments:
        b, local = divmod(at, capacity)
        if branch == 0:
            prompt = (local, local + length)
        if length:
            blocks[b].append((local, local + length) + ((0, 0) if branch == 0 else prompt))
    return tuple(tuple(in_bin) for in_bin in blocks)


def tree_mask(unit: Tensor, branch: Tensor) -> Tensor:
    """[bins, 1, L, L] from each position's unit and branch ([bins, L]; branch 0 = the unit's prompt): position i
    sees j <= i of its own unit where j is prompt or on i's own branch."""
    same_unit = unit[:, :, None] == unit[:, None, :]
    causal = torch.ones(unit.shape[1], unit.shape[1], dtype=torch.bool).tril()
    visible = (branch[:, None, :] == 0) | (branch[:, :, None] == branch[:, None, :])
    return (same_unit & causal & visible)[:, None]
