"""What `grpo evaluate` and `grpo sample` share: a trained model is served the way it was trained
(its saved data, sampler and reward settings), and its files and the output directory are checked
before any work."""

from __future__ import annotations

from pathlib import Path

from grpo_cli.errors import GrpoError

TRAINING_GROUPS = ("data", "sampler", "reward", "env")  # how a model was prompted, sampled, judged, and its tools


def with_training_settings(cfg, paths: list[str], overrides: list[str], console):
    """`cfg` with the data, sampler and reward groups saved with the first of `paths` that has a
    config.yaml (a checkpoint or final/ of a grpo run): a trained model is evaluated and sampled the way
    it was trained (chat template, system prompt, template, completion length, reward). A key the command
    line sets (`sampler.group_size=2`) overrides that one key of the saved group; choosing another option
    of the group (`reward=python`) replaces the saved group."""
    from omegaconf import OmegaConf

    from grpo_cli.run.checkpoint import read_config

    saved, source = None, None
    for path in paths:
        saved = read_config(path) if Path(path).is_dir() else None
        if saved:
            source = path
            break
    if not saved:
        return cfg
    keys = [o.lstrip("+~").split("=", 1)[0] for o in overrides if "=" in o]
    replaced = {k for k in keys if "." not in k}  # group=option
    taken = [g for g in TRAINING_GROUPS if g not in replaced and isinstance(saved.get(g), dict)]
    mine = []
    for group in taken:
        merged = OmegaConf.merge(OmegaConf.structured(type(getattr(cfg, group))), saved[group])
        current = OmegaConf.structured(getattr(cfg, group))
        for key in keys:
            if key.startswith(group + "."):
                sub = key.split(".", 1)[1]
                OmegaConf.update(merged, sub, OmegaConf.select(current, sub), merge=False)
                mine.append(key)
        setattr(cfg, group, OmegaConf.to_object(merged))
    if taken:
        yours = f"; yours on top: {', '.join(mine)}" if mine else ""
        console.print(
            f"using the {', '.join(taken)} settings saved with {source}{yours} (set any key to change it, or "
            f"choose a group's option, e.g. {taken[0]}=..., to leave the saved group out)",
            highlight=False,
        )
    return cfg


def check_model_files(path: str, key: str) -> None:
    """A model path that exists (or is a hub id) and whose local files are whole, or one sentence naming `key`."""
    from grpo_cli.models.loading import damaged_files, resolve_path

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
