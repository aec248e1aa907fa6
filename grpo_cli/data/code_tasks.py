"""The built-in code task (`data=code`, reward=code): small Python functions `f`, each described in one
sentence, with three assert tests and a reference solution.

Problems are generated from templates with their constants varied (n * 7, n + 23, a word repeated 4
times, ...); the prompt says to answer with a ```python block. Every row's `tests` column holds its
tests (JSON, as reward=code reads them) and `answer` a reference program that passes them
(tests/rewards/test_code_reward.py runs each one). The split is by problem, so held-out pass rates measure
programs not seen in training.
"""

from __future__ import annotations

import json
import random

from grpo_cli.data.rows import Rows

ASK = "Write a Python function {signature} that {task}. Reply with only the function, in a ```python block."
WORDS = ["apple", "river", "stone", "garden", "yellow", "planet", "window", "silver", "forest", "candle"]


def _templates():
    """(signature, task, reference body, argument maker) of every problem."""
    num = lambda rng: (rng.randint(-50, 99),)  # noqa: E731
    pos = lambda rng: (rng.randint(1, 60),)  # noqa: E731
    two = lambda rng: (rng.randint(-30, 60), rng.randint(-30, 60))  # noqa: E731
    word = lambda rng: (rng.choice(WORDS),)  # noqa: E731
    for k in range(2, 13):
        yield "f(n)", f"returns n * {k}", f"n * {k}", num
    for k in range(3, 40, 3):
        yield "f(n)", f"returns n + {k}", f"n + {k}", num
        yield "f(n)", f"returns n - {k}", f"n - {k}", num
    for k in range(2, 8):
        yield "f(w)", f"returns the string w repeated {k} times", f"w * {k}", word
        yield "f(n)", f"returns the remainder of n divided by {k}", f"n % {k}", num
    yield "f(n)", "returns n squared", "n * n", num
    yield "f(n)", "returns the sum of the integers from 1 to n", "n * (n + 1) // 2", pos
    yield "f(n)", "returns True if n is even, else False", "n % 2 == 0", num
    for what, expr in (
        ("their sum", "a + b"),
        ("their product", "a * b"),
        ("a minus b", "a - b"),
        ("the larger of the two", "max(a, b)"),
        ("the smaller of the two", "min(a, b)"),
    ):
        yield "f(a, b)", f"returns {what}", expr, two
    for what, expr in (
        ("w reversed", "w[::-1]"),
        ("w in upper case", "w.upper()"),
        ("the length of w", "len(w)"),
        ("the first letter of w", "w[0]"),
        ("the last letter of w", "w[-1]"),
    ):
        yield "f(w)", f"returns {what}", expr, word


def code_problems(num_test: int = 20, seed: int = 0) -> dict[str, Rows]:
    """Every template's problem with three tests, split by problem: `num_test` held out."""
    rng = random.Random(seed)
    rows = []
    for signature, task, expr, make_args in _templates():
        program = f"def {signature}:\n    return {expr}\n"
        reference: dict = {}
        exec(program, reference)  # trusted: the generator's own reference, to compute the expected values
        calls: list = []
        while len(calls) < 3:
            args = make_args(rng)
            if args not in calls:
                calls.append(args)
        tests = [f"assert f({', '.join(map(repr, a))}) == {reference['f'](*a)!r}" for a in calls]
        rows.append(
            {"prompt": ASK.format(signature=signature, task=task), "answer": program, "tests": json.dumps(tests)}
        )
    if not 0 < num_test < len(rows):  # checks.check_data refuses it
        raise ValueError(f"num_test={num_test} must be between 1 and {len(rows) - 1}.")
    rng.shuffle(rows)
    names = ("prompt", "answer", "tests")
    return {"train": Rows.from_list(rows[num_test:], names), "test": Rows.from_list(rows[:num_test], names)}
