"""Checkpoints: `checkpoints/step-N/` holding HF weights + tokenizer and the trainer state.

Written to a temporary directory and renamed into place, then the `latest` marker is updated,
so a crash mid-save never leaves a directory that looks complete.
"""

from __future__ import annotations

import os
import random
import shutil
from pathlib import Path

import numpy as np
import torch

STATE_FILE = "trainer_state.pt"


def rng_state() -> dict:
    state = {"python": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def save_checkpoint(run_dir: Path, step: int, model, tokenizer, trainer_state: dict) -> Path:
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    tmp = root / f".tmp-step-{step}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    torch.save({**trainer_state, "step": step, "rng": rng_state()}, tmp / STATE_FILE)
    for f in tmp.iterdir():  # data on disk before the rename makes it visible
        with open(f, "rb") as fh:
            os.fsync(fh.fileno())
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    marker = root / ".latest.tmp"
    marker.write_text(final.name + "\n")
    os.replace(marker, root / "latest")
    return final
