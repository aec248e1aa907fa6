"""Process settings (grpo_cli/models/runtime.py): transformers' losses imported without scipy."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

import pytest

from helpers import FAST, ONE_THREAD

# A run in a fresh process, then what it imported, and transformers' matcher called (scipy imported then).
RUN = """
import json, sys
from grpo_cli.cli import main
try:
    main(["train", *sys.argv[1:]])
except SystemExit as e:
    assert not e.code, e.code
during = "scipy" in sys.modules
import transformers.utils
import transformers.loss.loss_for_object_detection as detection
check = transformers.utils.is_scipy_available()
rows, cols = detection.linear_sum_assignment([[4, 1, 3], [2, 0, 5], [3, 2, 2]])
print(json.dumps({"during": during, "check": check, "rows": rows.tolist(), "cols": cols.tolist(),
                  "after": "scipy" in sys.modules}))
"""


@pytest.mark.skipif(importlib.util.find_spec("scipy") is None, reason="scipy is not installed: nothing to defer")
def test_a_run_leaves_scipy_unimported_and_transformers_matcher_still_works(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", RUN, *FAST, "trainer.steps=1", f"output_dir={tmp_path / 'run'}"],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, **ONE_THREAD},
    )
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["during"] is False  # the run never imported scipy
    assert seen["check"] is True  # transformers' own check answers as before
    # The cheapest assignment of that cost matrix, worked by hand: row 0 -> 1, 1 -> 0, 2 -> 2 (1 + 2 + 2 = 5;
    # the other five permutations cost 6, 6, 7, 9 and 11).
    assert seen["rows"] == [0, 1, 2] and seen["cols"] == [1, 0, 2]
    assert seen["after"] is True  # imported on the matcher's first call


def test_defer_scipy_does_nothing_once_transformers_losses_are_imported():
    import transformers.loss.loss_utils  # noqa: F401 - this test process has them already

    from grpo_cli.models.runtime import defer_scipy

    assert defer_scipy() is False
