"""LoRA adapters through peft (`pip install 'grpo-cli[peft]'`), on with `model.lora.r > 0`.

Only the adapter trains, so the optimizer state is the adapter's; the frozen base is stored in the
compute dtype (bf16 under bf16-mixed) while the adapter stays float32. The KL reference needs no second
model: it is the policy with its adapter switched off (`adapter_disabled`). A lagged behaviour policy
is a copy of the adapter alone, swapped in while it samples and scores (`AdapterCopy`).

Outputs: a checkpoint holds the adapter (`adapter_model.safetensors`, `adapter_config.json`); `final/`
is the merged model, loadable with AutoModelForCausalLM, and `final/adapter/` the adapter alone,
loadable with PeftModel.from_pretrained.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import torch

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.models.paths import ADAPTER_CONFIG


def peft_module():
    try:
        import peft
    except ImportError:
        raise GrpoError(
            "model.lora.r > 0 needs peft, which is not installed: pip install 'grpo-cli[peft]', "
            "or set model.lora.r=0 for full fine-tuning."
        ) from None
    return peft


def adapter_base(path) -> str:
    """The base model an adapter directory was trained on, as peft recorded it."""
    import json

    return json.loads((Path(path) / ADAPTER_CONFIG).read_text())["base_model_name_or_path"]


def target_modules(value):
    """model.lora.target_modules: a list of module names, or the string all-linear (every linear layer
    but the output head)."""
    if isinstance(value, str):
        return value if value == "all-linear" else [value]
    return list(value)


def add_adapter(model, lora):
    """`model` wrapped with a fresh, trainable LoRA adapter (the base frozen)."""
    peft = peft_module()
    config = peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=target_modules(lora.target_modules),
        task_type="CAUSAL_LM",
    )
    try:
        return peft.get_peft_model(model, config)
    except ValueError as e:  # e.g. none of the target modules exists in this architecture
        raise GrpoError(
            f"model.lora could not be applied ({first_line(e)}); set model.lora.target_modules to "
            "module names of this model, or to all-linear."
        ) from None


def load_adapter(model, adapter_dir, trainable: bool):
    """`model` with the adapter saved in `adapter_dir`."""
    peft = peft_module()
    try:
        return peft.PeftModel.from_pretrained(model, str(adapter_dir), is_trainable=trainable)
    except (OSError, ValueError, KeyError, __import__("safetensors").SafetensorError) as e:
        raise GrpoError(
            f"Could not load the LoRA adapter in {adapter_dir} ({first_line(e)}); point to a directory "
            "written by a LoRA run (a checkpoint or final/adapter)."
        ) from None


def peft_model(model):
    """The PeftModel inside `model` (which may be wrapped by DDP or FSDP), or None."""
    inner = getattr(model, "module", model)
    return inner if hasattr(inner, "disable_adapter") and hasattr(inner, "peft_config") else None


@contextmanager
def adapter_disabled(model):
    """The policy with its adapter switched off: the base model, which is the LoRA run's reference."""
    with peft_model(model).disable_adapter():
        yield model


def adapter_state(model) -> dict[str, torch.Tensor]:
    """The adapter's trainable tensors by name (a copy)."""
    return {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}


class AdapterCopy:
    """A lagged copy of the adapter alone. `swapped_in(policy)` puts its values into the policy's adapter
    tensors while the behaviour samples or scores, then puts the policy's own back, bit for bit."""

    def __init__(self, model):
        self.state = adapter_state(model)

    def refresh(self, model) -> None:
        self.state = adapter_state(model)

    @contextmanager
    def swapped_in(self, model):
        params = dict(model.named_parameters())
        own = {n: params[n].detach().clone() for n in self.state}
        with torch.no_grad():
            for n, t in self.state.items():
                params[n].copy_(t)
        try:
            yield model
        finally:
            with torch.no_grad():
                for n, t in own.items():
                    params[n].copy_(t)


def merged_copy(base, trained, adapter: dict | None = None):
    """A plain causal LM: `base`, a fresh copy of the base model (float32: the base the run held may be
    bf16, and merging into it would round the adapter's small updates away), with the trained adapter
    merged in. `adapter`: the adapter's tensors by name when `trained` holds shards of them (FSDP)."""
    fresh = add_adapter(base, _lora_of(trained))
    result = fresh.load_state_dict(adapter_state(peft_model(trained)) if adapter is None else adapter, strict=False)
    if result.unexpected_keys:  # every adapter tensor must land, or the merge would be silently wrong
        raise RuntimeError(f"adapter tensors without a place in the fresh copy: {result.unexpected_keys[:3]}")
    return fresh.merge_and_unload()


def _lora_of(model):
    """The LoRA settings of a PeftModel, in model.lora's shape."""
    from types import SimpleNamespace

    c = peft_model(model).peft_config["default"]
    return SimpleNamespace(
        r=c.r,
        alpha=c.lora_alpha,
        dropout=c.lora_dropout,
        target_modules=c.target_modules if isinstance(c.target_modules, str) else sorted(c.target_modules),
    )
