"""Where a run resumes from (`resume=auto|PATH`), and what it does with a checkpoint it cannot read: why it
cannot, the one line that says which steps are redone, and the damaged checkpoint moved aside so the redone
step's save cannot replace it. Loaded only when a run resumes."""

from __future__ import annotations

import os
from pathlib import Path

from grpo_cli.config.commands import NO_RESUME
from grpo_cli.errors import GrpoError
from grpo_cli.run.checkpoint import STATE_FILE, STEP_DIR, list_checkpoints, load_state


def unreadable(checkpoint: Path) -> str | None:
    """Why a checkpoint cannot be resumed from (a state file or weights that do not load), or None."""
    try:
        load_state(checkpoint)
    except GrpoError as e:
        return str(e)
    from grpo_cli.models.loading import damaged_files

    return damaged_files(checkpoint)


def aside(checkpoint: Path) -> Path:
    """Where a checkpoint resume skipped is moved, so the run's next save of that step cannot replace it:
    `step-N.damaged/` beside it (`.damaged-2/`, ... when that is taken). No step-N name: nothing reads it."""
    target, n = checkpoint.with_name(f"{checkpoint.name}.damaged"), 1
    while target.exists():
        n += 1
        target = checkpoint.with_name(f"{checkpoint.name}.damaged-{n}")
    return target


def set_aside(skipped: list[Path]) -> None:
    """Move each checkpoint resume skipped to its aside() name (rank 0, once the run is accepted)."""
    for checkpoint in skipped:
        if checkpoint.exists():
            os.replace(checkpoint, aside(checkpoint))


def fallback_line(skipped: list[Path], found: Path | None, reasons: list[str]) -> str:
    """resume=auto's one line when it skips checkpoints: which, why, where they go and what is redone."""
    names = ", ".join(p.name for p in skipped)
    last = int(STEP_DIR.match(skipped[0].name).group(1))  # type: ignore[union-attr]  # the newest skipped
    start = int(STEP_DIR.match(found.name).group(1)) + 1 if found is not None else 1  # type: ignore[union-attr]
    redo = f"step {start}" if start == last else f"steps {start}-{last}"
    where = ", ".join(f"checkpoints/{aside(p).name}/" for p in skipped)
    resumed = (
        f"resuming from {found.name}" if found is not None else "no checkpoint can be read, so the run starts over"
    )
    return f"{names} cannot be read ({reasons[0].rstrip('.')}): {resumed} and redoes {redo}; kept, moved to {where}"


def resolve_resume(resume: str | None, run_dir: Path, warn=lambda message: None, skipped=None) -> Path | None:
    """The checkpoint to resume from.

    `auto`: the one `latest` names in run_dir, else the newest complete one; when it cannot be read,
    the newest readable one before it (safe: every step after it is redone), with one line saying which
    steps are redone; None when there is none. The ones skipped are appended to `skipped`, for the caller
    to set aside once the run is accepted. A path: that checkpoint (or that run's newest), refused with one
    sentence when it cannot be read. `false`/null: none."""
    if resume is None or str(resume).strip().lower() in NO_RESUME:
        return None
    if str(resume).strip().lower() == "auto":
        found = list_checkpoints(run_dir)
        marker = Path(run_dir) / "checkpoints" / "latest"
        named = marker.read_text().strip() if marker.is_file() else ""
        if named and (Path(run_dir) / "checkpoints" / named) in found:
            found = found[: found.index(Path(run_dir) / "checkpoints" / named) + 1]
        passed, reasons, chosen = [], [], None
        for candidate in reversed(found):
            why = unreadable(candidate)
            if why is None:
                chosen = candidate
                break
            passed.append(candidate)
            reasons.append(why)
        if passed:
            warn(fallback_line(passed, chosen, reasons))
            if skipped is not None:
                skipped.extend(passed)
        return chosen
    path = Path(resume).expanduser()
    if not (path / STATE_FILE).exists():
        found = list_checkpoints(path)
        if not found:
            raise GrpoError(
                f"resume={resume} is neither a checkpoint (a directory with {STATE_FILE}) nor a run directory "
                "with complete checkpoints; pass resume=auto, a checkpoints/step-N path, or resume=false."
            )
        path = found[-1]
    why = unreadable(path)
    if why is not None:
        raise GrpoError(
            f"Cannot resume from {path}: {why.rstrip('.')}; pick an earlier checkpoint with resume=PATH, "
            "use resume=auto (the newest readable one), or start over with resume=false."
        )
    return path
