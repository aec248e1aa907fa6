"""Assert tests judged in the trainer (rewards/code_verdict.py): which parts go to the sandbox, worked by
hand for each shape of assertion; the values' encoding both ways; and the verdict over a harness's output,
forged lines included. The last tests run real programs through the sandbox."""

import math

import pytest

from grpo_cli.rewards.code import parse_tests
from grpo_cli.rewards.code_verdict import MARK, decode, verdict


@pytest.mark.parametrize(
    "test, pieces, asserts",
    [
        ("assert add(1, 2) == 3", ["add(1, 2)"], ["_v0 == 3"]),
        ("assert abs(f(x) - 3.14) < 1e-6", ["f(x)"], ["abs(_v0 - 3.14) < 1e-06"]),
        (
            "import math\nassert math.isclose(f(2), 1.41, rel_tol=1e-3)",
            ["f(2)"],
            ["math.isclose(_v0, 1.41, rel_tol=0.001)"],
        ),
        ("assert sorted(f([3, 1])) == [1, 3]", ["f([3, 1])"], ["sorted(_v0) == [1, 3]"]),
        # a product could be made huge by the program's value: it stays with the piece (the 2 is no answer)
        ("assert f(1) * 2 == 10", ["f(1) * 2"], ["_v0 == 10"]),
        # eval is not the trainer's to run on the program's value
        ("assert eval(f()) == 3", ["eval(f())"], ["_v0 == 3"]),
        ("assert round(f(1), 2) == 0.5", ["round(f(1), 2)"], ["_v0 == 0.5"]),
        (
            "from collections import Counter as C\nassert C(f('aab')) == C(a=2, b=1)",
            ["f('aab')"],
            ["C(_v0) == C(a=2, b=1)"],
        ),
        ("assert f(1) == 2 or g(2) == 3, 'message'", ["f(1)", "g(2)"], ["_v0 == 2 or _v1 == 3"]),
        ("assert [x for x in f(3)] == [1]", ["[x for x in f(3)]"], ["_v0 == [1]"]),
        ("assert f(None) is None\nassert not g()", ["f(None)", "g()"], ["_v0 is None", "not _v1"]),
        ("assert [*f(2), 0] == [1, 2, 0]", ["f(2)"], ["[*_v0, 0] == [1, 2, 0]"]),
    ],
)
def test_the_parts_that_need_the_program_go_to_the_sandbox_and_the_expected_values_stay(test, pieces, asserts):
    v = verdict(test)
    assert (v.pieces, v.asserts) == (pieces, asserts)


HUMANEVAL = """

METADATA = {
    'author': 'jt',
    'dataset': 'test'
}


def check(candidate):
    \"\"\"The checks.\"\"\"
    import math
    assert candidate([1.0, 2.0, 3.9], 0.3) == True
    assert abs(candidate([0.5], 1.0) - 0.5) < 1e-6, "message"
    assert math.isclose(candidate([], 2), 0.25)

check(close)
"""


def test_humaneval_s_check_function_is_judged_as_the_asserts_it_stands_for():
    """HumanEval's shape, worked by hand: the parameter `candidate` read as the entry point `close`, METADATA
    dropped (no assertion reads it), the import kept."""
    v = verdict(HUMANEVAL)
    assert v.imports == ["import math"]
    assert v.pieces == ["close([1.0, 2.0, 3.9], 0.3)", "close([0.5], 1.0)", "close([], 2)"]
    assert v.asserts == ["_v0 == True", "abs(_v1 - 0.5) < 1e-06", "math.isclose(_v2, 0.25)"]


@pytest.mark.parametrize(
    "test",
    [
        "def check(candidate):\n    for x in range(3):\n        assert candidate(x)\ncheck(f)",  # a loop
        "def check(c):\n    assert c(1) == 2\n",  # never called: which function it checks is unknown
        "def check(c):\n    assert c(1) == 2\nassert check\ncheck(f)",  # the function read elsewhere
        "M = 3\ndef check(c):\n    assert c(1) == M\ncheck(f)",  # a constant an assertion reads
        "def check(c, d):\n    assert c(1) == d(1)\ncheck(f, g)",
        "def check(c):\n    assert c(1) == 2\ncheck(f=f)",
        "@decorated\ndef check(c):\n    assert c(1) == 2\ncheck(f)",
        "x = f(3)\nassert x == 9",
        "import numpy as np\nassert f() == np.int64(3)",  # not a module the trainer evaluates
        "import os\nassert os.path.exists(f())",
        "from . import x\nassert f() == x",
        "f(1)",
        "assert (",
    ],
)
def test_other_shapes_run_whole_in_the_sandbox(test):
    assert verdict(test) is None


def test_decoding_gives_back_each_plain_type_exactly():
    assert decode({"l": [1, {"f": "2.5"}, "a", None, True]}) == [1, 2.5, "a", None, True]
    assert decode({"t": [1, {"t": []}]}) == (1, ())
    assert decode({"s": [1, 2]}) == {1, 2} and type(decode({"F": [1]})) is frozenset
    assert decode({"d": [[{"t": [1, 2]}, "x"]]}) == {(1, 2): "x"}
    assert decode({"b": "ff00"}) == b"\xff\x00" and decode({"c": ["1.0", "-2.0"]}) == complex(1, -2)
    assert decode({"r": [0, 10, 3]}) == range(0, 10, 3)
    assert list(decode({"i": [1, 2]})) == [1, 2]
    assert math.isnan(decode({"f": "nan"})) and decode({"f": "-inf"}) == -math.inf
    assert decode(True) is True and type(decode(1)) is int
    with pytest.raises(KeyError):
        decode({"x": 1})
    with pytest.raises(ValueError):
        decode([1])


def line(*values) -> str:
    return "the program's own print\n" + MARK + repr(list(values)) + "\n"


def test_the_verdict_reads_the_last_line_of_values_and_evaluates_the_rest_itself():
    v = verdict("assert add(2, 3) == 5")
    assert v.passes(line(5)) and not v.passes(line(6))
    assert not v.passes(line(True))  # True == 5 is False, as in Python
    assert v.passes(MARK + "[6]\n" + line(5)) and not v.passes(line(5) + MARK + "[6]\n")  # the last line counts
    assert not v.passes("5\n")  # no line of values: the harness never got there
    assert not v.passes(MARK + "[5")  # cut short
    assert not v.passes(MARK + "[__import__('os').system('true')]\n")  # literals only, nothing evaluated
    assert not v.passes(line({"x": 1}))  # an unknown tag
    assert not v.passes(line({"raised": "ZeroDivisionError"}))


def test_a_piece_that_raised_fails_only_the_assertion_that_reads_it():
    short_circuit = verdict("assert f(1) == 2 or g(2) == 3")
    assert short_circuit.passes(line(2, {"raised": "ValueError"}))  # Python never calls g here
    assert not short_circuit.passes(line(1, {"raised": "ValueError"}))


def test_values_compare_as_python_compares_them():
    v = verdict("import math\nassert math.isclose(f(2), 1.41421, rel_tol=1e-4)\nassert isinstance(g(), tuple)")
    assert v.passes(line({"f": "1.4142135"}, {"t": [1]}))
    assert not v.passes(line({"f": "1.5"}, {"t": [1]}))
    assert not v.passes(line({"f": "1.4142135"}, {"l": [1]}))  # a list is not a tuple
    assert verdict("assert f() == float('inf')").passes(line({"f": "inf"}))
    assert not verdict("assert f() == f()").passes(line({"f": "nan"}, {"f": "nan"}))  # nan != nan
    assert verdict("assert list(f()) == [1, 2]").passes(line({"i": [1, 2]}))
    assert not verdict("assert f() == [1, 2]").passes(line({"i": [1, 2]}))  # a generator is not a list


ASSERT_FORMS = [
    (
        "def f(n):\n    return n * n",
        [
            "assert f(3) == 9",
            "import math\nassert math.isclose(f(1.5), 2.25)",
            "assert sorted([f(2), f(1)]) == [1, 4]",
            "assert f(-2) > 3 and f(0) == 0",
        ],
    ),
    (
        "def f(s):\n    return {c: s.count(c) for c in s}",
        [
            "assert f('aab') == {'a': 2, 'b': 1}",
            "from collections import Counter\nassert Counter(f('ab')) == Counter('ab')",
        ],
    ),
    ("def f(n):\n    yield from range(n)", ["assert list(f(3)) == [0, 1, 2]", "assert tuple(f(2)) == (0, 1)"]),
    (
        "def f(x):\n    return None if x < 0 else (x, str(x), [x])",
        ["assert f(-1) is None", "assert f(2) == (2, '2', [2])"],
    ),
    ("def close(xs, t):\n    return xs == [1.0, 2.0, 3.9] or (0.5 if xs else 0.25)", [HUMANEVAL]),
]


@pytest.mark.parametrize("program, tests", ASSERT_FORMS)
def test_right_programs_pass_through_the_sandbox_in_every_form(program, tests):
    from grpo_cli.sandbox.program import Sandbox

    sandbox = Sandbox(2, 256, 64, 16)
    parsed = parse_tests(tests, 0, "tests")
    assert all(kind == "judged" for kind, _, _ in parsed)
    assert [sandbox.passes(program, *t) for t in parsed] == [True] * len(tests)
    wrong = program.replace("return", "return 0 and").replace("yield from range(n)", "yield from range(n + 1)")
    assert not all(sandbox.passes(wrong, *t) for t in parsed)
