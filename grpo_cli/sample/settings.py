"""What a step reads of the run's config, frozen once per run (`StepSettings.of`): the objective's settings, how
to sample, how to batch, and the run's judge of what "correct" means."""

from __future__ import annotations

from dataclasses import dataclass, fields, make_dataclass
from types import MappingProxyType
from typing import Any

from grpo_cli.sample.rollout import Sampling


def frozen(config):
    """A frozen copy of a config dataclass (same fields and values; a dict field becomes read-only); it
    pickles as the config it copies, so a helper process can be sent it."""
    cls = type(config)
    if cls not in _FROZEN:
        _FROZEN[cls] = make_dataclass(f"Frozen{cls.__name__}", [(f.name, f.type) for f in fields(cls)], frozen=True,
                                      namespace={"__reduce__": lambda self: (_refrozen, (cls, _values(self)))})
    return _FROZEN[cls](**{f.name: MappingProxyType(dict(v)) if isinstance(v := getattr(config, f.name), dict) else v
                           for f in fields(cls)})


def _values(copy) -> dict:
    return {f.name: dict(v) if isinstance(v := getattr(copy, f.name), MappingProxyType) else v for f in fields(copy)}


def _refrozen(cls, values: dict):
    return frozen(cls(**values))


_FROZEN: dict[type, type] = {}


@dataclass(frozen=True)
class StepSettings:
    """What a step reads of the run's config, built once per run (`StepSettings.of`): the objective's
    settings, how to sample, how to batch, and the run's one Judge of what "correct" means."""

    algo: Any  # a frozen copy of cfg.algo (docs/math.md)
    sampling: Sampling
    group_size: int
    micro_batch_size: int
    max_grad_norm: float
    judge: Any  # rewards.Judge: what "correct" means
    packing: bool = False  # rows packed without padding in every forward (logprobs.py), where the model can
    max_tokens: int = 0  # micro-batches by token count (real tokens per micro-batch); 0 = micro_batch_size rows
    shared_prompts: bool = False  # with packing: each prompt computed once per micro-batch (packer.shared_inputs)

    @classmethod
    def of(cls, cfg, judge=None) -> "StepSettings":
        s = cfg.sampler
        return cls(algo=frozen(cfg.algo), group_size=s.group_size, micro_batch_size=cfg.trainer.micro_batch_size,
                   sampling=Sampling(max_new_tokens=s.max_new_tokens, temperature=s.temperature, top_p=s.top_p,
                                     top_k=s.top_k),
                   max_grad_norm=cfg.optimizer.max_grad_norm, judge=judge,
                   packing=cfg.trainer.packing, max_tokens=cfg.trainer.max_tokens_per_micro_batch,
                   shared_prompts=cfg.trainer.shared_prompts)
