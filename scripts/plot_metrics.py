"""Plot a run's metrics.jsonl: reward, accuracy, KL, clip fraction and completion length against step,
and the held-out accuracy of its eval/ rows (`trainer.eval_every`) when it has any. A run of episodes
(env.tools / env.factory) shows the share of episodes calling a tool and the turns per episode in
place of the clip fraction and completion length, and its held-out tool use beside the accuracy.

    python scripts/plot_metrics.py runs/2026-11-21_12-00-00            # writes RUN/metrics.png
    python scripts/plot_metrics.py runA runB --out compare.png          # overlays runs
    python scripts/plot_metrics.py multirun/2026-11-21_12-00-00         # a sweep: every job overlaid
    python scripts/plot_metrics.py runA runB --mismatch                 # the sampler/trainer gap in place of clipping

Needs matplotlib (`pip install grpo-cli[plot]`).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

PANELS = [
    ("reward_mean", "mean reward (sampled)"),
    ("accuracy", "accuracy (sampled)"),
    ("kl", "KL to reference"),
    ("clip_frac", "clip fraction (low + high)"),
    ("completion_len", "completion length (tokens)"),
]
EPISODE_PANELS = PANELS[:3] + [
    ("env/tool_use_frac", "episodes calling a tool (sampled)"),
    ("env/turns", "model turns per episode"),
]


def find_runs(paths: list[str]) -> list[Path]:
    """Each path is a run (has metrics.jsonl) or a sweep/parent directory holding runs."""
    runs = []
    for p in map(Path, paths):
        if (p / "metrics.jsonl").exists():
            runs.append(p)
        else:
            runs += sorted(m.parent for m in p.glob("*/metrics.jsonl"))
    if not runs:
        raise SystemExit(f"error: no metrics.jsonl found in {', '.join(paths)}; pass a run or sweep directory.")
    return runs


def read_all(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line.strip()]


def read_rows(run: Path) -> list[dict]:
    """The training rows (one per step)."""
    rows = [r for r in read_all(run) if "reward_mean" in r]
    for r in rows:
        r["clip_frac"] = r.get("clip_frac_low", 0.0) + r.get("clip_frac_high", 0.0)
    return rows


def read_eval_rows(run: Path) -> list[dict]:
    """The held-out rows written every trainer.eval_every steps (keys eval/accuracy, eval/sampled_accuracy, ...)."""
    return [r for r in read_all(run) if "eval/accuracy" in r]


def smooth(values: list[float], window: int) -> list[float]:
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v - (values[i - window] if i >= window else 0.0)
        out.append(total / min(i + 1, window))
    return out


MISMATCH_PANEL = ("sampler/logp_diff", "sampler/trainer gap (nats a token)")


def plot(runs: list[Path], out: Path, window: int = 10, mismatch: bool = False) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, grid = plt.subplots(2, 3, figsize=(12, 6.4), constrained_layout=True)
    axes = list(grid.flat)
    held_out = axes.pop()
    evaluated, episodes = False, False
    for run in runs:
        rows, evals = read_rows(run), read_eval_rows(run)
        episodes = episodes or any("env/turns" in r for r in rows)
        panels = EPISODE_PANELS if episodes else PANELS
        if mismatch:  # the gap between the sampler's log-probs and the trainer's, in the clip fraction's place
            panels = [MISMATCH_PANEL if key == "clip_frac" else (key, title) for key, title in panels]
        steps = [r["step"] for r in rows]
        label = run.name if len(runs) > 1 else None
        colour = None
        for ax, (key, title) in zip(axes, panels):
            values = [r.get(key, float("nan")) for r in rows]
            line = ax.plot(steps, values, alpha=0.25, linewidth=0.8)[0]
            colour = colour or line.get_color()
            ax.plot(steps, smooth(values, window), color=line.get_color(), linewidth=1.8, label=label)
            ax.set_title(title, fontsize=10)
            ax.set_xlabel("step")
            ax.grid(alpha=0.3)
        if evals:
            evaluated = True
            at = [r["step"] for r in evals]
            held_out.plot(at, [r["eval/accuracy"] for r in evals], "o-", color=colour, markersize=3, label=label)
            held_out.plot(
                at,
                [r.get("eval/sampled_accuracy", float("nan")) for r in evals],
                "s--",
                color=colour,
                markersize=3,
                alpha=0.7,
            )
            if episodes:
                held_out.plot(
                    at,
                    [r.get("eval/tool_use_frac", float("nan")) for r in evals],
                    "^:",
                    color=colour,
                    markersize=3,
                    alpha=0.7,
                )
    if evaluated:
        held_out.set_title(
            "held-out: greedy (solid), sampled (dashed), tool use (dotted)"
            if episodes
            else "held-out accuracy (greedy solid, sampled dashed)",
            fontsize=10,
        )
        held_out.set_xlabel("step")
        held_out.grid(alpha=0.3)
    else:
        held_out.axis("off")
    if len(runs) > 1:
        axes[0].legend(fontsize=7)
    fig.suptitle(
        f"{runs[0].name if len(runs) == 1 else f'{len(runs)} runs'} (thin: per step; thick: {window}-step mean)",
        fontsize=10,
    )
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="+", help="run directories or sweep directories")
    p.add_argument("--out", help="PNG path (default: metrics.png in the first directory)")
    p.add_argument("--window", type=int, default=10, help="steps in the moving average")
    p.add_argument(
        "--mismatch",
        action="store_true",
        help="plot sampler/logp_diff (the sampler's log-probs against the trainer's) in place of clipping",
    )
    args = p.parse_args()
    runs = find_runs(args.paths)
    out = Path(args.out) if args.out else Path(args.paths[0]) / "metrics.png"
    evaluated = sum(bool(read_eval_rows(r)) for r in runs)
    held_out = f"; held-out eval rows from {evaluated}" if evaluated else ""
    print(f"wrote {plot(runs, out, args.window, args.mismatch)} ({len(runs)} run{'s' * (len(runs) > 1)}{held_out})")


if __name__ == "__main__":
    main()
