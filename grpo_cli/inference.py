"""What `grpo evaluate` and `grpo sample` share: a trained model is served the way it was trained
(its saved data, sampler and reward settings), and its files and the output directory are checked
before any work."""

from __future__ import annotations

from pathlib import Path

from grpo_cli.errors import GrpoError


TRAINING_GROUPS = ("data", "sampler", "reward")  # how a model was prompted, sampled and judged


def with_training_settings(cfg, paths: list[str], overrides: list[str], console):
    """`cfg` with the data, sampler and reward groups saved with the first of `paths` that has a
    config.yaml (a checkpoint or final/ of a grpo run), for each group the command line did not set:
    a trained model is evaluated and sampled the way it was trained (chat template, system prompt,
    template, completion length, reward) unless the user says otherwise."""
    from omegaconf import OmegaConf

    from grpo_cli.checkpoint import read_config
    from grpo_cli.config import GROUP_SCHEMAS

    saved, source = None, None
    for path in paths:
        saved = read_config(path) if Path(path).is_dir() else None
        if saved:
            source = path
            break
    if not saved:
        return cfg
    mine = {o.lstrip("+~").split("=", 1)[0].split(".", 1)[0] for o in overrides}
    taken = [g for g in TRAINING_GROUPS if g not in mine and isinstance(saved.get(g), dict)]
    for group in taken:
        merged = OmegaConf.merge(OmegaConf.structured(GROUP_SCHEMAS[group]), saved[group])
        setattr(cfg, group, OmegaConf.to_object(merged))
    if taken:
        console.print(f"using the {', '.join(taken)} settings saved with {source} (set any {taken[0]}.* key, or "
                      f"{taken[0]}=..., to use your own)", highlight=False)
    return cfg


def check_model_files(path: str, key: str) -> None:
    """A model path that exists (or is a hub id) and whose local files are whole, or one sentence naming `key`."""
    from grpo_cli.models import damaged_files, resolve_path

    location = resolve_path(path, key)
    why = damaged_files(location) if Path(location).is_dir() else None
    if why:
        raise GrpoError(f"{key}={path} cannot be loaded: {why}; point {key} to another model or checkpoint.")


def writable_dir(directory: Path, key: str) -> None:
    """`directory` exists (made if need be) and takes a file, or one sentence naming `key`."""
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        probe = Path(directory) / ".write_test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise GrpoError(f"Cannot write to {directory} ({e.strerror or e}); choose another with {key}=DIR.") from None
