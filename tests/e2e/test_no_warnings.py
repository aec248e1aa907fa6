"""No warning of our own making: a default run, the tool-use demo, `evaluate` and `sample` print no Python
warning and no library deprecation notice (transformers reports its deprecations through its logger, not
the warnings module, so the output is read, with Python's warnings all shown: -W default)."""

from __future__ import annotations

import re

import pytest

from helpers import FAST, SMALL, grpo_process

WARNING = re.compile(r"Warning|deprecated", re.IGNORECASE)


def _no_warning(out) -> None:
    text = out.stdout + out.stderr
    found = [line for line in text.splitlines() if WARNING.search(line)]
    assert not found, "\n".join(found)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    run = tmp_path_factory.mktemp("run")
    out = grpo_process("train", *FAST, f"output_dir={run}", env={"PYTHONWARNINGS": "default"}, check_rc=0)
    return run, out


def test_a_default_run_prints_no_warning(trained):
    _no_warning(trained[1])


def test_evaluate_and_sample_print_no_warning(trained, tmp_path):
    run, _ = trained
    env = {"PYTHONWARNINGS": "default"}
    _no_warning(
        grpo_process(
            "evaluate",
            f"checkpoint={run / 'final'}",
            "data.max_operand=9",
            "data.num_test=20",
            f"output_dir={tmp_path}",
            env=env,
            check_rc=0,
        )
    )
    _no_warning(grpo_process("sample", f"checkpoint={run / 'final'}", "prompt='12+30='", env=env, check_rc=0))


def test_the_tool_demo_prints_no_python_warning(tmp_path):
    out = grpo_process(
        "train",
        "experiment=tool_use",
        *SMALL,
        "trainer.steps=2",
        f"output_dir={tmp_path}",
        env={"PYTHONWARNINGS": "default"},
        check_rc=0,
    )
    text = out.stdout + out.stderr
    assert not re.search(r"\w+Warning:", text), text[-3000:]  # its own "warning:" line about the template is deliberate


def test_in_the_suite_a_warning_from_grpo_cli_code_is_an_error_and_a_listed_notice_is_not():
    """pyproject.toml's filters: a warning raised from a grpo_cli module fails the test that caused it; the
    third-party notice listed there by its message is ignored; any other third-party warning still shows."""
    import warnings

    with pytest.raises(RuntimeWarning, match="from our code"):
        warnings.warn_explicit("from our code", RuntimeWarning, "generation.py", 1, module="grpo_cli.generate.hf")
    with warnings.catch_warnings(record=True) as seen:
        warnings.warn_explicit("`is_gradient_checkpointing` is deprecated", FutureWarning, "m.py", 1, module="peft.x")
        warnings.warn_explicit("another notice", FutureWarning, "m.py", 1, module="peft.x")
    assert [str(w.message) for w in seen] == ["another notice"]
