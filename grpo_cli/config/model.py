"""The `model` and `optimizer` groups: what is trained, and how its weights move."""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grpo_cli.config.declare import Settings, rule, setting

# The checkout grpo runs from (make setup installs it editable): the presets' models/... are built there by
# `make smollm2`, and found from any directory. Installed from a wheel, it is site-packages' parent: no models/.
CHECKOUT = Path(__file__).resolve().parents[2]  # grpo_cli/config/model.py -> the checkout
PRESET_MODELS = "models/"  # the presets' local folder: a path under it is never a hub id


def located(path: str) -> str:
    """`path` as given where it exists (or is absolute, a built-in, or may be a hub id); a relative path
    missing here that the checkout holds (a preset's models/..., run from another directory), the checkout's."""
    local = Path(path).expanduser()
    if path.startswith("builtin:") or local.is_absolute() or local.exists():
        return path
    return str(CHECKOUT / local) if (CHECKOUT / local).exists() else path


LORA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")  # Llama / Qwen names
DEVICE = re.compile(r"^(auto|cpu|mps|cuda(:\d+)?|xpu(:\d+)?)$")


def device_problem(key: str):
    return lambda value: None if DEVICE.match(str(value)) else f"{key}={value!r} must be auto, cpu, cuda or cuda:N"


def _lora(config) -> bool:
    return config.model.lora.r > 0


def _targets(value) -> str | None:
    ok = value == "all-linear" or (
        isinstance(value, (list, tuple)) and bool(value) and all(isinstance(t, str) and t for t in value)
    )
    return None if ok else f"model.lora.target_modules={value!r} must be a list of layer names or all-linear"


@dataclass
class LoraConfig(Settings):
    r: int = setting(0, "adapter rank; 0 = full fine-tuning", low=0)
    alpha: float = setting(
        32.0, "scale: the adapter's update is multiplied by alpha / r", low=0, above=True, when=_lora
    )
    dropout: float = setting(
        0.0, "dropout on the adapter's input, in the training forward only", low=0, high=1, below=True, when=_lora
    )
    target_modules: Any = setting(
        factory=lambda: list(LORA_TARGETS), help="layer names, or all-linear", check=_targets, when=_lora
    )
    quantize: Optional[str] = setting(
        None, "4bit: QLoRA, the frozen base in 4-bit NF4 (bitsandbytes, CUDA only)", choices=("4bit",)
    )


def _recompute(value) -> str | None:
    allowed = ("auto", "true", "false")
    return (
        None
        if str(value).lower() in allowed
        else (f"model.recompute_pointwise={value!r} must be one of {', '.join(allowed)}")
    )


@dataclass
class ModelConfig(Settings):
    name: str = setting("tiny", "a label for logs")
    path: str = setting(
        "builtin:tiny",
        "hub id, local HF directory, or builtin:tiny (shipped in the package)",
        check=lambda v: (
            None
            if str(v).strip()
            else "model.path is empty; give the model with model.path=HUB_ID_OR_DIRECTORY (model=instruct needs it)"
        ),
    )
    device: str = setting(
        "auto", "auto (cuda when present, else cpu) | cpu | cuda | cuda:N", check=device_problem("model.device")
    )
    trust_remote_code: bool = setting(False, "allow model code from the hub repo")
    gradient_checkpointing: bool = setting(
        False, "recompute activations in the backward instead of storing them (less memory, ~30% slower)"
    )
    recompute_pointwise: str = setting(
        "auto",
        "true: norms and MLPs keep only their products' outputs, recomputed "
        "in the backward (gradients bitwise the same); auto: hidden size 512+",
        check=_recompute,
    )
    lora: LoraConfig = setting(factory=LoraConfig, help="LoRA adapters through peft (pip install 'grpo-cli[peft]')")

    def __post_init__(self):  # the presets' models/... found from any directory
        self.path = located(self.path)


@rule("model.lora.quantize", "model.lora.r")
def _quantize_needs_an_adapter(p, c) -> None:
    p.need(
        c.model.lora.quantize is None or c.model.lora.r > 0,
        "model.lora.quantize=4bit quantizes the frozen base of a LoRA run; set model.lora.r too",
    )


def _betas(value) -> str | None:
    ok = (
        isinstance(value, (list, tuple))
        and len(value) == 2
        and all(isinstance(b, (int, float)) and math.isfinite(b) and 0 <= b < 1 for b in value)
    )
    return None if ok else f"optimizer.betas={list(value)} must be two numbers in [0, 1), such as [0.9, 0.99]"


@dataclass
class OptimizerConfig(Settings):
    name: str = setting("adamw", "the only optimiser for now", choices=("adamw",))
    lr: float = setting(
        3e-4, "peak learning rate (3e-4 suits the tiny model; ~1e-6 for 0.5B+ models)", low=0, above=True
    )
    betas: list[float] = setting(factory=lambda: [0.9, 0.99], help="Adam betas", check=_betas)
    weight_decay: float = setting(0.0, "decoupled weight decay", low=0)
    eps: float = setting(1e-8, "Adam epsilon", low=0, above=True)
    scheduler: str = setting(
        "constant_with_warmup",
        "the learning-rate schedule, transformers' formulas (update/schedules.py)",
        choices="grpo_cli.update.schedules:SCHEDULES",
    )
    warmup_steps: int = setting(0, "linear warm-up steps", low=0)
    max_grad_norm: float = setting(1.0, "clip the global gradient norm to this (0 = off)", low=0)


@rule("optimizer.scheduler", "optimizer.lr")
def _polynomial_decays_below_the_rate(p, c) -> None:
    o = c.optimizer
    p.need(
        o.scheduler != "polynomial" or not o.lr <= 1e-7,
        f"optimizer.scheduler=polynomial decays the rate to "
        f"1e-07, and optimizer.lr={o.lr:g} is not above it; raise optimizer.lr or choose another scheduler",
    )
