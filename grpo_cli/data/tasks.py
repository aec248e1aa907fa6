"""Prompt data: built-in generated tasks, and local files and hub names read through `datasets`, as a dict
of `train` and `test` splits (each a `Rows`, rows.py), and the order in which training draws prompts.

After `load_data`, column `data.prompt_field` of every split holds the text the model is prompted
with (`data.template` rendered, the chat template applied) and `data.answer_field` the reference
answer as text (after `data.answer_extract`); every other column is kept as loaded, for rewards. Data
with no `answer` column (the default answer_field) loads too, its rows answerless (NO_ANSWERS): no column
is required beyond what the rewards read, and a reward that reads answers is refused (check_answers).
"""

from __future__ import annotations

import random
import sys
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Callable, Sequence

import torch

from grpo_cli.config.data import FILE_FORMATS
from grpo_cli.config.reward import ANSWER_READERS
from grpo_cli.data.prompts import USER_PROMPT, check_conversations, is_conversation, render_prompts, user_text
from grpo_cli.data.rows import Rows
from grpo_cli.errors import GrpoError, first_line
from grpo_cli.rewards import PROMPT_MESSAGES  # where rewards read chat prompts
from grpo_cli.rewards.exact_match import extract_answer
from grpo_cli.samples.rollout import group_seed

OPERANDS = "abcdef"  # the operand columns of the addition tasks (data.signs: 1 to 5 signs)


def addition_split(draws: Sequence[tuple[int, ...]], signs: str = "+") -> Rows:
    """Prompts `a+b=` (or `a+b-c=`, ...: `signs` between the operands) with their values; the operands are
    columns too (a, b, c, ...), for templates such as `data.template="What is {a} + {b}?"` (instruct models)."""

    def text(t):
        return str(t[0]) + "".join(sign + str(x) for sign, x in zip(signs, t[1:])) + "="

    def value(t):
        return t[0] + sum(x if sign == "+" else -x for sign, x in zip(signs, t[1:]))

    return Rows(
        {
            "prompt": [text(t) for t in draws],
            "answer": [str(value(t)) for t in draws],
            **{name: [t[i] for t in draws] for i, name in enumerate(OPERANDS[: len(signs) + 1])},
        }
    )


def arithmetic_problems(max_operand: int = 49, num_test: int = 200, seed: int = 0) -> dict[str, Rows]:
    """Every `a+b=` with 0 <= a, b <= max_operand, split deterministically into train and test.

    The test problems are never trained on, so held-out accuracy measures addition, not recall.
    """
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if not 0 < num_test < len(pairs):  # checks.check_data refuses it
        raise ValueError(f"num_test={num_test} must be between 1 and {len(pairs) - 1}.")
    random.Random(seed).shuffle(pairs)
    return {"train": addition_split(pairs[num_test:]), "test": addition_split(pairs[:num_test])}


DEFAULT_ANSWER_FIELD = "answer"  # data.answer_field's default: missing, the rows have no answers; named, it must exist
NO_ANSWERS = "_answer"  # the answer column of rows that have none: hidden, like every column starting with _


def answer_column(column_names, cfg) -> str:
    """The column holding a prepared split's answers: data.answer_field, or NO_ANSWERS for data without it."""
    return cfg.answer_field if cfg.answer_field in column_names else NO_ANSWERS


def check_answers(column_names, cfg, reward, correct: str) -> None:
    """One sentence when the data has no answers and the reward's terms (or reward.correct=answer) read them."""
    if answer_column(column_names, cfg) != NO_ANSWERS:
        return
    reading = [t for t in reward.terms if t in ANSWER_READERS] + (
        ["reward.correct=answer"] if correct == "answer" else []
    )
    if not reading:
        return
    if cfg.name == "none":
        raise GrpoError(
            f"data=none has no answers for {', '.join(reading)} to compare with, and the environment does "
            "not score its episodes; give it a get_reward(), or name a reward that reads no answer (reward=python)."
        )
    shown = [c for c in column_names if not c.startswith("_")]
    raise GrpoError(
        f"Column {cfg.answer_field!r} is missing from data={cfg.name} (it has {shown}), and "
        f"{', '.join(reading)} compares with it; set data.answer_field to the column holding the answers, "
        "or use a reward that reads none (reward=python, an environment's get_reward())."
    )


def empty_prompts(num_train: int, num_test: int) -> dict[str, Rows]:
    """data=none: empty user messages, for an environment's reset() to write each episode's observation into."""

    def rows(n: int) -> Rows:
        return Rows({"prompt": [[{"role": "user", "content": ""}] for _ in range(n)], NO_ANSWERS: [""] * n})

    return {"train": rows(num_train), "test": rows(num_test)}


def long_addition_problems(
    digits: int = 3, num_train: int = 10000, num_test: int = 200, seed: int = 0, signs: str = "+"
) -> dict[str, Rows]:
    """`a+b=` (`signs="+-"`: `a+b-c=`) with operands of up to `digits` digits: distinct problems drawn by a
    seeded generator, the first `num_test` held out. Harder than `arithmetic`, so the reward climbs over
    many steps."""
    limit, terms = 10**digits, len(signs) + 1
    if not (
        digits >= 1
        and num_train >= 1
        and num_test >= 1
        and 2 <= terms <= len(OPERANDS)
        and set(signs) <= {"+", "-"}
        and num_train + num_test <= limit**terms // 2
    ):  # checks.check_data
        raise ValueError(
            f"digits={digits}, num_train={num_train}, num_test={num_test}, signs={signs!r} are out of range."
        )
    rng, seen = random.Random(seed), set()
    drawn: list[tuple[int, ...]] = []
    while len(drawn) < num_train + num_test:
        draw = tuple(rng.randrange(limit) for _ in range(terms))
        if draw not in seen:
            seen.add(draw)
            drawn.append(draw)
    return {"train": addition_split(drawn[num_test:], signs), "test": addition_split(drawn[:num_test], signs)}


LETTERS = "abcdefghijklmnopqrstuvwxyz"


def link_problems(hops: int = 2, num_train: int = 10000, num_test: int = 200, seed: int = 0) -> dict[str, Rows]:
    """`c>>=`: where the letter c leads after `hops` links (one `>` each) of its row's own table, column `links`
    (26 letters: letter i links to links[i], never to itself), which the prompt does not show: an agent must
    look each link up, each lookup's key being the last one's result (env=links). Answer: the letter reached.
    Tables and start letters are drawn by a seeded generator, the first `num_test` rows held out."""
    if not (1 <= hops <= 8 and num_train >= 1 and num_test >= 1):  # checks.check_data
        raise ValueError(f"hops={hops}, num_train={num_train}, num_test={num_test} are out of range.")
    rng, rows = random.Random(seed), []
    for _ in range(num_train + num_test):
        links = [rng.choice([b for b in LETTERS if b != a]) for a in LETTERS]
        start = at = rng.choice(LETTERS)
        for _ in range(hops):
            at = links[LETTERS.index(at)]
        rows.append((start + ">" * hops + "=", at, start, "".join(links)))

    def split(part):
        return Rows({name: [r[i] for r in part] for i, name in enumerate(("prompt", "answer", "start", "links"))})

    return {"train": split(rows[num_test:]), "test": split(rows[:num_test])}


def read_file(path: str, key: str):
    """One local .jsonl/.json/.csv/.parquet file as a `datasets.Dataset`; `key` names the option it came from."""
    local = Path(path).expanduser()
    fmt = FILE_FORMATS.get(local.suffix.lower())
    if fmt is None:
        raise GrpoError(f"data.{key}={path} is not a .jsonl, .json, .csv or .parquet file.")
    if not local.is_file():
        raise GrpoError(f"data.{key}={path} does not exist.")
    if local.stat().st_size == 0 or (fmt == "parquet" and _parquet_rows(local) == 0):
        raise GrpoError(f"data.{key}={path} has no rows; give it some.")
    from datasets import load_dataset
    from datasets.utils.tqdm import are_progress_bars_disabled, disable_progress_bars, enable_progress_bars

    quiet = not are_progress_bars_disabled()
    if quiet:  # reading a local file takes a moment; its "Generating train split" bar is noise
        disable_progress_bars()
    try:
        return load_dataset(fmt, data_files=str(local), split="train")
    except Exception as e:  # a malformed file: the parser's message (the cause) says where
        if "corresponds to no data" in str(e):  # how `datasets` reports a csv with a header only
            raise GrpoError(f"data.{key}={path} has no rows; give it some.") from None
        raise GrpoError(f"Could not read data.{key}={path} as {fmt} ({first_line(e.__cause__ or e)}).") from None
    finally:
        if quiet:
            enable_progress_bars()


def _parquet_rows(path: Path) -> int | None:
    import pyarrow.parquet as pq

    try:
        return pq.read_metadata(path).num_rows
    except Exception:  # not parquet after all: let `datasets` say so
        return None


def read_files(cfg) -> dict:
    train = read_file(cfg.train_file, "train_file")
    if cfg.test_file:
        return {"train": train, "test": read_file(cfg.test_file, "test_file")}
    return split_off_test(train, cfg, f"data.train_file={cfg.train_file}")


def read_hub(cfg) -> dict:
    """A hub dataset's train and test splits, `datasets.Dataset`s (or the train split cut in two when
    test_split=null)."""
    from datasets import load_dataset

    what = cfg.hub_name + (f" ({cfg.hub_config})" if cfg.hub_config else "")
    from grpo_cli.models.hub import go_offline, hub_unreachable

    unreachable = hub_unreachable()
    if unreachable:  # read the local datasets cache only, instead of a minute of retries
        go_offline()
    try:
        loaded = load_dataset(cfg.hub_name, cfg.hub_config)
    except Exception as e:  # unreachable hub, offline mode, a wrong name or config: the cause is in its message
        if unreachable:
            raise GrpoError(
                f"Could not load the dataset {what}: the Hugging Face hub cannot be reached ({unreachable}) "
                "and the dataset is not in the local cache; connect to the network, or use data=files "
                "with a local copy."
            ) from None
        raise GrpoError(
            f"Could not load the dataset {what} from the Hugging Face hub ({first_line(e)}); check the name, "
            "data.hub_config and the network (offline mode, HF_HUB_OFFLINE=1, finds cached datasets only), or use "
            "data=files."
        ) from None
    for split in (cfg.train_split, cfg.test_split):
        if split is not None and split not in loaded:
            raise GrpoError(
                f"The dataset {what} has no split {split!r}; it has {list(loaded)}: set "
                "data.train_split/data.test_split."
            )
    if cfg.test_split is None:
        return split_off_test(loaded[cfg.train_split], cfg, what)
    return {"train": loaded[cfg.train_split], "test": loaded[cfg.test_split]}


def split_off_test(rows, cfg, source: str) -> dict:
    """A seeded held-out split of one dataset: `test_size` rows, or that fraction of them when < 1."""
    n, size = len(rows), cfg.test_size
    count = round(size * n) if 0 < size < 1 else int(size)
    if not 0 < count < n:
        raise GrpoError(
            f"data.test_size={size} holds out {count} of the {n} rows of {source}, leaving an empty split; "
            "give a fraction in (0, 1) or a count below the number of rows."
        )
    order = list(range(n))
    random.Random(cfg.seed).shuffle(order)
    return {"train": rows.select(order[count:]), "test": rows.select(order[:count])}


def prepare(
    split, split_name: str, cfg, tokenizer, log: Callable[[str], None], tools: list[dict] | None = None
) -> Rows:
    """The split (Rows, or a `datasets.Dataset` read from a file or the hub) as Rows, with rendered prompts and
    text answers, prompts over max_prompt_length dropped."""
    where = f"the {split_name!r} split of data={cfg.name}"
    if len(split) == 0:
        raise GrpoError(f"{where[0].upper()}{where[1:]} is empty; give it some rows.")
    # With a template the prompt is built from the columns it names and stored under prompt_field. No answer
    # column under the default name: rows without answers (TRL requires none), refused later if a reward reads them.
    answerless = cfg.answer_field == DEFAULT_ANSWER_FIELD and cfg.answer_field not in split.column_names
    required = {
        **({"prompt_field": cfg.prompt_field} if cfg.template is None else {}),
        **({} if answerless else {"answer_field": cfg.answer_field}),
    }
    for key, column in required.items():
        if column not in split.column_names:
            raise GrpoError(
                f"Column {column!r} is missing from {where}; it has {split.column_names}: "
                f"set data.{key} to one of them."
            )
    columns = split.to_dict()
    rows = [dict(zip(columns, values)) for values in zip(*columns.values())]
    check_required(columns, rows, list(required.values()), where)
    answers = [""] * len(rows) if answerless else text_answers(rows, cfg, where)
    conversational = cfg.template is None and any(is_conversation(row[cfg.prompt_field]) for row in rows)
    if conversational:
        check_conversations(rows, cfg, where)
        columns[PROMPT_MESSAGES] = [row[cfg.prompt_field] for row in rows]  # what a TRL reward reads as `prompts`
    rendered = render_prompts(rows, cfg, tokenizer, tools)
    if cfg.chat_template:  # what the user wrote, for tables and logs (columns starting with _ never reach a reward)
        plain = SimpleNamespace(
            template=cfg.template, prompt_field=cfg.prompt_field, chat_template=False, system_prompt=None
        )
        columns[USER_PROMPT] = (
            [user_text(row[cfg.prompt_field]) for row in rows] if conversational else render_prompts(rows, plain, None)
        )
    columns[cfg.prompt_field], columns[NO_ANSWERS if answerless else cfg.answer_field] = rendered, answers

    if cfg.max_prompt_length is not None:
        columns = short_enough(columns, cfg, tokenizer, where, log)
    return Rows(columns)


def text_answers(rows: list[dict], cfg, where: str) -> list[str]:
    """Each row's answer as text, read out by data.answer_extract when it is set."""
    answers = [str(row[cfg.answer_field]) for row in rows]
    if cfg.answer_extract is None:
        return answers
    extracted = [extract_answer(a, cfg.answer_extract) for a in answers]
    for i, a in enumerate(extracted):
        if a is None:
            raise GrpoError(
                f"data.answer_extract={cfg.answer_extract} finds no answer in row {i} of {where} ({answers[i][:60]!r})."
            )
    return [a.strip() for a in extracted if a is not None]  # none is, as checked above


def short_enough(columns: dict[str, list], cfg, tokenizer, where: str, log) -> dict[str, list]:
    """The rows whose rendered prompt has at most data.max_prompt_length tokens (the ids generation sees)."""
    if tokenizer is None:
        raise GrpoError("data.max_prompt_length needs the model's tokenizer to count tokens.")
    from grpo_cli.data.prompts import encode_prompts

    lengths = [len(ids) for ids in encode_prompts(tokenizer, columns[cfg.prompt_field], cfg.chat_template)]
    keep = [i for i, n in enumerate(lengths) if n <= cfg.max_prompt_length]
    if len(keep) == len(lengths):
        return columns
    limit = f"data.max_prompt_length={cfg.max_prompt_length} tokens"
    log(f"dropped {len(lengths) - len(keep)} of {len(lengths)} prompts of {where}: longer than {limit}.")
    if not keep:
        raise GrpoError(f"Every prompt of {where} is longer than {limit}; raise it.")
    return {k: [v[i] for i in keep] for k, v in columns.items()}


def check_required(columns: dict[str, list], rows: list[dict], required: list[str], where: str) -> None:
    """Every row has a value in each required column, all of one type."""
    for i, row in enumerate(rows):
        for column in required:
            if row[column] is None:
                raise GrpoError(f"Row {i} of {where} has no value in column {column!r}; fill it or drop the row.")
    for column in required:  # a JSON column of mixed types loads as it is; "5" and 5 are not one answer
        first_of: dict[str, int] = {}
        for i, v in enumerate(columns[column]):
            first_of.setdefault(type(v).__name__, i)
        if len(first_of) > 1:
            kinds = ", ".join(f"{k} in row {i}" for k, i in first_of.items())
            raise GrpoError(
                f"Column {column!r} of {where} mixes value types ({kinds}); give every row the same type "
                "(quote numbers in JSON if they are text)."
            )


def load_data(
    cfg, tokenizer=None, log: Callable[[str], None] | None = None, tools: list[dict] | None = None
) -> dict[str, Rows]:
    """The data group's train and test splits, prompts rendered for `tokenizer`'s model (which the
    chat template and max_prompt_length need), with `tools` (JSON schemas) shown by the chat template;
    `log` reports dropped prompts (default: stderr)."""
    log = log or (lambda message: print(message, file=sys.stderr))
    if cfg.name == "arithmetic":
        data = arithmetic_problems(cfg.max_operand, cfg.num_test, cfg.seed)
    elif cfg.name == "long_addition":
        data = long_addition_problems(cfg.digits, cfg.num_train, cfg.num_test, cfg.seed, cfg.signs)
    elif cfg.name == "links":
        data = link_problems(cfg.hops, cfg.num_train, cfg.num_test, cfg.seed)
    elif cfg.name == "code":
        from grpo_cli.data.code_tasks import code_problems

        data = code_problems(cfg.num_test, cfg.seed)
    elif cfg.name == "none":
        data = empty_prompts(cfg.num_train, cfg.num_test)
    elif cfg.name == "files":
        data = read_files(cfg)
    elif cfg.name == "hub":
        data = read_hub(cfg)
    elif cfg.name == "reasoning_gym":
        from grpo_cli.data.reasoning_gym import reasoning_gym_problems

        data = reasoning_gym_problems(cfg)
    else:
        raise ValueError(f"unknown data source {cfg.name!r} (checks.check_data lists them).")
    return {name: prepare(split, name, cfg, tokenizer, log, tools) for name, split in data.items()}


@dataclass
class PromptBatch:
    """The prompts of one sampling round, with what rewards need and each group's sampling seed."""

    prompts: list[str]
    answers: list[str]
    seeds: list[int]
    columns: dict[str, list] = field(default_factory=dict)  # dataset columns, one entry per prompt


class PromptOrder:
    """Which prompts each step draws, and this rank's share of them. The order is a fresh seeded
    permutation per epoch, so step k's batch is a pure function of (seed, k) and a resumed run needs
    only the step to continue it. Every group's sampling noise is seeded by (run seed, step, its
    position in the whole batch, round), so the groups are the same on 1 or N processes."""

    def __init__(
        self,
        num_rows: int,
        batch_size: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        rows=None,
        fields: tuple[str, str] = ("prompt", "answer"),
    ):
        if batch_size > num_rows:
            raise GrpoError(f"trainer.prompts_per_step={batch_size} exceeds the {num_rows} training prompts; lower it.")
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self.per_epoch = num_rows // batch_size  # the remainder of each epoch is skipped
        self.per_rank, self.first = batch_size // world_size, rank * (batch_size // world_size)
        self.rows, self.fields = rows, fields  # the training split, and its prompt and answer columns

    def _generator(self, *parts: int) -> torch.Generator:
        """The one seeding rule of the prompt draws: run seed, then epoch (or step and round)."""
        return torch.Generator().manual_seed(self.seed * 1_000_003 + sum(parts))

    def indices(self, step: int) -> list[int]:
        """The rows of step `step + 1`'s prompts (steps count from 0 here), the whole batch."""
        epoch, k = divmod(step, self.per_epoch)
        perm = torch.randperm(self.num_rows, generator=self._generator(epoch))
        return perm[k * self.batch_size : (k + 1) * self.batch_size].tolist()

    def share(self, step: int, indices: list[int] | None = None, round_: int = 0) -> PromptBatch:
        """This rank's slice of step `step`'s prompts (positions rank * n_local ...), as a PromptBatch."""
        indices = self.indices(step - 1) if indices is None else indices
        first, n = self.first, self.per_rank
        picked = self.rows[indices[first : first + n]]
        seeds = [group_seed(self.seed, step, first + i, round_) for i in range(n)]
        return PromptBatch(picked[self.fields[0]], picked[self.fields[1]], seeds, picked)

    def refill(self, step: int):
        """More prompts for dynamic sampling: round r draws a batch with replacement, seeded by (step, r)."""

        def draw(round_: int) -> PromptBatch:
            g = self._generator(step * 1_009, round_)
            drawn = torch.randint(self.num_rows, (self.batch_size,), generator=g).tolist()
            return self.share(step, drawn, round_)

        return draw
