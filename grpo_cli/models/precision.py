"""Precision is a run setting, not the weights' dtype (docs/math.md, "Precision").

- `fp32`: everything in float32.
- `bf16-mixed`: float32 master weights, gradients and AdamW state; every forward (generation and the
  log-prob passes) runs under bfloat16 autocast. Frozen models (reference, behaviour) are stored in
  bfloat16, the compute dtype, since nothing updates them.
- `bf16`: weights, gradients and optimizer state in bfloat16. An update smaller than half a bf16 ulp
  of a weight rounds away, so this is refused where the learning rate is too small to register
  (`check_pure_bf16_lr`); bf16-mixed is the setting that trains at small learning rates.

How it works in detail: docs/internals.md, grpo_cli/models/precision.py.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass

import torch

from grpo_cli.config.trainer import PRECISIONS
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


def training_precision(name: str, device: torch.device) -> tuple[Precision, str | None]:
    """The precision a run trains in, and a line saying why when it matters: what `auto` chose (and
    why, starting "precision:"), or a warning for an explicit bf16 setting where bf16 compute is slow."""
    if name not in PRECISIONS:  # the config's check refused it already: a caller's bug
        raise ValueError(f"unknown precision {name!r}; expected one of {', '.join(PRECISIONS)}.")
    if name == "fp32":
        return Precision(name, device.type), None
    fast, why = bf16_is_fast(device)
    if name == "auto":
        chosen = "bf16-mixed" if fast else "fp32"
        return Precision(chosen, device.type), f"precision: {chosen} (trainer.precision=auto: {why})"
    note = (
        None
        if fast
        else (f"trainer.precision={name} where bf16 is slow ({why}); trainer.precision=auto or fp32 trains faster here")
    )
    return Precision(name, device.type), note


def cpu_bf16_native() -> tuple[bool, str]:
    """Whether this CPU computes bf16 natively (AVX-512 BF16 or AMX tiles), from torch's own report, and
    its instruction set as torch names it."""
    capability = torch.backends.cpu.get_cpu_capability()
    native = [
        n
        for n, probe in (("AVX-512 BF16", "_is_avx512_bf16_supported"), ("AMX", "_is_amx_tile_supported"))
        if getattr(torch.cpu, probe, lambda: False)()
    ]
    return bool(native), " and ".join(native) if native else f"{capability}, no AVX-512 BF16 or AMX"


def matmul_ratio(device: torch.device, size: int = 128, repeats: int = 3) -> float:
    """Time of a bf16 matmul over a float32 one on `device` (about 20 ms on a CPU without native bf16)."""

    def timed(dtype) -> float:
        a = torch.randn(size, size, device=device).to(dtype)
        a @ a  # warm-up: kernel selection, first-touch allocation
        start = time.perf_counter()
        for _ in range(repeats):
            a @ a
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - start

    return timed(torch.bfloat16) / max(timed(torch.float32), 1e-9)


def decode_ratio(device: torch.device, rows: int = 8, repeats: int = 5) -> float:
    """Time of a decode-shaped product in bf16 over float32 on `device`: a few rows against a 1024 x 8192
    weight (32 MB in float32, so reading it dominates, as in decoding), best of `repeats` each."""

    def best(dtype) -> float:
        x, w = torch.randn(rows, 1024, device=device).to(dtype), torch.randn(8192, 1024, device=device).to(dtype)
        times = []
        for _ in range(repeats + 1):
            start = time.perf_counter()
            torch.nn.functional.linear(x, w)
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times.append(time.perf_counter() - start)
        return min(times[1:])

    return best(torch.bfloat16) / max(best(torch.float32), 1e-9)


def bf16_is_fast(device: torch.device) -> tuple[bool, str]:
    """(whether bf16 compute is at least about as fast as float32 on `device`, the reason in words)."""
    if device.type == "cuda":
        ok = torch.cuda.is_bf16_supported()
        return ok, "this CUDA device " + ("computes bf16 natively" if ok else "has no bf16 support")
    if device.type != "cpu":
        return False, f"bf16 speed on {device.type} is not known here"
    native, what = cpu_bf16_native()
    ratio = matmul_ratio(device)
    if native and ratio < 1.5:
        return True, f"this CPU has {what}; a bf16 matmul ran {ratio:.2f}x the float32 time"
    if native:
        return False, f"this CPU has {what}, but a bf16 matmul ran {ratio:.1f}x slower than float32 here"
    return False, f"this CPU has no native bf16 ({what}); a bf16 matmul ran {ratio:.0f}x slower than float32 here"


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
