"""Keys and values kept between an episode's turns, so a turn prefills only what the environment added.

An episode's next context is its last context, the tokens it sampled, and the environment's reply, spliced
as ids (episodes/driver.py): the tokens already decoded are an exact prefix of it. Within one `generate` (the
weights do not change in it), `HFGenerator.session()` keeps each decoded row's keys and values, keyed by
the tokens they hold, and the next turn's prefill (`prefill_after`) starts every row from the longest kept
prefix of its context: only the rest runs through the model.

How it works in detail: docs/internals.md, grpo_cli/generate/turn_cache.py.
"""

from __future__ import annotations

import torch
from torch import Tensor

from grpo_cli.generate.steps import distinct_rows, left_pad

KV = list[tuple[Tensor, Tensor]]  # per layer: keys and values of one row, [kv heads, tokens, head dim]


class TurnCache:
    """The kept rows of one generator session (module docstring)."""

    def __init__(self):
        self.entries: dict[tuple[int, ...], KV] = {}
        self.keep = False  # keep the rows a lookup does not match: their episodes' next turns come in later calls
        self.reused: list[int] = []
        self.computed: list[int] = []

    def lookup(self, contexts: list[list[int]]) -> list[tuple[int, KV] | None]:
        """Each context's longest kept prefix, shorter than the context (its last token must be fed to get
        the next logits): (tokens reused, their keys and values), or None. The entries are handed over."""
        found = []
        for context in contexts:
            best = None
            for key, kv in self.entries.items():
                n = len(key)
                if n < len(context) and (best is None or n > best[0]) and tuple(context[:n]) == key:
                    best = (n, kv)
            found.append(best)
        taken = {tuple(c[: f[0]]) for c, f in zip(contexts, found) if f}
        self.entries = {k: v for k, v in self.entries.items() if k not in taken} if self.keep else {}
        self.reused = [f[0] if f else 0 for f in found]
        self.computed = [len(c) - r for c, r in zip(contexts, self.reused)]
        return found

    def take_counts(self) -> list[int] | None:
        """The last lookup's tokens reused per row, once (None when no lookup ran since: a generator that
        does not use the session)."""
        counts, self.reused = self.reused, []
        return counts or None

    def store(self, context: list[int], generated: list[int], kv: KV) -> None:
        self.entries[tuple(context) + tuple(generated)] = kv


def kept_length(tokens: Tensor, fed: int, eos: Tensor) -> int:
    """How many of a row's sampled `tokens` to keep: all but its last (its EOS, or the last before the cap),
    whose keys exist whatever the batch around it (`fed` were written). Keeping the last too where it was fed
    would make the count depend on when the batch stopped, i.e. on the other rows and the ranks' split."""
    hits = torch.isin(tokens[: fed + 1], eos).nonzero()
    return int(hits[0]) if len(hits) else fed


def row_kv(layers, row_mask: Tensor, row: int, n: int) -> KV:
    """Row `row`'s keys and values at its first `n` attended positions (`row_mask`, the positions it holds)."""
    positions = row_mask.nonzero().squeeze(-1)[:n]
    if n and int(positions[-1]) - int(positions[0]) == n - 1:  # no holes (a first turn's left padding): one slice
        start = int(positions[0])
        return [
            (layer.keys[row, :, start : start + n].clone(), layer.values[row, :, start : start + n].clone())
            for layer in layers
        ]
    return [(layer.keys[row][:, positions].clone(), layer.values[row][:, positions].clone()) for layer in layers]


def prefill_after(model, contexts: list[list[int]], found: list[tuple[int, KV] | None], pad_id: int, kwarg: str):
    """The prefill of `contexts`, each row's kept prefix taken from `found` and only the rest run through the
    model: (cache, [rows, vocab] next logits, [rows, width] attention mask, [rows] next position), as
    generation.prefill returns. Identical contexts (a group's samples that made the same call and got the same
    reply) run once, their rows copied after, as a group's first turn does (generation.prefill)."""
    from transformers import DynamicCache

    firsts, rows_of = distinct_rows(contexts)
    if len(firsts) < len(contexts):
        cache, logits, mask, position = prefill_after(
            model, [contexts[i] for i in firsts], [found[i] for i in firsts], pad_id, kwarg
        )
        index = torch.tensor(rows_of, device=logits.device)
        cache.batch_select_indices(index)
        return cache, logits[index], mask[index], position[index]
    device = next(model.parameters()).device
    kept = [f[0] if f else 0 for f in found]
    sample = next(f[1] for f in found if f)
    width = max(kept)
    cache = DynamicCache()
    for layer, (k0, v0) in enumerate(sample):
        keys = k0.new_zeros(len(contexts), k0.shape[0], width, k0.shape[-1])
        values = v0.new_zeros(len(contexts), v0.shape[0], width, v0.shape[-1])
        for i, f in enumerate(found):
            if f:
                keys[i, :, width - f[0] :], values[i, :, width - f[0] :] = f[1][layer]
        cache.update(keys, values, layer)
    kept_mask = torch.zeros(len(contexts), width, dtype=torch.long, device=device)
    for i, n in enumerate(kept):
        kept_mask[i, width - n :] = 1
    ids, new_mask = left_pad([c[n:] for c, n in zip(contexts, kept)], pad_id, device)
    positions = (new_mask.cumsum(-1) - 1).clamp(min=0) + torch.tensor(kept, device=device)[:, None]
    mask = torch.cat([kept_mask, new_mask], dim=1)
    out = model(
        input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True, logits_to_keep=1, **{kwarg: cache}
    )
    return getattr(out, kwarg), out.logits[:, -1], mask, positions[:, -1] + 1


def count_prefill(episodes, contexts: list[list[int]], turns: TurnCache | None, turn: int) -> None:
    """Each episode's share of the turn's prefill: the tokens run through the model (a context several
    episodes share, a group's first turn, runs once: the first of them counts it), those taken from the
    kept cache, and whether a later turn's context broke from the last one's tokens."""
    firsts, counts = set(distinct_rows(contexts)[0]), turns.take_counts() if turns is not None else None
    for i, (ep, context) in enumerate(zip(episodes, contexts)):
        reused = counts[i] if counts else 0
        ep.kv_reused += reused
        ep.prefix_breaks += int(counts is not None and turn > 0 and reused == 0)
        if i in firsts:  # the prefill runs each distinct context once (distinct_rows): its first row counts it
            ep.context_tokens += len(context) - reused
