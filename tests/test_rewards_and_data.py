import math

import pytest

from grpo_cli.config import DataConfig, RewardConfig
from grpo_cli.data import PromptOrder, arithmetic_problems, load_data
from grpo_cli.errors import GrpoError
from grpo_cli.rewards import build_reward, checked
from grpo_cli.rewards.exact_match import extract_answer, is_correct


@pytest.mark.parametrize(
    "text, extract, want",
    [
        ("19", "last_number", "19"),
        ("it is 1,204 or 17", "last_number", "17"),
        ("no digits", "last_number", None),
        ("work... #### 72", "hash", " 72"),
        ("so \\boxed{\\frac{1}{2}} done", "boxed", "\\frac{1}{2}"),
        ("exactly this", "full", "exactly this"),
    ],
)
def test_answer_extraction(text, extract, want):
    assert extract_answer(text, extract) == want


@pytest.mark.parametrize(
    "completion, answer, want",
    [("19", "19", True), (" 19 ", "19", True), ("19.0", "19", True), ("1,204", "1204", True),
     ("18", "19", False), ("", "19", False), ("119", "19", False)],
)
def test_exact_match_normalises_numbers_but_not_values(completion, answer, want):
    assert is_correct(completion, answer) is want


def test_exact_match_reward_is_one_for_right_and_zero_for_wrong():
    fn = build_reward(RewardConfig())
    assert fn(["1+1=", "1+1="], ["2", "3"], ["2", "2"]) == [1.0, 0.0]


def test_regex_extraction_and_a_regex_that_does_not_compile():
    fn = build_reward(RewardConfig(extract="regex", pattern=r"<a>(\d+)</a>"))
    assert fn(["p"] * 2, ["<a>7</a>", "7"], ["7", "7"]) == [1.0, 0.0]
    with pytest.raises(GrpoError, match="does not compile"):
        build_reward(RewardConfig(extract="regex", pattern="(unclosed"))


@pytest.mark.parametrize(
    "bad, message",
    [(lambda p, c, a: [math.nan] * len(c), "finite"),
     (lambda p, c, a: [1.0], "returned 1 values for 2"),
     (lambda p, c, a: 1 / 0, "raised ZeroDivisionError")],
)
def test_a_bad_reward_is_a_clear_error_naming_the_reward(bad, message):
    with pytest.raises(GrpoError, match=message) as e:
        checked("mine", bad)(["p", "p"], ["a", "b"], ["x", "x"])
    assert "'mine'" in str(e.value)


def test_arithmetic_task_is_deterministic_and_the_test_split_is_held_out():
    a, b = arithmetic_problems(9, 20, seed=3), arithmetic_problems(9, 20, seed=3)
    assert a["train"]["prompt"] == b["train"]["prompt"] and len(a["test"]) == 20 and len(a["train"]) == 80
    assert not set(a["train"]["prompt"]) & set(a["test"]["prompt"])
    for p, ans in zip(a["test"]["prompt"], a["test"]["answer"]):
        x, y = p.rstrip("=").split("+")
        assert int(ans) == int(x) + int(y)


def test_a_missing_column_names_the_columns_that_exist():
    with pytest.raises(GrpoError, match=r"'question' is missing .* \['prompt', 'answer'\]"):
        load_data(DataConfig(prompt_field="question"))


def test_prompt_order_is_a_function_of_seed_and_step_and_covers_an_epoch():
    order = PromptOrder(num_rows=10, batch_size=3, seed=7)
    epoch = [i for s in range(3) for i in order.indices(s)]
    assert len(set(epoch)) == 9  # no repeats within an epoch (one row left over)
    assert PromptOrder(10, 3, 7).indices(4) == order.indices(4)
    assert order.indices(3) != order.indices(0)  # a fresh permutation next epoch
