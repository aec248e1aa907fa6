"""What a step reads of the run's config, built once per run (`StepSettings.of`): the objective's settings, how to
sample, how to batch, and the run's judge of what "correct" means."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from grpo_cli.config import AlgoConfig, SamplerConfig


@dataclass(frozen=True)
class StepSettings:
    """What a step reads of the run's config (the groups' own objects, which nothing changes once the run is built)."""

    algo: AlgoConfig  # the objective (docs/math.md)
    sampling: SamplerConfig  # how the rollouts were sampled, G included (the ratios compare the tempered policies)
    micro_batch_size: int
    max_grad_norm: float
    judge: Any  # rewards.Judge: what "correct" means
    packing: bool = False  # rows packed without padding in every forward (logprobs.py), where the model can
    max_tokens: int = 0  # micro-batches by token count (real tokens per micro-batch); 0 = micro_batch_size rows
    shared_prompts: bool = False  # with packing: each prompt computed once per micro-batch (packer.shared_inputs)

    @classmethod
    def of(cls, cfg, judge=None) -> "StepSettings":
        t = cfg.trainer
        return cls(
            algo=cfg.algo,
            sampling=cfg.sampler,
            micro_batch_size=t.micro_batch_size,
            max_grad_norm=cfg.optimizer.max_grad_norm,
            judge=judge,
            packing=t.packing,
            max_tokens=t.max_tokens_per_micro_batch,
            shared_prompts=t.shared_prompts,
        )
