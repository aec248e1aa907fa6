"""Where a model comes from, checked without torch: the built-in models, and a local directory that must
hold a saved model (config.json, or a LoRA adapter's config). The config check runs this before torch loads,
so a wrong path costs a second, not the ten it takes to import torch (models/loading.py loads from it)."""

from __future__ import annotations

from pathlib import Path

from grpo_cli.config import model as model_config  # where the presets' models/ are (read when asked)

BUILTIN = {
    "builtin:tiny": Path(__file__).parents[1] / "assets" / "tiny",
    "builtin:tiny-tools": Path(__file__).parents[1] / "assets" / "tiny_tools",  # tiny_tools.py
    "builtin:tiny-chain": Path(__file__).parents[1] / "assets" / "tiny_chain",
}  # tiny_chain.py
ADAPTER_CONFIG = "adapter_config.json"  # what peft writes beside a LoRA adapter


def is_adapter_dir(path) -> bool:
    return (Path(path) / ADAPTER_CONFIG).exists()


def local_problem(path: str, key: str) -> str | None:
    """What is wrong with `path` as `key` (model.path, reward.model_path, ...) that the disk alone shows, as
    a clause; None when it is a built-in model, a model directory, or may be a hub id."""
    if path in BUILTIN:
        return None
    if path.startswith("builtin:"):
        return f"Unknown built-in model {path!r}; the built-in models are {sorted(BUILTIN)}"
    local = Path(path).expanduser()
    if local.exists():
        if not (local / "config.json").exists() and not is_adapter_dir(local):
            return (
                f"{key}={path} has no config.json, so it is not a Hugging Face model directory; "
                "point it at a directory written by save_pretrained (or a LoRA adapter directory)"
            )
        return None
    if path.startswith(model_config.PRESET_MODELS):
        return (
            f"{key}={path} is in neither {Path.cwd()} nor {model_config.CHECKOUT}: the presets' models are built "
            "into the checkout's models/ (run `make smollm2` there), or pass the model's directory"
        )
    # hub ids are "org/name"; "x/y" where ./x exists is a local path that is missing, not a hub id
    if path.startswith((".", "/", "~")) or path.count("/") > 1 or (path.count("/") == 1 and local.parent.is_dir()):
        return f"{key}={path} does not exist; pass a directory with a saved model, or a hub id"
    return None
