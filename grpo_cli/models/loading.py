"""Policy, reference and tokenizer from a hub id, a local directory, or the built-in tiny model."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from transformers import AutoModelForCausalLM, AutoTokenizer

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.models import recompute
from grpo_cli.models.logprobs import enable_logprob_forward
from grpo_cli.models.paths import BUILTIN, is_adapter_dir, local_problem


def resolve_path(path: str, key: str = "model.path") -> str:
    """A loadable location: the built-in model's directory, an existing local directory, or a hub id.
    `key` names the option the path came from in messages."""
    problem = local_problem(path, key)
    if problem:
        raise GrpoError(problem + ".")
    if path in BUILTIN:
        return str(BUILTIN[path])
    local = Path(path).expanduser()
    if local.exists():
        return str(local.resolve())  # absolute: a LoRA adapter records its base by this path
    from grpo_cli.models.hub import check_hub

    check_hub(path, key)
    return path  # a hub id such as Qwen/Qwen2.5-0.5B-Instruct


def resolve_device(device: str, key: str = "model.device") -> torch.device:
    """`device` as a torch device; `key` names the option it came from in messages."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise GrpoError(f"{key}={device} but no CUDA device is visible; use {key}=cpu or auto.")
    try:
        return torch.device(device)
    except RuntimeError:
        raise GrpoError(f"{key}={device} is not a device torch knows; use {key}=auto, cpu, cuda or cuda:N.") from None


LOAD_ERRORS = (OSError, ValueError, SafetensorError)  # missing or damaged files, an unknown architecture


def load_failure(what: str, path: str, location: str, key: str, e: BaseException) -> GrpoError:
    """One sentence for a model or tokenizer that would not load: a damaged local directory and an
    unreachable hub id have different fixes."""
    if Path(location).exists():
        return GrpoError(
            f"Could not load a {what} from {key}={path} ({first_line(e)[:200]}); its files are damaged or "
            "incomplete: point to another model or checkpoint (resume=auto skips a damaged one)."
        )
    return GrpoError(
        f"Could not load a {what} from {key}={path} ({first_line(e)[:200]}); check the hub id and your "
        "network (HF_HUB_OFFLINE=1 uses the local cache only), or pass a local directory."
    )


def load_tokenizer(path: str, trust_remote_code: bool = False, key: str = "model.path"):
    location = resolve_path(path, key)
    try:
        tok = AutoTokenizer.from_pretrained(location, trust_remote_code=trust_remote_code)
    except LOAD_ERRORS as e:
        raise load_failure("tokenizer", path, location, key, e) from None
    tok.padding_side = "left"  # generation appends on the right
    if tok.pad_token_id is None:
        tok.pad_token = tok.eos_token
    return tok


def load_model(
    path: str,
    dtype: torch.dtype = torch.float32,
    device: str = "auto",
    trust_remote_code: bool = False,
    *,
    gradient_checkpointing: bool = False,
    quantize: str | None = None,
    key: str = "model.path",
    recompute_pointwise="false",
):
    """A causal LM in eval mode on `device` in `dtype`, ready for training code: dropout off, and a
    forward that can return lean token log-probabilities (logprobs.py). A LoRA adapter directory loads
    as its base with the adapter merged in (for evaluation and sampling); `quantize="4bit"` loads the
    weights in 4-bit NF4 for QLoRA (CUDA only). `recompute_pointwise` (auto, true or false): the decoder layers'
    norms and MLPs keep only their products' outputs for the backward (recompute.py), where layers are not
    recomputed whole."""
    location = resolve_path(path, key)
    if is_adapter_dir(location) and not (Path(location) / "config.json").exists():
        from grpo_cli.models.lora import adapter_base, load_adapter

        base = load_model(adapter_base(location), dtype, device, trust_remote_code, key=f"the base of {key}={path}")
        return load_adapter(base, location, trainable=False).merge_and_unload().eval()
    extra = {}
    if quantize is not None:
        extra["quantization_config"] = four_bit_config(dtype, resolve_device(device))
        extra["device_map"] = {"": resolve_device(device)}
    try:
        model = AutoModelForCausalLM.from_pretrained(
            location, dtype=dtype, trust_remote_code=trust_remote_code, **extra
        )
    except LOAD_ERRORS as e:
        raise load_failure("model", path, location, key, e) from None
    disable_dropout(model)
    enable_logprob_forward(model)
    if gradient_checkpointing:
        if not model.supports_gradient_checkpointing:
            raise GrpoError(
                f"model.gradient_checkpointing=true, but {type(model).__name__} does not support it; set it to false."
            )
        enable_checkpointing(model)
    else:
        recompute.recompute_pointwise(model, recompute_pointwise)
    loaded: Any = model  # (transformers' annotations make .to take a model)
    return (loaded if quantize else loaded.to(resolve_device(device))).eval()


def enable_checkpointing(model):
    """Recompute each layer in the backward. Non-reentrant: inputs need not require grad, and it composes with
    autocast and DDP."""
    kwargs = {"use_reentrant": False}
    if hasattr(model, "activation_checkpointing_enable"):  # transformers >= 5.20's name
        model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
    else:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)


def four_bit_config(compute_dtype: torch.dtype, device: torch.device):
    """bitsandbytes' 4-bit NF4 quantization with double quantization (the QLoRA paper's settings)."""
    if device.type != "cuda":
        raise GrpoError(
            "model.lora.quantize=4bit (QLoRA) needs a CUDA GPU: bitsandbytes' 4-bit kernels do not run "
            f"on {device.type}; set model.lora.quantize=null to train LoRA on an unquantized base."
        )
    try:
        import bitsandbytes  # noqa: F401
    except ImportError:
        raise GrpoError("model.lora.quantize=4bit needs bitsandbytes: pip install 'grpo-cli[qlora]'.") from None
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type="nf4",
        bnb_4bit_use_double_quant=True,
        bnb_4bit_compute_dtype=compute_dtype,
    )


def disable_dropout(model) -> None:
    """Dropout off in every module, whatever mode the model is in: GRPO's ratios compare log-probs of the
    same tokens under two policies, and dropout noise in one of them would bias every ratio. Covers
    nn.Dropout modules and the float attention-dropout attributes HF attention layers read in training."""
    for module in model.modules():
        if isinstance(module, torch.nn.Dropout):
            module.p = 0.0
        for name in ("attention_dropout", "dropout", "attn_dropout", "resid_dropout"):
            if isinstance(getattr(module, name, None), float):
                setattr(module, name, 0.0)


def damaged_files(directory) -> str | None:
    """Why a local model, adapter or checkpoint directory would not load (a config that is not JSON, a
    truncated safetensors file), or None; cheap: headers and the last tensor only."""
    import json

    directory = Path(directory)
    for name in ("config.json", "adapter_config.json"):
        f = directory / name
        if f.exists():
            try:
                json.loads(f.read_text())
            except (ValueError, OSError) as e:
                return f"{f} is not valid JSON ({first_line(e)})"
    for f in sorted(directory.glob("*.safetensors")):
        try:
            from safetensors import safe_open

            with safe_open(str(f), framework="pt") as st:
                keys = list(st.keys())
                if keys:
                    st.get_tensor(keys[-1])  # the last tensor: a truncated file ends early
        except (SafetensorError, OSError) as e:
            return f"{f} is damaged ({first_line(e)})"
    return None
