r"""reward=code: the share of a row's tests that the completion's program passes, each test run in a
sandboxed process.

The program is the last fenced block of the completion (```python ... ```); a completion with none is
read up to its first closing fence (the prompt opened the block), else whole. The tests are the
dataset column `reward.tests_field`, one entry per row, in any of these forms (or as a JSON string of
one of them):
- stdin/stdout pairs: `[{"input": "3 4\n", "output": "7\n"}, ...]`, or APPS's
  `{"inputs": [...], "outputs": [...]}`: the program reads the input and must print the output
  (compared line by line, trailing whitespace aside);
- assert statements: `["assert add(1, 2) == 3", ...]`, each run after the program.

How it works in detail: docs/internals.md, grpo_cli/rewards/code.py.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor

from grpo_cli.errors import GrpoError
from grpo_cli.rewards.code_verdict import verdict
from grpo_cli.sandbox.program import Sandbox, text_of

FENCED = re.compile(r"```[^\n`]*\n(.*?)```", re.DOTALL)


def extract_program(completion: str) -> str:
    """The last fenced block; else the text before a closing fence (the prompt opened it); else all of it."""
    blocks = FENCED.findall(completion)
    if blocks:
        return blocks[-1]
    return completion.split("```", 1)[0]


def parse_tests(value, row: int, field: str) -> list[tuple[str, str | None, str | None]]:
    """A row's tests as (kind, given, expected) triples: "io" (stdin, the stdout expected), "judged" (the
    assert test, its Verdict: rewards/code_verdict.py) or "assert" (a test of another shape, run whole in
    the sandbox; None)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            value = [value]  # one assert statement
    if isinstance(value, dict) and "inputs" in value and "outputs" in value:  # APPS / TACO
        value = [{"input": i, "output": o} for i, o in zip(value["inputs"], value["outputs"])]
    tests: list = []
    for t in value if isinstance(value, (list, tuple)) else [value]:
        if isinstance(t, dict) and "input" in t and "output" in t:
            tests.append(("io", text_of(t["input"]), text_of(t["output"])))
        elif isinstance(t, str) and t.strip():
            judged = verdict(t)
            tests.append(("judged", t, judged) if judged else ("assert", t, None))
        else:
            raise GrpoError(
                f'Row {row}\'s {field} holds {t!r}, not a test; give a list of {{"input": ..., '
                '"output": ...} pairs or of assert statements (reward=code).'
            )
    if not tests:
        raise GrpoError(f"Row {row}'s {field} is empty; every row needs at least one test (reward=code).")
    return tests


def build(cfg):
    """The term: for each completion, the share of its row's tests passed."""
    field = cfg.tests_field
    sandbox = Sandbox(cfg.code_cpu_s, cfg.code_memory_mib, cfg.code_output_kib, cfg.code_processes, cfg.sandbox)
    sandbox.check()
    threads = max(1, len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1)

    def reward(batch):
        if field not in batch.columns:
            raise GrpoError(
                f"reward=code reads each row's tests from the dataset column {field!r}, which this data "
                f"does not have (its columns: {', '.join(sorted(batch.columns)) or 'none'}); set "
                "reward.tests_field."
            )
        jobs = []  # (completion, test) pairs
        for i, (text, tests) in enumerate(zip(batch.completions, batch.columns[field])):
            program = extract_program(text)
            jobs += [(i, program, *t) for t in parse_tests(tests, batch.first + i, field)]
        with ThreadPoolExecutor(threads) as pool:  # each thread waits on its process: the GIL is free
            passed = list(pool.map(lambda job: sandbox.passes(*job[1:]), jobs))
        counts, totals = [0] * len(batch), [0] * len(batch)
        for (i, *_), ok in zip(jobs, passed):
            counts[i] += ok
            totals[i] += 1
        return [c / t for c, t in zip(counts, totals)]

    reward.max_value = 1.0
    return reward
