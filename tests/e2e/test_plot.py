import json
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("matplotlib", reason="the plot extra (matplotlib) is not installed")
SCRIPT = Path(__file__).parents[2] / "scripts" / "plot_metrics.py"


def write_run(path: Path, steps: int, slope: float) -> None:
    path.mkdir(parents=True)
    rows = [
        {
            "step": s,
            "reward_mean": min(1, 0.3 + slope * s),
            "accuracy": 0.5,
            "kl": 0.01 * s,
            "clip_frac_low": 0.0,
            "clip_frac_high": 0.01,
            "completion_len": 3.0,
        }
        for s in range(1, steps + 1)
    ]
    (path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_plot_script_writes_a_png_for_a_run_and_for_a_sweep(tmp_path):
    write_run(tmp_path / "sweep" / "0", 30, 0.02)
    write_run(tmp_path / "sweep" / "1", 30, 0.01)
    for target, out in ((tmp_path / "sweep" / "0", tmp_path / "one.png"), (tmp_path / "sweep", tmp_path / "all.png")):
        result = subprocess.run(
            [sys.executable, str(SCRIPT), str(target), "--out", str(out)], capture_output=True, text=True, check=True
        )
        assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 10_000
    assert "(2 runs)" in result.stdout


def test_plot_script_says_what_is_missing_for_a_directory_without_metrics(tmp_path):
    result = subprocess.run([sys.executable, str(SCRIPT), str(tmp_path)], capture_output=True, text=True)
    assert result.returncode != 0 and "no metrics.jsonl found" in result.stderr


def test_plot_script_draws_the_held_out_eval_rows_of_a_run_that_has_them(tmp_path):
    write_run(tmp_path / "run", 30, 0.02)
    evals = [
        {
            "step": s,
            "kind": "eval",
            "eval/accuracy": 0.4 + s / 100,
            "eval/sampled_accuracy": 0.3 + s / 100,
            "eval/reward_mean": 0.4,
        }
        for s in (0, 10, 20, 30)
    ]
    with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in evals))
    out = tmp_path / "run.png"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "run"), "--out", str(out)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and "held-out eval rows from 1" in result.stdout


def test_mismatch_draws_the_sampler_gap_in_the_clip_fraction_s_place(tmp_path, monkeypatch):
    import importlib.util

    from matplotlib.figure import Figure

    spec = importlib.util.spec_from_file_location("plot_metrics", SCRIPT)
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    write_run(tmp_path / "run", 10, 0.02)
    titles = []
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **k: titles.append([ax.get_title() for ax in fig.axes]))
    script.plot([tmp_path / "run"], tmp_path / "a.png")
    script.plot([tmp_path / "run"], tmp_path / "b.png", mismatch=True)
    assert "clip fraction (low + high)" in titles[0] and "sampler/trainer gap (nats a token)" not in titles[0]
    assert "sampler/trainer gap (nats a token)" in titles[1] and "clip fraction (low + high)" not in titles[1]
