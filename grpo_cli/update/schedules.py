"""The learning-rate schedules `optimizer.scheduler` names, as multipliers of the base rate on torch's
LambdaLR, with transformers' formulas (its `get_scheduler` defaults: cosine is half a cycle, cosine with
restarts one cycle, polynomial decays linearly to 1e-7, inverse_sqrt's timescale is the warm-up or 10,000
steps). Written here because importing transformers' optimization module costs seconds at start (it
imports its Trainer's utilities, and they peft); tests/update/test_schedules.py checks every schedule against
transformers' own, step by step. Each is a functools.partial, as there, so checkpoints load either way."""

from __future__ import annotations

import math
from functools import partial


def _warming(step: int, warmup: int) -> float:
    return step / max(1, warmup)


def constant(step: int, *, warmup: int, total: int, lr: float) -> float:
    return 1.0


def constant_with_warmup(step: int, *, warmup: int, total: int, lr: float) -> float:
    return _warming(step, warmup) if step < warmup else 1.0


def linear(step: int, *, warmup: int, total: int, lr: float) -> float:
    if step < warmup:
        return _warming(step, warmup)
    return max(0.0, (total - step) / max(1, total - warmup))


def cosine(step: int, *, warmup: int, total: int, lr: float) -> float:
    if step < warmup:
        return _warming(step, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return max(0.0, 0.5 * (1.0 + math.cos(math.pi * progress)))


def cosine_with_restarts(step: int, *, warmup: int, total: int, lr: float) -> float:
    if step < warmup:
        return _warming(step, warmup)
    progress = (step - warmup) / max(1, total - warmup)
    return 0.0 if progress >= 1.0 else max(0.0, 0.5 * (1.0 + math.cos(math.pi * (progress % 1.0))))


POLYNOMIAL_END = 1e-7


def polynomial(step: int, *, warmup: int, total: int, lr: float) -> float:
    if step < warmup:
        return _warming(step, warmup)
    if step > total:
        return POLYNOMIAL_END / lr
    remaining = 1 - (step - warmup) / max(1, total - warmup)  # transformers divides by zero at total = warmup
    return ((lr - POLYNOMIAL_END) * remaining + POLYNOMIAL_END) / lr


def inverse_sqrt(step: int, *, warmup: int, total: int, lr: float) -> float:
    if step < warmup:
        return _warming(step, warmup)
    timescale = warmup or 10_000
    return 1.0 / math.sqrt((step + timescale - warmup) / timescale)


SCHEDULES = {
    f.__name__: f
    for f in (constant, constant_with_warmup, linear, cosine, cosine_with_restarts, polynomial, inverse_sqrt)
}


def schedule(name: str, optimizer, warmup: int, total: int):
    """The LambdaLR of schedule `name` over `total` steps, `warmup` of them warming up linearly from 0. (torch is
    imported here: the names above are read by the config's checks, before it loads.)"""
    from torch.optim.lr_scheduler import LambdaLR

    lr = optimizer.defaults["lr"]
    return LambdaLR(optimizer, partial(SCHEDULES[name], warmup=warmup, total=total, lr=lr))
