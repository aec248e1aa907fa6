"""Prompt datasets as `datasets.DatasetDict`s with `prompt` and `answer` columns, and their order."""

from __future__ import annotations

import random

import torch
from datasets import Dataset, DatasetDict

from grpo_cli.errors import GrpoError


def arithmetic_problems(max_operand: int = 49, num_test: int = 200, seed: int = 0) -> DatasetDict:
    """Every `a+b=` with 0 <= a, b <= max_operand, split deterministically into train and test.

    The test problems are never trained on, so held-out accuracy measures addition, not recall.
    """
    pairs = [(a, b) for a in range(max_operand + 1) for b in range(max_operand + 1)]
    if not 0 < num_test < len(pairs):
        raise GrpoError(
            f"data.num_test={num_test} must be between 1 and {len(pairs) - 1} for max_operand={max_operand}."
        )
    random.Random(seed).shuffle(pairs)

    def split(rows: list[tuple[int, int]]) -> Dataset:
        return Dataset.from_dict(
            {"prompt": [f"{a}+{b}=" for a, b in rows], "answer": [str(a + b) for a, b in rows]}
        )

    return DatasetDict(train=split(pairs[num_test:]), test=split(pairs[:num_test]))


def load_data(cfg) -> DatasetDict:
    """The data group's DatasetDict, checked for the configured prompt and answer columns."""
    if cfg.name == "arithmetic":
        data = arithmetic_problems(cfg.max_operand, cfg.num_test, cfg.seed)
    else:
        raise GrpoError(f"Unknown data.name={cfg.name!r}; choose data=arithmetic.")
    for split_name, split in data.items():
        if len(split) == 0:
            raise GrpoError(f"The {split_name!r} split of data={cfg.name} is empty; give it some rows.")
        for field in (cfg.prompt_field, cfg.answer_field):
            if field not in split.column_names:
                raise GrpoError(
                    f"Column {field!r} is missing from the {split_name!r} split of data={cfg.name}; "
                    f"it has {split.column_names}: set data.prompt_field/data.answer_field to one of them."
                )
    return data


class PromptOrder:
    """Which prompts each step draws: a fresh seeded permutation per epoch, so step k's batch is a
    pure function of (seed, k) and a resumed run needs only the step to continue the same order."""

    def __init__(self, num_rows: int, batch_size: int, seed: int):
        if batch_size > num_rows:
            raise GrpoError(
                f"trainer.prompts_per_step={batch_size} exceeds the {num_rows} training prompts; lower it."
            )
        self.num_rows, self.batch_size, self.seed = num_rows, batch_size, seed
        self.per_epoch = num_rows // batch_size  # the remainder of each epoch is skipped

    def indices(self, step: int) -> list[int]:
        epoch, k = divmod(step, self.per_epoch)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        perm = torch.randperm(self.num_rows, generator=g)
        return perm[k * self.batch_size : (k + 1) * self.batch_size].tolist()
