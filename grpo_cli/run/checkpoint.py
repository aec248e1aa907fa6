"""Checkpoints you can trust: `checkpoints/step-N/` holds HF weights (or a LoRA adapter) + tokenizer and
the trainer state; FSDP runs add `dcp/`, their sharded model and optimizer (torch.distributed.checkpoint).

Writing: everything goes into `.tmp-step-N`, is flushed to disk, and is renamed into place; `latest`
moves after that and old checkpoints are pruned last. A process killed at any moment therefore leaves
either a complete `step-N` or none; a write error (a full disk) removes the half-written directory and
is one sentence, with the previous checkpoint untouched. `final/` is staged and renamed the same way.
Weights that are not finite are never written.

The trainer state is the collection of the run's stateful parts (state.Run.parts: the policies, the
optimizer, the scheduler, the rollout source, the RNG), each saved and loaded through its own
`state_dict()` / `load_state_dict()`, beside the few facts read before anything is built (the step, the
config, the world size, the memory plan).
How it works in detail: docs/internals.md, grpo_cli/run/checkpoint.py.
"""

from __future__ import annotations

import os
import re
import shutil
import warnings
from pathlib import Path
from typing import Any

import torch

from grpo_cli.errors import GrpoError, first_line, write_failure
from grpo_cli.models.distributed import SINGLE, Dist, is_sharded, unwrap

STATE_FILE = "trainer_state.pt"
CONFIG_FILE = "config.yaml"  # the run's resolved config, beside the weights: final/ reproduces itself
STEP_DIR = re.compile(r"^step-(\d+)$")
WEIGHT_FILES = ("model.safetensors", "adapter_model.safetensors", "model.safetensors.index.json")


# --- writing ----------------------------------------------------------------------------------------


def _fsync_tree(path: Path) -> None:
    for f in sorted(path.rglob("*")):
        if f.is_file():
            with open(f, "rb") as fh:
                os.fsync(fh.fileno())
    for d in sorted({f.parent for f in path.rglob("*")} | {path}, key=lambda p: -len(p.parts)):
        _fsync_dir(d)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def check_finite(model, dist: Dist = SINGLE) -> None:
    """Refuse to save weights that hold NaN or inf (on any rank's shard)."""
    bad = [n for n, p in model.named_parameters() if not bool(torch.isfinite(_local(p)).all())]
    if dist.all_max(float(bool(bad))):
        raise GrpoError(
            f"The weights are not finite ({', '.join(bad[:3]) or 'on another rank'}), so they were not "
            "saved; lower optimizer.lr, check the reward, and resume from the last checkpoint."
        )


def _local(p):
    return p.to_local() if hasattr(p, "to_local") else p


def full_state_dict(model, dist: Dist) -> dict | None:
    """The model's full state dict on rank 0 (gathered from FSDP shards), None on other ranks; None for
    an unsharded model (it saves itself)."""
    if not is_sharded(model):
        return None
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    # A tied weight (the head sharing the embeddings) comes once per name; keep the name HF saves.
    shared = {n for n, _ in model.named_parameters(remove_duplicate=False)} - {n for n, _ in model.named_parameters()}
    return {k: v for k, v in full.items() if k not in shared} if dist.is_main else None


class _as_os_error:
    """torch.save and safetensors report a failed write (a full disk) as RuntimeError / SafetensorError,
    not OSError; turn those into the OSError they are, so the caller's one sentence names the disk.
    Anything else (a bug) propagates unchanged."""

    def __init__(self, where: Path):
        self.where = Path(where)

    def __enter__(self):
        return self

    def __exit__(self, kind, e, tb):
        if e is None or isinstance(e, OSError) or not isinstance(e, Exception):
            return False
        import errno

        text = str(e)
        writing = "No space left" in text or "os error 28" in text or "unexpected pos" in text or "write failed" in text
        if not writing:
            return False
        try:
            free = shutil.disk_usage(self.where if self.where.exists() else self.where.parent).free
        except OSError:
            free = 0
        full = "No space left" in text or "os error 28" in text or free < (16 << 20)
        raise OSError(errno.ENOSPC if full else errno.EIO, "the disk is full" if full else first_line(e)) from e


def _save_model(model, tokenizer, out: Path, state_dict=None, config: dict | None = None) -> None:
    with _as_os_error(out):
        unwrap(model).save_pretrained(out, state_dict=state_dict)
        tokenizer.save_pretrained(out)
    if config is not None:
        write_config(out / CONFIG_FILE, config)


def write_config(path: Path, config: dict) -> None:
    """The resolved config as YAML (what `grpo train --cfg job` prints)."""
    from omegaconf import OmegaConf

    Path(path).write_text(OmegaConf.to_yaml(OmegaConf.create(config)))


def read_config(directory) -> dict | None:
    """The config.yaml saved beside a checkpoint's or final/'s weights (an adapter's: its parent's), or None."""
    from omegaconf import OmegaConf

    for d in (Path(directory), Path(directory).parent):
        if (d / CONFIG_FILE).is_file():
            try:
                saved = OmegaConf.to_container(OmegaConf.load(d / CONFIG_FILE))
                return saved if isinstance(saved, dict) else None
            except Exception:  # an unreadable file: fall back to the command line's settings
                return None
    return None


def save_checkpoint(
    run_dir: Path,
    step: int,
    model,
    tokenizer,
    trainer_state: dict,
    keep_last: int = 0,
    dist: Dist = SINGLE,
    optimizer=None,
) -> Path:
    """Write checkpoints/step-{step} atomically, then point `latest` at it, then prune old ones. Every
    rank calls it; rank 0 writes the files (`trainer_state` holds every rank's parts: PerRank), each rank
    (FSDP) its shards."""
    root = Path(run_dir) / "checkpoints"
    final, tmp = root / f"step-{step}", root / f".tmp-step-{step}"
    check_finite(model, dist)
    sharded = is_sharded(model)
    ok = True
    if dist.is_main:
        try:
            root.mkdir(parents=True, exist_ok=True)
            shutil.rmtree(tmp, ignore_errors=True)  # a leftover of a save that was killed
            tmp.mkdir()
        except OSError as e:
            ok, error = False, e
    if not dist.all_max(0.0 if ok else 1.0) == 0.0:
        raise (
            write_failure(tmp, error)
            if dist.is_main
            else GrpoError("Rank 0 could not write a checkpoint; see its message.")
        )
    try:
        if sharded:  # every rank writes its shard of the model and optimizer
            import torch.distributed.checkpoint as dcp
            from torch.distributed.checkpoint.state_dict import get_state_dict

            model_sd, optim_sd = get_state_dict(model, optimizer)
            dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=str(tmp / "dcp"))
        full = full_state_dict(model, dist)
        if dist.is_main:
            state = {**trainer_state, "step": step, "world_size": dist.world_size, "sharded": sharded}
            _save_model(model, tokenizer, tmp, full, trainer_state.get("config"))
            with _as_os_error(tmp):
                torch.save(state, tmp / STATE_FILE)
            publish(tmp, final)
    except OSError as e:
        if dist.is_main:
            shutil.rmtree(tmp, ignore_errors=True)
        ok, error = False, e
    if dist.all_max(0.0 if ok else 1.0):
        raise (
            write_failure(tmp, error)
            if not ok
            else GrpoError("Another rank could not write its part of a checkpoint; see its message.")
        )
    if dist.is_main and keep_last > 0:
        for old in list_checkpoints(run_dir)[:-keep_last]:
            shutil.rmtree(old, ignore_errors=True)
    dist.barrier()
    return final


def publish(tmp: Path, final: Path) -> None:
    """The staged checkpoint flushed and renamed into place, then `latest` pointed at it (rank 0)."""
    _fsync_tree(tmp)
    if final.exists():  # the same step saved again (e.g. a stop right after a periodic save)
        shutil.rmtree(final)
    os.replace(tmp, final)
    marker = final.parent / ".latest.tmp"
    marker.write_text(final.name + "\n")
    os.replace(marker, final.parent / "latest")
    _fsync_dir(final.parent)


def save_final(run_dir: Path, model, tokenizer, dist: Dist = SINGLE, merge=None, config: dict | None = None) -> Path:
    """`final/`: the trained model in HF format (under LoRA the merged model, `merge(trained, adapter
    tensors or None)`, and the adapter alone in final/adapter), staged in `.tmp-final` and renamed into
    place, so a kill leaves the old final/ or none, never half of one."""
    run_dir = Path(run_dir)
    final, tmp, old = run_dir / "final", run_dir / ".tmp-final", run_dir / ".old-final"
    check_finite(model, dist)
    full = full_state_dict(model, dist)
    if dist.is_main:
        try:
            shutil.rmtree(tmp, ignore_errors=True)
            if merge is not None:
                # Under FSDP the adapter's tensors are shards: save them from the gathered state dict.
                adapter = None if full is None else {k: v for k, v in full.items() if ".lora_" in k}
                _save_model(model, tokenizer, tmp / "adapter", full)
                _save_model(merge(unwrap(model), adapter), tokenizer, tmp, config=config)
            else:
                _save_model(model, tokenizer, tmp, full, config)
            _fsync_tree(tmp)
            if final.exists():
                os.replace(final, old)
            os.replace(tmp, final)
            _fsync_dir(run_dir)
            shutil.rmtree(old, ignore_errors=True)
        except OSError as e:
            shutil.rmtree(tmp, ignore_errors=True)
            if old.exists() and not final.exists():
                os.replace(old, final)
            raise write_failure(final, e) from None
    dist.barrier()
    return final


def clean_temporaries(run_dir: Path) -> list[Path]:
    """Remove what a killed save left behind (`.tmp-step-N`, `.tmp-final`, `.old-final`); returns them.
    `.old-final` is put back as `final/` when final/ itself is missing (a kill between two renames)."""
    run_dir = Path(run_dir)
    left = [p for p in (run_dir / "checkpoints").glob(".tmp-*")] if (run_dir / "checkpoints").is_dir() else []
    left += [p for p in (run_dir / ".tmp-final", run_dir / ".old-final") if p.exists()]
    for p in left:
        if p.name == ".old-final" and not (run_dir / "final").exists():
            os.replace(p, run_dir / "final")
        else:
            shutil.rmtree(p, ignore_errors=True)
    return left


# --- reading ----------------------------------------------------------------------------------------


def list_checkpoints(run_dir: Path) -> list[Path]:
    """Complete checkpoints of a run, oldest first (a `step-N` directory exists only once complete)."""
    root = Path(run_dir) / "checkpoints"
    if not root.is_dir():
        return []
    found = [
        (int(m.group(1)), p) for p in root.iterdir() if (m := STEP_DIR.match(p.name)) and (p / STATE_FILE).exists()
    ]
    return [p for _, p in sorted(found)]


def load_state(checkpoint: Path) -> dict:
    """The trainer state of a checkpoint, loaded as data (weights_only: no code from the file runs)."""
    f = Path(checkpoint) / STATE_FILE
    try:
        state = torch.load(f, map_location="cpu", weights_only=True)
    except Exception as e:  # a truncated, empty or foreign file, or one holding pickled objects
        raise GrpoError(
            f"{f} cannot be read as a trainer state ({first_line(e)[:160]}); it is damaged or was not "
            "written by grpo-cli."
        ) from None
    if not isinstance(state, dict) or "step" not in state:
        raise GrpoError(f"{f} is not a grpo-cli trainer state (no step recorded).")
    return state


def load_sharded(checkpoint: Path, model, optimizer) -> None:
    """An FSDP checkpoint's model and optimizer shards, resharded to this world size."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state: dict[str, Any] = {"model": model_sd, "optim": optim_sd}
    alone = not (torch.distributed.is_available() and torch.distributed.is_initialized())  # resharded to 1 process
    with warnings.catch_warnings():
        if alone:  # torch notes that it assumes one process even when told so (no_dist); here that is the intent
            warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        dcp.load(state, checkpoint_id=str(Path(checkpoint) / "dcp"), no_dist=alone)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])


# Keys that define the experiment: changing them on resume would splice two different runs.
EXPERIMENT_GROUPS = ("model", "reward", "sampler", "optimizer", "data", "algo", "env")
EXPERIMENT_KEYS = ("trainer.seed", "trainer.prompts_per_step", "trainer.precision")
# Where it runs, how the reward model is batched and what it is called may change.
FREE_KEYS = (
    "model.device",
    "model.name",
    "reward.model_device",
    "reward.model_batch_size",
    "reward.fn_dir",
    "env.fn_dir",
)


def _flatten(d: dict, prefix: str = "") -> dict:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flatten(v, key + ".") if isinstance(v, dict) else {key: v})
    return out


def experiment_diff(saved: dict, current: dict) -> list[str]:
    """`key: saved -> current` for every experiment-defining key that differs."""
    a, b = _flatten(saved), _flatten(current)
    keys = [
        k
        for k in sorted(set(a) | set(b))
        if (k.split(".")[0] in EXPERIMENT_GROUPS or k in EXPERIMENT_KEYS) and k not in FREE_KEYS
    ]
    # A key the saved config lacks is a setting added since that run was written: it ran with the default.
    return [f"{k}: {a.get(k)!r} -> {b.get(k)!r}" for k in keys if k in a and a.get(k) != b.get(k)]
