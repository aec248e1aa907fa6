"""reward=reasoning_gym (what reward=auto means with data=reasoning_gym): each completion scored by its task's own
`score_answer`, on the answer reasoning-gym's `extract_answer` reads (the text in <answer> tags; none is 0); and the
problems themselves, rebuilt from where a row says they come from."""

from __future__ import annotations

import difflib
import json
from functools import lru_cache

from grpo_cli.errors import GrpoError

ITEM = "rg_item"  # the dataset column naming each row's problem (data/reasoning_gym.py)


def library():
    try:
        import reasoning_gym
    except ImportError:
        raise GrpoError(
            "data=reasoning_gym needs the reasoning-gym package: pip install 'grpo-cli[reasoning-gym]'."
        ) from None
    return reasoning_gym


@lru_cache(maxsize=8)
def dataset(task: str, options: str, seed: int, size: int):
    """The task's problems (`options`: its options as JSON), built once per process."""
    rg = library()
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        near = difflib.get_close_matches(task, sorted(DATASETS), n=3)
        hint = f"; did you mean {', '.join(near)}?" if near else f"; it has {len(DATASETS)} (reasoning_gym.factory)"
        raise GrpoError(f"data.task={task} is not a reasoning-gym task{hint}")
    try:
        return rg.create_dataset(task, seed=seed, size=size, **json.loads(options))
    except (TypeError, ValueError, AssertionError) as e:
        raise GrpoError(
            f"reasoning-gym's {task} refuses data.options={json.loads(options)} ({e}); fix the options."
        ) from None


def entry_of(item: str) -> tuple:
    """(the task's dataset, the problem) a row's `rg_item` names."""
    where = json.loads(item)
    problems = dataset(where["task"], where["options"], where["seed"], where["size"])
    return problems, problems[where["index"]]


def build(cfg):
    library()
    from reasoning_gym.utils import extract_answer

    def term(batch) -> list[float]:
        items = batch.columns.get(ITEM)
        if items is None:
            raise GrpoError(f"reward=reasoning_gym scores data=reasoning_gym's rows; these have no {ITEM} column.")
        scores = []
        for completion, item in zip(batch.completions, items):
            problems, entry = entry_of(item)
            scores.append(float(problems.score_answer(extract_answer(completion), entry)))
        return scores

    return term
