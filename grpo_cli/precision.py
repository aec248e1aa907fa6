"""Precision is a run setting, not the weights' dtype (docs/math.md, "Precision").

- `fp32`: everything in float32.
- `bf16-mixed`: float32 master weights, gradients and AdamW state; every forward (generation and the
  log-prob passes) runs under bfloat16 autocast. Frozen models (reference, behaviour) are stored in
  bfloat16, the compute dtype, since nothing updates them.
- `bf16`: weights, gradients and optimizer state in bfloat16. An update smaller than half a bf16 ulp
  of a weight rounds away, so this is refused where the learning rate is too small to register
  (`check_pure_bf16_lr`); bf16-mixed is the setting that trains at small learning rates.

The loss math (ratios, KL, aggregation) is float32 under every setting (objective.py upcasts).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch

from grpo_cli.choices import PRECISIONS
from grpo_cli.errors import GrpoError

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


@dataclass(frozen=True)
class Precision:
    name: str  # one of PRECISIONS (training) or INFERENCE_PRECISIONS (evaluate, sample)
    device_type: str = "cpu"

    @property
    def mixed(self) -> bool:
        return self.name == "bf16-mixed"

    @property
    def param_dtype(self) -> torch.dtype:
        """The dtype of the weights being trained (or served)."""
        return DTYPES["fp32" if self.mixed else self.name]

    @property
    def frozen_dtype(self) -> torch.dtype:
        """The dtype of models nothing updates: the compute dtype."""
        return torch.bfloat16 if self.mixed else self.param_dtype

    def autocast(self):
        """The context every forward runs in: bf16 autocast under bf16-mixed, else nothing. Inside one
        such region each float32 weight is cast to bf16 once and the cast reused."""
        if self.mixed:
            return torch.autocast(self.device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def outside_autocast(self):
        """Autocast off, for a backward inside a longer autocast region: nested, it keeps the region's
        cast weights (they are freed only when the outermost region exits)."""
        if self.mixed:
            return torch.autocast(self.device_type, enabled=False)
        return contextlib.nullcontext()


def training_precision(name: str, device: torch.device) -> Precision:
    if name not in PRECISIONS:  # checks.py refused it already: a caller's bug
        raise ValueError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}.")
    return Precision(name, device.type)


def check_pure_bf16_lr(model, lr: float) -> None:
    """Refuse precision=bf16 when AdamW's step (about lr per weight) is below half a bf16 ulp of most
    weights: those updates round to nothing, and the run would look like training while nothing moves."""
    # bf16 keeps 8 significant bits: the spacing around |w| is about |w| * 2**-7, half of it 2**-8.
    sizes = torch.cat([p.detach().abs().flatten().float() for p in model.parameters() if p.requires_grad])
    if sizes.numel() > 1_000_000:
        sizes = sizes[torch.randperm(sizes.numel(), generator=torch.Generator().manual_seed(0))[:1_000_000]]
    frozen = float((lr < sizes * 2.0**-8).float().mean())
    if frozen > 0.5:
        raise GrpoError(
            f"trainer.precision=bf16 with optimizer.lr={lr:g}: an AdamW step of about the learning rate is below half "
            f"a bfloat16 ulp of {frozen:.0%} of the weights, so it rounds away and they never change; use "
            "trainer.precision=bf16-mixed (float32 master weights, bf16 compute) or a larger learning rate."
        )
