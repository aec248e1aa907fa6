"""The `data` and `sampler` groups: what the model is prompted with, and how its completions are drawn."""

from __future__ import annotations

import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from grpo_cli.config.declare import Settings, rule, setting

SOURCES = ("arithmetic", "long_addition", "links", "code", "files", "hub", "reasoning_gym", "none")
FILE_FORMATS = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}  # data=files, by suffix
ANSWER_EXTRACTS = ("hash", "boxed", "last_number")  # the reference answer inside a worked solution


def source(*names: str):
    """`when`: the key is read by these data sources."""
    return lambda c: c.data.name in names


def _data_file(key: str):
    return lambda v: (
        None
        if Path(v).suffix.lower() in FILE_FORMATS
        else (f"data.{key}={v} is not a .jsonl, .json, .csv or .parquet file")
    )


def _template(value) -> str | None:
    try:
        names = [f for _, f, _, _ in string.Formatter().parse(value) if f is not None]
    except ValueError as e:
        return f"data.template {value!r} is not a format string ({e}): write columns as {{name}}, braces as {{{{ }}}}"
    return None if all(names) else f"data.template {value!r} has an empty {{}}: name a column, as in {{question}}"


@dataclass
class DataConfig(Settings):
    name: str = setting(
        "arithmetic",
        "the prompts: a built-in task, files, a hub dataset, or none (an environment writes each)",
        choices=SOURCES,
    )
    max_operand: int = setting(49, "arithmetic: operands are 0..max_operand", low=1, when=source("arithmetic"))
    num_test: int = setting(200, "problems held out as the test split (never trained on)")
    seed: int = setting(0, "seed of the problems and of the train/test split")
    prompt_field: str = setting("prompt", "column holding the prompt")
    answer_field: str = setting("answer", "column holding the reference answer")
    digits: int = setting(3, "long_addition: operands are 0..10^digits - 1", low=1, when=source("long_addition"))
    signs: str = setting("+", 'long_addition: the signs between the operands: "+" is a+b=, "+-" is a+b-c=')
    hops: int = setting(
        2, 'links: links to follow per problem (the number of ">" in the prompt)', low=1, high=8, when=source("links")
    )
    num_train: int = setting(
        10000, "training problems (long_addition, links, none)", low=1, when=source("long_addition", "links", "none")
    )
    task: Optional[str] = setting(
        None, "reasoning_gym: the task, e.g. basic_arithmetic (docs/how-to/ecosystem.md)", when=source("reasoning_gym")
    )
    size: int = setting(1000, "reasoning_gym: problems generated to train on", low=1, when=source("reasoning_gym"))
    options: Any = setting(
        None,
        "reasoning_gym: the task's own options, {name: value, ...} (its config's fields)",
        when=source("reasoning_gym"),
    )
    train_file: Optional[str] = setting(
        None, "files: path of the training rows (required)", check=_data_file("train_file"), when=source("files")
    )
    test_file: Optional[str] = setting(
        None,
        "files: path of the held-out rows; null = hold out test_size rows",
        check=_data_file("test_file"),
        when=source("files"),
    )
    test_size: float = setting(
        0.1, "without a test split: a fraction (< 1) or a count (>= 1) of rows held out", low=0, above=True
    )
    hub_name: Optional[str] = setting(None, "hub: dataset name, e.g. openai/gsm8k (required)")
    hub_config: Optional[str] = setting(None, "hub: dataset config (subset), e.g. main")
    train_split: str = setting("train", "hub: split to train on")
    test_split: Optional[str] = setting("test", "hub: held-out split; null = hold out test_size rows of train_split")
    answer_extract: Optional[str] = setting(
        None,
        "take the answer out of the answer column: hash (after ####) | boxed | last_number (null = as is)",
        choices=ANSWER_EXTRACTS,
    )
    template: Optional[str] = setting(
        None, 'format string over the columns, e.g. "Compute {prompt}" (null = the prompt as is)', check=_template
    )
    chat_template: bool = setting(False, "wrap the prompt in the tokenizer's chat template (instruct models)")
    system_prompt: Optional[str] = setting(None, "system message, with chat_template=true")
    max_prompt_length: Optional[int] = setting(
        None, "drop (and count) prompts longer than this many tokens (null = keep all)", low=1
    )


@rule("data.name", "data.num_test", "data.max_operand", "data.digits", "data.signs")
def _sizes(p, c) -> None:
    d = c.data
    if d.name == "arithmetic":
        p.need(
            0 < d.num_test < (d.max_operand + 1) ** 2,
            f"data.num_test={d.num_test} must be between 1 and "
            f"{(d.max_operand + 1) ** 2 - 1} for data.max_operand={d.max_operand}",
        )
    if d.name in ("none", "links", "long_addition", "reasoning_gym"):
        p.need(d.num_test >= 1, f"data.num_test={d.num_test} must be >= 1")
    if d.name == "long_addition":
        signs = str(d.signs)
        p.need(
            1 <= len(signs) <= 5 and set(signs) <= {"+", "-"},
            f'data.signs={signs!r} must be 1 to 5 of + and - (the signs between the operands, e.g. "+-" for a+b-c)',
        )
        distinct = 10 ** ((len(signs) + 1) * max(d.digits, 0)) // 2
        p.need(
            d.num_train + d.num_test <= distinct,
            f"data.num_train + data.num_test = {d.num_train + d.num_test} "
            f"must be at most {distinct}, half the distinct problems of data.digits={d.digits}"
            + (f" and data.signs={signs!r}" if signs != "+" else ""),
        )
    if d.name == "code":
        p.need(
            0 < d.num_test < 62, f"data.num_test={d.num_test} must be between 1 and 61, of the 62 problems of data=code"
        )


@rule("data.name", "data.train_file", "data.hub_name", "data.task", "data.options")
def _source_needs(p, c) -> None:
    d = c.data
    if d.name == "files":
        p.need(bool(d.train_file), "data=files needs data.train_file=PATH (a .jsonl, .json, .csv or .parquet file)")
    if d.name == "hub":
        p.need(bool(d.hub_name), "data=hub needs data.hub_name, a dataset name such as openai/gsm8k")
    if d.name == "reasoning_gym":
        p.need(bool(d.task), "data=reasoning_gym needs data.task, a reasoning-gym task such as basic_arithmetic")
        p.need(
            d.options is None or isinstance(d.options, Mapping),
            f"data.options={d.options!r} must be a mapping of the task's options, e.g. data.options={{min_terms:2}}",
        )


@rule("data.system_prompt", "data.chat_template", "data.prompt_field", "data.answer_field")
def _prompts(p, c) -> None:
    d = c.data
    p.need(
        d.system_prompt is None or d.chat_template,
        "data.system_prompt is only used with data.chat_template=true; set it, or put the text in data.template",
    )
    p.need(bool(d.prompt_field) and bool(d.answer_field), "data.prompt_field and data.answer_field must name columns")


@dataclass
class SamplerConfig(Settings):
    """How completions are drawn: the `sampler` group, and what a generator is asked to sample with."""

    max_new_tokens: int = setting(
        6, 'completion length cap; completions that hit it without EOS are "truncated"', low=1
    )
    temperature: float = setting(
        1.0,
        "softmax temperature; log-probabilities in the loss use the same tempered "
        "policy (0: the most likely token, for `grpo sample` only)",
        low=0,
    )
    top_p: float = setting(1.0, "nucleus sampling (1.0 = off)", low=0, above=True, high=1)
    top_k: int = setting(0, "top-k sampling (0 = off)", low=0)
    group_size: int = setting(8, "G: completions per prompt (the group whose rewards are normalised together)", low=1)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @property
    def truncates(self) -> bool:
        """Sampling draws from a kept set only (top-k or top-p), not from the policy's whole distribution."""
        return not self.greedy and (self.top_p < 1.0 or 0 < self.top_k)


@rule("sampler.temperature")
def _sampled(p, c) -> None:
    t = c.sampler.temperature
    sampling = hasattr(c, "trainer") or getattr(c, "samples", 0) > 0  # training, or evaluate's samples
    p.need(
        t != 0 or not sampling,
        f"sampler.temperature={t} must be > 0 where completions are sampled (a greedy group is one completion G times)",
    )
