"""Choosing each decode row's next token: the Gumbel-max race over the tempered, truncated logits with each group's
own noise (`Noise`), and the log-prob the token was drawn with (`pick`); with generator.decode=compiled, `pick`
fused by torch.compile (`picker`)."""

from __future__ import annotations

import torch
from torch import Tensor

from grpo_cli.generate.steps import compile_failed, compile_once
from grpo_cli.models.memory import noise_steps_ahead

NEG_INF = float("-inf")


def _filter(scores: Tensor, top_k: int, top_p: float) -> Tensor:
    """Logits outside the top-k, or outside the smallest set holding top_p of the mass, set to -inf."""
    if top_k and top_k < scores.shape[-1]:
        kth = scores.topk(top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, NEG_INF)
    if top_p < 1.0:
        sorted_scores, order = scores.sort(dim=-1, descending=True)
        probs = sorted_scores.softmax(-1)
        drop_sorted = probs.cumsum(-1) - probs >= top_p  # the mass before a token already reaches top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)  # the top token is always kept
        scores = scores.masked_fill(drop, NEG_INF)
    return scores


class Noise:
    """Per-row noise for the exponential race, drawn from each group's own generator: a group's draws
    depend on its seed only. argmax(logit - log E) with E ~ Exp(1) is an exact sample from
    softmax(logit) (the Gumbel-max trick: -log E is Gumbel noise).

    Each group draws `ahead` steps of noise at once ([ahead, G, vocab] from its generator: on CPU exactly the
    numbers `ahead` one-step draws give), so a step costs one indexing op, not one draw per group: on a
    GPU each op is a kernel launch, and the host's launches, not the GPU, set the pace of decoding."""

    def __init__(self, seeds: list[int], group_size: int, vocab: int, device, steps: int):
        self.G, self.vocab, self.device = group_size, vocab, device
        self.generators = [torch.Generator(device=device).manual_seed(s) for s in seeds]
        self.ahead = noise_steps_ahead(len(seeds) * group_size, vocab, steps, torch.device(device).type)
        self.drawn: Tensor = torch.empty(0)  # [groups, ahead, G, vocab] log E, drawn on the first call
        self.slot: dict[int, int] = {}  # group -> its row of `drawn`
        self.used = self.ahead
        self._rows: Tensor | None = None  # the live rows last asked for
        self._groups: list[int] = []  # and their groups
        self._index: tuple[tuple, Tensor] | None = None  # (the live rows, their noise rows) once some rows have left

    def _draw(self, groups: list[int]) -> None:
        drawn = torch.empty(len(groups), self.ahead, self.G, self.vocab, device=self.device)
        for k, g in enumerate(groups):
            drawn[k].uniform_(generator=self.generators[g])  # (exponential_ is 7x slower on CPU)
        # E = -log U ~ Exp(1); in place, so no temporaries of the block's size
        self.drawn = drawn.clamp_(min=1e-20).log_().neg_().log_()
        self.slot, self.used = {g: k for k, g in enumerate(groups)}, 0
        self._index = None

    def __call__(self, rows: Tensor) -> Tensor:
        """log E, [len(rows), vocab], for the given original row indices (sorted, on the host, so reading
        them costs no device sync); one draw per live group and step."""
        if rows is not self._rows:  # the live rows changed (decode passes the same tensor until they do)
            self._rows, self._groups = rows, torch.unique_consecutive(rows // self.G).tolist()
        groups = self._groups
        if self.used == self.ahead:
            self._draw(groups)
        step, self.used = self.used, self.used + 1
        if len(groups) == len(self.slot) and len(groups) * self.G == len(rows):  # every row of every group is live
            return self.drawn[:, step].reshape(-1, self.vocab)
        if self._index is None or self._index[0] != tuple(rows.tolist()):  # rows left: which noise rows are theirs
            index = [self.slot[g] * self.G + r % self.G for g, r in zip((rows // self.G).tolist(), rows.tolist())]
            self._index = (tuple(rows.tolist()), torch.tensor(index, device=self.device))
        return self.drawn[:, step].reshape(-1, self.vocab).index_select(0, self._index[1])


def pick(
    logits: Tensor, noise: Tensor | None, temperature: float, top_k: int, top_p: float, logprobs: bool
) -> tuple[Tensor, Tensor | None]:
    """Each live row's next token and, with `logprobs`, its log-prob under the distribution it was drawn from.
    Greedy (`noise` None): the argmax, and the untempered log-softmax. Else Gumbel-max over the tempered logits,
    filtered: under top-k or top-p the log-prob is renormalised over the kept set (docs/math.md, "Truncated
    sampling"). `noise`: each row's own -log E (Noise)."""
    scores = logits.float()
    if noise is None:
        chosen = scores.argmax(-1)
    else:
        if temperature != 1.0:
            scores = scores / temperature
        scores = _filter(scores, top_k, top_p)
        chosen = (scores - noise).argmax(-1)
    logp = scores.log_softmax(-1).gather(-1, chosen[:, None]).squeeze(-1) if logprobs else None
    return chosen, logp


class Fused:
    """`pick` compiled (`compiled`: torch.compile's callable): where compiling fails (no C++ compiler for a CPU's
    kernels), the sampler warns once and picks uncompiled from then on; `pick` writes nothing, so it simply runs
    again."""

    def __init__(self, compiled):
        self.fn = compiled

    def __call__(self, *args):
        try:
            return self.fn(*args)
        except Exception as e:  # an optimisation only, as the compiled decode step
            if self.fn is pick:
                raise
            compile_failed("sampling", "the sampler", e)
            self.fn = pick
            return pick(*args)


_FUSED: list[Fused] = []


def picker(compiled: bool):
    """`pick`, or (generator.decode=compiled) `pick` fused by torch.compile, compiled once a process: a token's
    many vocabulary-wide ops in a few kernels."""
    if not compiled:
        return pick
    if not _FUSED:
        _FUSED.append(Fused(compile_once(pick)))
    return _FUSED[0]
