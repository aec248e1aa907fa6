"""scripts/gpu_report.py: a GPU check's JSON lands as docs/gpu-check/<device>.json with its date and commit, and
the page's latest-run section is generated from it, each goal worked out from the figures (here chosen by hand)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

import gpu_report  # noqa: E402

RESULTS = {
    "probe": {"ok": True, "device": "NVIDIA H100 80GB HBM3", "torch": "2.13.0", "transformers": "5.25.0"},
    "decode": {
        "ok": True,
        "kinds": ["eager", "static", "compiled"],
        "rows": [
            {
                "batch": 16,
                "floor_ms": 0.30,
                "eager_ms": 26.2,
                "eager_x_floor": 87.3,
                "static_ms": 6.56,
                "static_x_floor": 21.9,
                "compiled_ms": 1.20,
                "compiled_x_floor": 4.0,
            },
            {
                "batch": 64,
                "floor_ms": 0.33,
                "eager_ms": 27.2,
                "eager_x_floor": 82.4,
                "static_ms": 5.85,
                "static_x_floor": 17.7,
                "compiled_ms": 0.825,
                "compiled_x_floor": 2.5,
                "compiled_step_x_floor": 1.1,
            },
        ],
    },
    "train": {"ok": True, "s_per_step": 3.33, "tokens_per_s": 2459.0, "peak_gib": 16.05, "planned_gib": 15.0},
    "resume": {"ok": True, "bitwise": True},
    "planner": {
        "ok": True,
        "shapes": {"a": {"planned_gib": 9.0, "peak_gib": 10.0}, "b": {"planned_gib": 13.0, "peak_gib": 10.0}},
    },
    "trl": {
        "ok": True,
        "rows": [
            {
                "task": "qwen-shape",
                "precision": "bf16",
                "trl": {"step_s": 6.5, "gen_s": 5.0, "peak_mib": 10037},
                "grpo": {"step_s": 1.2, "gen_s": 0.7, "peak_mib": 10388},
            },
            {
                "task": "long",
                "precision": "bf16",
                "trl": {"step_s": 2.0, "gen_s": 1.5, "peak_mib": 1000},
                "grpo": {"step_s": 0.8, "gen_s": 0.5, "peak_mib": 1100},
            },
        ],
    },
    "agent": {"ok": None, "not_run": "past the 480 s deadline"},
}


def test_each_goal_is_worked_out_from_the_figures():
    # decode: the best non-eager kind at batch 64, 2.5x <= 3x; eager's 82x is not the path measured
    assert gpu_report.decode_goal(RESULTS) == "met: decode at batch 64 is 2.5x the floor (compiled steps)"
    # TRL: the long task's row, 0.8 / 2.0 = 0.40x the time, but 1100 / 1000 = 1.10x the memory: not met
    assert gpu_report.trl_goal(RESULTS) == "not met: 0.40x TRL's step time and 1.10x its peak memory (long bf16)"
    # the planner: 0.9 and 1.3 of the measured peak; 1.3 is 30% off
    assert gpu_report.planner_goal(RESULTS) == "not met: planned / measured peak 0.90-1.30"
    assert gpu_report.decode_goal({}).startswith("not measured")
    assert gpu_report.trl_goal({"trl": {"ok": None}}).startswith("not measured")


def test_the_report_writes_the_json_with_its_date_and_commit_and_one_section_of_the_page(tmp_path):
    page = tmp_path / "gpu-check.md"
    page.write_text("# The GPU lane\n\nintro\n\n## Rerunning\n\n    make gpu-check\n")
    results = tmp_path / "gpu_check.json"
    results.write_text(json.dumps(RESULTS))
    for _ in range(2):  # a second report replaces the section, never adds one
        args = [str(results), "--date", "2026-12-08", "--commit", "abc1234", "--docs", str(tmp_path)]
        assert gpu_report.main(args) == 0
    saved = json.loads((tmp_path / "gpu-check" / "nvidia-h100-80gb-hbm3.json").read_text())
    assert saved["date"] == "2026-12-08" and saved["commit"] == "abc1234" and saved["decode"] == RESULTS["decode"]
    text = page.read_text()
    assert text.count(gpu_report.START) == 1 and text.index(gpu_report.END) < text.index("## Rerunning")
    assert "## Latest run: NVIDIA H100 80GB HBM3, 2026-12-08, commit abc1234" in text
    assert "| 64 | 0.330 | 27.200 (82.4x) | 5.850 (17.7x) | 0.825 (2.5x) |" in text
    assert "| long bf16 | grpo-cli | 0.80 | 0.50 | 1,100 |" in text
    assert "| agent | not run | - |" in text and "bitwise the straight run's: yes." in text


def test_a_file_that_is_not_a_gpu_check_json_is_one_sentence(tmp_path, capsys):
    bad = tmp_path / "gpu_check.json"
    bad.write_text("{not json")
    assert gpu_report.main([str(bad), "--docs", str(tmp_path)]) == 2
    assert "cannot be read as a gpu_check.json" in capsys.readouterr().out
