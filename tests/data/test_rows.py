"""Rows: a split as plain columns, read as a datasets.Dataset is read; the built-in tasks train without
importing `datasets` (pyarrow and pandas: about 95 MiB of the process)."""

import json
import subprocess
import sys

import pytest
from datasets import Dataset

from grpo_cli.data.rows import Rows

COLUMNS = {
    "prompt": ["1+2=", "3+4=", "5+6=", "7+8="],
    "answer": ["3", "7", "11", "15"],
    "a": [1, 3, 5, 7],
    "links": [[1, 2], [3], [], [4, 5, 6]],
}


def test_rows_read_as_a_dataset_does():
    rows, ds = Rows(COLUMNS), Dataset.from_dict(COLUMNS)
    assert len(rows) == rows.num_rows == len(ds) == 4
    assert rows.column_names == ds.column_names
    for key in (0, 3, -1, [2, 0], range(1, 3), slice(1, None), slice(None, None, 2), []):
        assert rows[key] == ds[key], key
    for name in COLUMNS:
        assert rows[name] == list(ds[name])
    assert rows.select([3, 1]).to_dict() == ds.select([3, 1]).to_dict() == {k: [v[3], v[1]] for k, v in COLUMNS.items()}
    assert rows.to_list() == ds.to_list() == list(rows)
    assert rows[1] == {"prompt": "3+4=", "answer": "7", "a": 3, "links": [3]}  # by hand


def test_reading_rows_never_changes_them():
    rows = Rows(COLUMNS)
    COLUMNS["links"][1].append(9)  # nor does the list they were built from, later
    assert rows[1]["links"] == [3]
    COLUMNS["links"][1].pop()
    rows["answer"].append("x")
    rows.to_dict()["prompt"][0] = "x"
    rows[[0]]["a"].clear()
    rows[3]["links"].append(7)  # nested values too: an environment's reset() may change what it is handed
    rows["links"][0].clear()
    rows.select([1])["links"][0].append(0)
    assert rows.to_dict() == COLUMNS and COLUMNS["answer"] == ["3", "7", "11", "15"]
    assert COLUMNS["links"] == [[1, 2], [3], [], [4, 5, 6]]


def test_columns_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="different lengths"):
        Rows({"prompt": ["a", "b"], "answer": ["1"]})
    assert len(Rows({})) == 0


def test_the_default_run_never_imports_datasets(tmp_path):
    """One step of the built-in default, in a fresh process: `datasets` (and so pyarrow and pandas) is not
    loaded, and the run trained."""
    code = (
        "import sys; from grpo_cli.cli import main\n"
        "try:\n"
        f"    main(['train', 'output_dir={tmp_path / 'run'}', 'trainer.steps=1', 'trainer.threads=1',"
        " 'trainer.progress=false', 'trainer.eval_before_after=false', 'trainer.eval_every=0'])\n"
        "except SystemExit as e:\n"
        "    assert e.code in (0, None), e.code\n"
        "print(sorted(m for m in ('datasets', 'pyarrow', 'pandas') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "[]"
    rows = [json.loads(line) for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()]
    assert any("reward_mean" in r for r in rows)
