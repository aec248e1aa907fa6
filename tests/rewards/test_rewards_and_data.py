import math
import sys

import pandas as pd
import pytest

from grpo_cli.config import DataConfig, RewardConfig
from grpo_cli.data.tasks import PromptOrder, arithmetic_problems, load_data, long_addition_problems
from grpo_cli.errors import GrpoError
from grpo_cli.rewards import BUILDERS, build_reward, score_batch
from grpo_cli.rewards.exact_match import answer_extractor, exact_match_reward, extract_answer, is_correct
from grpo_cli.rewards.length import overlong_penalty
from helpers import checked, refusal
from tiny_models import tiny


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
    [
        ("19", "19", True),
        (" 19 ", "19", True),
        ("19.0", "19", True),
        ("1,204", "1204", True),
        ("18", "19", False),
        ("", "19", False),
        ("119", "19", False),
    ],
)
def test_exact_match_normalises_numbers_but_not_values(completion, answer, want):
    assert is_correct(completion, answer) is want


@pytest.mark.parametrize(
    "completion, answer, want",
    [
        ("#### 72\n\nQuestion: how many pears?", "72", True),  # the model ran on past its answer
        ("#### 72 apples", "72", True),
        ("#### $1,204.", "1204", True),  # GSM8K: the number after ####
        ("#### 72 apples", "72 apples", True),
        ("#### yes", "yes", True),
        ("####\n 72", "72", True),
        ("#### 720", "72", False),
        ("#### 73 apples", "72", False),
        ("#### no", "yes", False),
    ],
)
def test_a_hash_answer_is_the_first_line_after_the_hashes_or_its_first_number(completion, answer, want):
    assert is_correct(completion, answer, "hash") is want
    right = answer_extractor("hash")(completion, answer) == answer  # evaluate's votes agree with the reward
    assert right is want


def test_integers_beyond_float_precision_stay_distinct():
    assert is_correct("9007199254740993", "9007199254740992") is False  # 2**53 + 1 and 2**53
    assert is_correct("12345678901234567891", "12,345,678,901,234,567,891") is True


def test_the_exact_match_reward_is_built_once_per_extract_and_pattern():
    assert exact_match_reward("hash", None) is exact_match_reward("hash", None)
    assert exact_match_reward("regex", "<a>(.*)</a>") is not exact_match_reward("regex", "<b>(.*)</b>")


def test_exact_match_reward_is_one_for_right_and_zero_for_wrong():
    fn = build_reward(RewardConfig())
    assert fn(["1+1=", "1+1="], ["2", "3"], ["2", "2"]) == [1.0, 0.0]


def test_regex_extraction_and_a_regex_that_does_not_compile():
    fn = build_reward(RewardConfig(extract="regex", pattern=r"<a>(\d+)</a>"))
    assert fn(["p"] * 2, ["<a>7</a>", "7"], ["7", "7"]) == [1.0, 0.0]
    assert "reward.pattern '(unclosed' does not compile" in refusal(RewardConfig(extract="regex", pattern="(unclosed"))


def test_a_regex_without_a_capture_group_is_refused_before_the_reward_is_built():
    assert "has no capture group; put the answer part in parentheses" in refusal(
        RewardConfig(extract="regex", pattern=r"\d+")
    )
    with pytest.raises(ValueError, match="no capture group"):  # a caller that skipped the checks: a bug
        build_reward(RewardConfig(extract="regex", pattern=r"\d+"))


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda p, c, a: [math.nan] * len(c), "finite"),
        (lambda p, c, a: [1.0], "returned 1 values for 2"),
        (lambda p, c, a: 1 / 0, "raised ZeroDivisionError"),
    ],
)
def test_a_bad_reward_is_a_clear_error_naming_the_reward(bad, message):
    with pytest.raises(GrpoError, match=message) as e:
        checked("mine", bad)(["p", "p"], ["a", "b"], ["x", "x"])
    assert "'mine'" in str(e.value)


def test_a_built_in_reward_that_fails_keeps_its_own_exception_for_the_trace(monkeypatch):
    """Only user code (reward=python) is turned into a one-sentence error; a built-in term that
    raises is a bug or a resource problem (CUDA out of memory), and the trace is what helps."""

    def out_of_memory(cfg):
        def term(batch):
            raise RuntimeError("CUDA out of memory")

        return term

    monkeypatch.setitem(BUILDERS, "model", out_of_memory)
    with pytest.raises(RuntimeError, match="CUDA out of memory"):
        build_reward(RewardConfig(name="model"))(["p"], ["a"], ["x"])
    with pytest.raises(AssertionError, match="token counts"):  # a caller that passed none: our bug
        build_reward(RewardConfig(name="length"))(["p"], ["a"], ["x"])


def test_arithmetic_task_is_deterministic_and_the_test_split_is_held_out():
    a, b = arithmetic_problems(9, 20, seed=3), arithmetic_problems(9, 20, seed=3)
    assert a["train"]["prompt"] == b["train"]["prompt"] and len(a["test"]) == 20 and len(a["train"]) == 80
    assert not set(a["train"]["prompt"]) & set(a["test"]["prompt"])
    for p, ans in zip(a["test"]["prompt"], a["test"]["answer"]):
        x, y = p.rstrip("=").split("+")
        assert int(ans) == int(x) + int(y)


def test_a_missing_column_names_the_columns_that_exist():
    with pytest.raises(GrpoError, match=r"'question' is missing .* \['prompt', 'answer', 'a', 'b'\]"):
        load_data(DataConfig(prompt_field="question"))


def test_prompt_order_is_a_function_of_seed_and_step_and_covers_an_epoch():
    order = PromptOrder(num_rows=10, batch_size=3, seed=7)
    epoch = [i for s in range(3) for i in order.indices(s)]
    assert len(set(epoch)) == 9  # no repeats within an epoch (one row left over)
    assert PromptOrder(10, 3, 7).indices(4) == order.indices(4)
    assert order.indices(3) != order.indices(0)  # a fresh permutation next epoch


# --- rewards, each against hand-worked values --------------------------------------------------


@pytest.mark.parametrize(
    "length, want",
    # L_max = 10, L_cache = 4: free up to 6 tokens, then -1/4 per token to -1 at 10, -1 beyond.
    [(1, 0.0), (6, 0.0), (7, -0.25), (8, -0.5), (9, -0.75), (10, -1.0), (11, -1.0), (500, -1.0)],
)
def test_overlong_penalty_at_and_between_the_boundaries(length, want):
    assert overlong_penalty(length, max_length=10, buffer=4) == want


def test_overlong_penalty_without_a_buffer_is_a_hard_cut():
    assert [overlong_penalty(n, 10, 0) for n in (9, 10, 11)] == [0.0, 0.0, -1.0]


def test_length_reward_reads_the_token_counts_the_trainer_passes():
    fn = build_reward(RewardConfig(name="length", max_length=10, overlong_buffer=4))
    assert fn(["p"] * 3, ["a", "b", "c"], ["x"] * 3, completion_tokens=[6, 8, 12]) == [0.0, -0.5, -1.0]


def test_length_options_are_checked_before_any_work():
    assert refusal(RewardConfig(name="length", max_length=10, overlong_buffer=20)) == (
        "reward.overlong_buffer=20 must be >= 0 and below reward.max_length=10."
    )


@pytest.mark.parametrize(
    "completion, want",
    [
        ("<think>12+7 is 19</think><answer>19</answer>", 1.0),
        ("<think>two\nlines</think>\n<answer>19</answer>\n", 1.0),  # `.` spans lines; outer whitespace is ignored
        ("<answer>19</answer>", 0.0),
        ("so <think>x</think><answer>19</answer>", 0.0),  # the whole completion must match
        ("<think>x</think><answer>19</answer> and more", 0.0),
        ("", 0.0),
    ],
)
def test_format_reward_matches_the_whole_completion(completion, want):
    assert build_reward(RewardConfig(name="format"))(["p"], [completion], ["19"]) == [want]


def test_a_format_regex_that_does_not_compile_is_a_clear_error():
    assert "reward.format_pattern '(unclosed' does not compile" in refusal(
        RewardConfig(name="format", format_pattern="(unclosed")
    )


def test_combo_adds_weighted_terms_and_reports_each_one():
    fn = build_reward(RewardConfig(name="combo", terms=["exact_match", "format"], weights=[1.0, 0.5]))
    completions = ["<think>x</think><answer>7</answer>", "7", "<think>x</think><answer>8</answer>", "8"]
    total, terms = fn.score(["p"] * 4, completions, ["7"] * 4)
    assert terms == {"exact_match": [1.0, 1.0, 0.0, 0.0], "format": [1.0, 0.0, 1.0, 0.0]}
    assert total == [1.5, 1.0, 0.5, 0.0]
    assert fn(["p"] * 4, completions, ["7"] * 4) == total


def test_combo_without_weights_weighs_every_term_one():
    fn = build_reward(RewardConfig(name="combo", terms=["exact_match", "length"], max_length=4, overlong_buffer=2))
    assert fn(["p"] * 2, ["7", "8"], ["7", "7"], completion_tokens=[3, 5]) == [1.0 - 0.5, 0.0 - 1.0]


@pytest.mark.parametrize(
    "cfg, message",
    [
        (RewardConfig(name="combo"), "reward=combo needs reward.terms"),
        (
            RewardConfig(name="combo", terms=["exact_match", "format"], weights=[1.0]),
            "has 1 values for the 2 reward terms ['exact_match', 'format']",
        ),
        (RewardConfig(name="combo", terms=["format", "format"]), "names a reward twice"),
        (RewardConfig(name="combo", terms=["exact_match", "typo"]), "reward.terms='typo' must be one of exact_match"),
        (RewardConfig(name="exact_match", terms=["format"]), "only read by reward=combo"),
        (RewardConfig(name="model"), "reward=model needs reward.model_path"),
        (RewardConfig(name="python"), "reward=python needs reward.fn"),
    ],
)
def test_reward_config_mistakes_are_one_sentence(cfg, message):
    assert message in refusal(cfg)


def test_a_plain_function_is_scored_without_terms():
    total, terms = score_batch(lambda p, c, a: [len(x) for x in c], ["p", "p"], ["ab", "c"], ["x", "x"])
    assert (total, terms) == ([2, 1], {})


def test_math_reward_compares_answers_symbolically():
    pytest.importorskip("math_verify")
    fn = build_reward(RewardConfig(name="math"))
    completions = ["so the answer is \\boxed{\\frac{1}{2}}", "it is 0.5", "\\boxed{2/4}", "\\boxed{0.6}", "no idea"]
    assert fn(["p"] * 5, completions, ["0.5"] * 5) == [1.0, 1.0, 1.0, 0.0, 0.0]


def test_math_reward_without_math_verify_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)  # makes `import math_verify` raise ImportError
    with pytest.raises(GrpoError, match=r"pip install 'grpo-cli\[math\]'"):
        build_reward(RewardConfig(name="math"))


def write_module(directory, name, source):
    (directory / f"{name}.py").write_text(source)
    return directory


def test_python_reward_gets_prompts_completions_answers_token_counts_and_columns(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(
        str(
            write_module(
                tmp_path,
                "conv_rewards",
                (
                    "seen = {}\n"
                    "def score(prompts, completions, answers, completion_tokens, **columns):\n"
                    "    seen.update(prompts=prompts, completions=completions, answers=answers,\n"
                    "                completion_tokens=completion_tokens, columns=columns)\n"
                    "    return [float(len(c)) for c in completions]\n"
                ),
            )
        )
    )
    fn = build_reward(RewardConfig(name="python", fn="conv_rewards:score"))
    values = fn(["q1", "q1"], ["ab", "c"], [7, 7], completion_tokens=[3, 2], columns={"level": [1, 1]})
    import conv_rewards

    assert values == [2.0, 1.0]
    assert conv_rewards.seen == {
        "prompts": ["q1", "q1"],
        "completions": ["ab", "c"],
        "answers": ["7", "7"],
        "completion_tokens": [3, 2],
        "columns": {"level": [1, 1], "completion_ids": None},
    }
    assert build_reward(RewardConfig(name="python", fn="conv_rewards.score"))(["q"], ["abc"], ["1"]) == [3.0]


@pytest.mark.parametrize(
    "spec, message",
    [
        ("no_such_module_xyz:score", "cannot be imported (ModuleNotFoundError: No module named 'no_such_module_xyz')"),
        ("json:no_such_function", "'json' has no function 'no_such_function'"),
        ("score", "names no function; write it as mypkg.rewards:score or my_rewards.py:score"),
    ],
)
def test_a_python_reward_that_cannot_be_imported_is_a_clear_error(spec, message):
    with pytest.raises(GrpoError) as e:
        build_reward(RewardConfig(name="python", fn=spec))
    assert message in str(e.value)


def test_a_python_reward_module_that_fails_on_import_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(write_module(tmp_path, "broken_rewards", "1 / 0\n")))
    with pytest.raises(GrpoError, match="cannot be imported .ZeroDivisionError"):
        build_reward(RewardConfig(name="python", fn="broken_rewards:score"))


def test_a_reward_that_raises_names_the_failing_completion():
    def picky(prompts, completions, answers):
        return [1.0 / (c != "bad") for c in completions]

    with pytest.raises(GrpoError) as e:
        checked("picky", picky)(["p"] * 3, ["ok", "bad", "ok"], ["x"] * 3)
    assert str(e.value).startswith("Reward 'picky' raised ZeroDivisionError")
    assert "on completion 1 ('bad')" in str(e.value)


@pytest.mark.parametrize(
    "bad, message",
    [
        (lambda p, c, a: 0.5, "returned 0.5, not a list"),
        (lambda p, c, a: ["1.0", 1.0], "returned '1.0' for completion 0"),
        (lambda p, c, a: [1.0, None], "returned None for completion 1"),
        (lambda p, c, a: [1.0, math.inf], "returned inf for completion 1"),
    ],
)
def test_a_reward_of_the_wrong_shape_or_type_is_one_sentence(bad, message):
    with pytest.raises(GrpoError, match=message):
        checked("mine", bad)(["p", "p"], ["a", "b"], ["x", "x"])


def test_numpy_and_torch_values_are_accepted():
    import numpy as np
    import torch

    assert checked("np", lambda p, c, a: np.array([0.5, 1], dtype=np.float32))(["p"] * 2, ["a", "b"], ["x"] * 2) == [
        0.5,
        1.0,
    ]
    assert checked("pt", lambda p, c, a: torch.tensor([0.25, 0.0]))(["p"] * 2, ["a", "b"], ["x"] * 2) == [0.25, 0.0]


def test_a_reward_model_path_that_does_not_exist_is_a_clear_error(tmp_path):
    with pytest.raises(GrpoError, match="reward.model_path=.*/missing does not exist"):
        build_reward(RewardConfig(name="model", model_path=str(tmp_path / "missing")))


# --- data -----------------------------------------------------------------------------------------

ROWS = [{"question": f"what is {a} plus {b}?", "answer": a + b, "level": a % 3} for a in range(6) for b in range(4)]


def files_config(**kw) -> DataConfig:
    return DataConfig(name="files", prompt_field="question", **kw)


def write_rows(path, rows=ROWS):
    frame = pd.DataFrame(rows)
    {
        ".jsonl": lambda: frame.to_json(path, orient="records", lines=True),
        ".csv": lambda: frame.to_csv(path, index=False),
        ".parquet": lambda: frame.to_parquet(path),
        ".json": lambda: frame.to_json(path, orient="records"),
    }[path.suffix]()
    return path


@pytest.mark.parametrize("suffix", [".jsonl", ".json", ".csv", ".parquet"])
def test_a_local_file_is_split_by_a_seeded_test_fraction(tmp_path, suffix):
    path = write_rows(tmp_path / f"rows{suffix}")
    data = load_data(files_config(train_file=str(path), test_size=0.25, seed=1))
    assert (len(data["train"]), len(data["test"])) == (18, 6)
    assert set(data["train"]["question"]) | set(data["test"]["question"]) == {r["question"] for r in ROWS}
    assert not set(data["train"]["question"]) & set(data["test"]["question"])
    assert data["train"].column_names == ["question", "answer", "level"]
    assert all(isinstance(a, str) for a in data["train"]["answer"])  # numbers become text answers
    again = load_data(files_config(train_file=str(path), test_size=0.25, seed=1))
    assert list(again["test"]["question"]) == list(data["test"]["question"])
    assert load_data(files_config(train_file=str(path), test_size=5))["test"].num_rows == 5  # a count


def test_train_and_test_files_and_a_template_over_the_columns(tmp_path):
    train, test = write_rows(tmp_path / "train.jsonl", ROWS[:20]), write_rows(tmp_path / "test.csv", ROWS[20:])
    cfg = files_config(train_file=str(train), test_file=str(test), template="q: {question} (level {level})\na:")
    data = load_data(cfg)
    assert len(data["train"]) == 20 and len(data["test"]) == 4
    assert data["train"][0] == {"question": "q: what is 0 plus 0? (level 0)\na:", "answer": "0", "level": 0}


def test_a_template_over_other_columns_stores_the_prompt_under_the_default_prompt_field(tmp_path):
    """data=files with a template and prompt_field left at `prompt`: the data needs no prompt column."""
    cfg = DataConfig(
        name="files", train_file=str(write_rows(tmp_path / "rows.jsonl")), test_size=4, template="q: {question} a:"
    )
    data = load_data(cfg)
    assert data["train"].column_names == ["question", "answer", "level", "prompt"]
    assert all(p == f"q: {q} a:" for p, q in zip(data["train"]["prompt"], data["train"]["question"]))


def test_a_template_that_is_not_a_format_string_says_how_to_write_literal_braces(tmp_path):
    with pytest.raises(GrpoError) as e:
        load_data(files_config(train_file=str(write_rows(tmp_path / "x.jsonl")), template="{question} {"))
    assert str(e.value).endswith("write columns as {name} and literal braces as {{ }}.")


def test_the_chat_template_wraps_the_prompt_with_the_system_prompt():
    tok = tiny.build_tokenizer()
    tok.chat_template = (
        "{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<a>{% endif %}"
    )
    data = load_data(DataConfig(chat_template=True, system_prompt="add"), tok)
    assert data["train"][0]["prompt"] == "<system>add<user>15+34=<a>"
    with pytest.raises(GrpoError, match="has no chat template"):
        load_data(DataConfig(chat_template=True), tiny.build_tokenizer())
    assert "data.system_prompt is only used with data.chat_template=true" in refusal(DataConfig(system_prompt="add"))


def test_prompts_over_the_token_limit_are_dropped_and_counted():
    said = []
    data = load_data(
        DataConfig(max_operand=12, num_test=20, max_prompt_length=5), tiny.build_tokenizer(), log=said.append
    )
    kept = [p for p in arithmetic_problems(12, 20)["train"]["prompt"] if len(p) <= 5]
    assert list(data["train"]["prompt"]) == kept
    dropped = len(arithmetic_problems(12, 20)["train"]) - len(kept)
    assert any(f"dropped {dropped} of " in s and "max_prompt_length=5" in s for s in said)
    with pytest.raises(GrpoError, match="Every prompt of the 'train' split .* is longer than data.max_prompt_length=2"):
        load_data(DataConfig(max_prompt_length=2), tiny.build_tokenizer(), log=said.append)


def test_the_answer_can_be_extracted_from_a_worked_solution(tmp_path):
    rows = [{"question": "q", "answer": "4 apples and 3 more is 7 apples\n#### 7"}] * 4
    data = load_data(
        files_config(train_file=str(write_rows(tmp_path / "g.jsonl", rows)), test_size=1, answer_extract="hash")
    )
    assert list(data["train"]["answer"]) == ["7"] * 3
    bad = [{"question": "q", "answer": "no hashes here"}] * 4
    with pytest.raises(GrpoError, match="answer_extract=hash finds no answer in row 0"):
        load_data(
            files_config(train_file=str(write_rows(tmp_path / "b.jsonl", bad)), test_size=1, answer_extract="hash")
        )


def test_the_default_arithmetic_data_is_exactly_the_generated_task():
    data, task = load_data(DataConfig()), arithmetic_problems(49, 200, 0)
    for split in ("train", "test"):
        assert data[split].to_dict() == task[split].to_dict()


def test_long_addition_is_deterministic_distinct_and_correct():
    a, b = long_addition_problems(3, 500, 50, seed=2), long_addition_problems(3, 500, 50, seed=2)
    assert a["train"].to_dict() == b["train"].to_dict() and a["test"].to_dict() == b["test"].to_dict()
    prompts = list(a["train"]["prompt"]) + list(a["test"]["prompt"])
    assert len(set(prompts)) == 550 and len(a["test"]) == 50
    for p, ans in zip(prompts, list(a["train"]["answer"]) + list(a["test"]["answer"])):
        x, y = p.rstrip("=").split("+")
        assert int(ans) == int(x) + int(y) and int(x) < 1000 and int(y) < 1000
    assert list(long_addition_problems(3, 500, 50, seed=3)["train"]["prompt"]) != prompts[:500]


def test_long_addition_with_signs_has_their_values_and_operand_columns_and_leaves_a_plus_b_as_it_was():
    """data.signs="+-" (experiment=tool_chain): a+b-c= with its value and columns a, b, c; the a+b= draw is
    unchanged (the first held-out problem of the default draw, as the built-in tool models were trained)."""
    three = long_addition_problems(3, 300, 20, signs="+-")
    rows = three["train"].to_list() + three["test"].to_list()
    assert len({r["prompt"] for r in rows}) == 320 and any(int(r["answer"]) < 0 for r in rows)
    for r in rows:
        assert r["prompt"] == f"{r['a']}+{r['b']}-{r['c']}=" and int(r["answer"]) == r["a"] + r["b"] - r["c"]
        assert max(r["a"], r["b"], r["c"]) < 1000
    assert long_addition_problems(3, 10000, 200)["test"][0] == {
        "prompt": "864+394=",
        "answer": "1258",
        "a": 864,
        "b": 394,
    }
    assert "data.signs='+*' must be 1 to 5 of + and -" in refusal(DataConfig(name="long_addition", signs="+*"))


@pytest.mark.parametrize(
    "cfg, message",
    [
        (DataConfig(name="files"), "data=files needs data.train_file"),
        (DataConfig(name="nope"), "data.name='nope' must be one of arithmetic"),
        (DataConfig(answer_extract="regex"), "data.answer_extract='regex' must be one of hash, boxed, last_number"),
        (DataConfig(name="hub"), "data=hub needs data.hub_name"),
    ],
)
def test_data_settings_are_checked_once_before_any_work(cfg, message):
    assert message in refusal(cfg)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda d: files_config(train_file=str(d / "nope.jsonl")), "nope.jsonl does not exist"),
        (
            lambda d: files_config(train_file=str(write_rows(d / "x.jsonl"))[:-6] + ".txt"),
            "is not a .jsonl, .json, .csv or .parquet file",
        ),
        (
            lambda d: files_config(train_file=str(write_rows(d / "x.jsonl")), answer_field="solution"),
            r"Column 'solution' is missing from the 'train' split of data=files; it has \['question', 'answer', "
            r"'level'\]",
        ),
        (
            lambda d: files_config(train_file=str(write_rows(d / "x.jsonl")), template="{prompt}"),
            "data.template names the column 'prompt'",
        ),
        (
            lambda d: files_config(train_file=str(write_rows(d / "x.jsonl")), template="{question"),
            "is not a format string",
        ),
        (
            lambda d: files_config(train_file=str(write_rows(d / "x.jsonl")), test_size=24),
            "test_size=24 holds out 24 of the 24 rows",
        ),
    ],
)
def test_bad_data_is_one_clear_sentence(tmp_path, make, message):
    with pytest.raises(GrpoError, match=message):
        load_data(make(tmp_path))


def test_an_empty_split_is_named(tmp_path):
    (tmp_path / "empty.csv").write_text("question,answer\n")
    cfg = files_config(train_file=str(write_rows(tmp_path / "x.jsonl")), test_file=str(tmp_path / "empty.csv"))
    with pytest.raises(GrpoError, match="test_file=.*empty.csv has no rows"):
        load_data(cfg)
    from datasets import Dataset

    from grpo_cli.data.tasks import prepare

    with pytest.raises(GrpoError, match="The 'test' split of data=files is empty"):
        prepare(Dataset.from_dict({"question": [], "answer": []}), "test", files_config(), None, print)


def test_the_ranks_shares_of_a_step_are_the_one_process_batch_with_the_same_group_seeds():
    rows = arithmetic_problems(9, 20)["train"]
    whole = PromptOrder(len(rows), 8, seed=3, rows=rows).share(5)
    parts = [PromptOrder(len(rows), 8, seed=3, rank=r, world_size=2, rows=rows).share(5) for r in range(2)]
    assert parts[0].prompts + parts[1].prompts == whole.prompts and parts[0].seeds + parts[1].seeds == whole.seeds
    assert len(set(whole.seeds)) == 8  # every group its own noise
    refill = PromptOrder(len(rows), 8, seed=3, rows=rows).refill(5)
    assert (
        refill(1).prompts == refill(1).prompts and refill(1).seeds != refill(2).seeds
    )  # a round is a function of (step, round)
