"""Checkpoints you can trust: `checkpoints/step-N/` holds HF weights + tokenizer and the trainer state.

A checkpoint is written into `.tmp-step-N`, flushed to disk, and renamed into place; `latest` is
updated after that and old checkpoints are pruned last. A process killed at any moment therefore
leaves either a complete `step-N` or none: resume only ever looks at `step-N` directories.
"""

from __future__ import annotations

import os
import random
import re
import shutil
from pathlib import Path

import numpy as np
import torch

from grpo_cli.errors import GrpoError

STATE_FILE = "trainer_state.pt"
STEP_DIR = re.compile(r"^step-(\d+)$")


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _fsync_tree(path: Path) -> None:
    for f in path.iterdir():
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    _fsync_dir(path)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, trainer_state: dict, keep_last: int = 0) -> Path:
    """Write checkpoints/step-{step} atomically, then point `latest` at it, then prune old ones."""
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final, tmp = root / f"step-{step}", root / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a save that was killed
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
    _fsync_tree(tmp)
    if final.exists():  # the same step saved again (e.g. a stop right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    marker = root / ".latest.tmp"
    marker.write_text(final.name + "\n")
    os.replace(marker, root / "latest")
    _fsync_dir(root)
    if keep_last > 0:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    return final


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (a `step-N` directory exists only once complete)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and (p / STATE_FILE).exists()]
    return [p for _, p in sorted(found)]


def resolve_resume(resume: str | None, run_dir: Path) -> Path | None:
    """The checkpoint to resume from: `auto` = the newest complete one in run_dir (None when there
    is none), a path = that checkpoint (or a run directory's newest), `false`/null = none."""
    if resume is None or str(resume).strip().lower() in ("", "false", "none", "no", "0"):
        return None
    if str(resume).strip().lower() == "auto":
        found = list_checkpoints(run_dir)
        return found[-1] if found else None
    path = Path(resume).expanduser()
    if (path / STATE_FILE).exists():
        return path
    found = list_checkpoints(path)
    if found:
        return found[-1]
    raise GrpoError(
        f"resume={resume} is neither a checkpoint (a directory with {STATE_FILE}) nor a run directory "
        "with complete checkpoints; pass resume=auto, a checkpoints/step-N path, or resume=false."
    )


def load_state(checkpoint: Path) -> dict:
    return torch.load(Path(checkpoint) / STATE_FILE, map_location="cpu", weights_only=False)


# Keys that define the experiment: changing them on resume would splice two different runs.
EXPERIMENT_GROUPS = ("model", "reward", "sampler", "optimizer", "data", "algo")
EXPERIMENT_KEYS = ("trainer.seed", "trainer.prompts_per_step")
# Where it runs, how the reward model is batched and what it is called may change.
FREE_KEYS = ("model.device", "model.name", "reward.model_device", "reward.model_batch_size")


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flatten(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def experiment_diff(saved: dict, current: dict) -> list[str]:
    """`key: saved -> current` for every experiment-defining key that differs."""
    a, b = _flatten(saved), _flatten(current)
    keys = [k for k in sorted(set(a) | set(b))
            if (k.split(".")[0] in EXPERIMENT_GROUPS or k in EXPERIMENT_KEYS) and k not in FREE_KEYS]
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys if a.get(k) != b.get(k)]
