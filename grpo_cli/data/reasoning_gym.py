"""`data=reasoning_gym`: the procedural tasks of reasoning-gym (docs/how-to/ecosystem.md), each problem a row, scored
by the task's own `score_answer` (rewards/reasoning_gym.py, which also builds the problems). A row keeps where its
problem comes from (task, options, seed, size, index: the `rg_item` column), so any process can rebuild it."""

from __future__ import annotations

import json

from grpo_cli.data.rows import Rows
from grpo_cli.errors import GrpoError
from grpo_cli.rewards.reasoning_gym import ITEM, dataset


def reasoning_gym_problems(cfg) -> dict[str, Rows]:
    """`data.size` training problems from `data.seed`, and `data.num_test` held out from `data.seed + data.size`:
    reasoning-gym draws problem i from seed + i, so the two never share a seed; a held-out question that a
    training problem also asks is dropped all the same."""
    options = json.dumps(dict(cfg.options or {}), sort_keys=True)
    train = split(cfg.task, options, cfg.seed, cfg.size)
    asked = set(train["prompt"])
    test = split(cfg.task, options, cfg.seed + cfg.size, cfg.num_test, skip=asked)
    if not test["prompt"]:
        raise GrpoError(f"every held-out problem of data.task={cfg.task} is also a training one; raise data.num_test.")
    return {"train": Rows(train), "test": Rows(test)}


def split(task: str, options: str, seed: int, size: int, skip: set | frozenset = frozenset()) -> dict[str, list]:
    problems = dataset(task, options, seed, size)
    columns: dict[str, list] = {"prompt": [], "answer": [], ITEM: []}
    for index in range(size):
        entry = problems[index]
        if entry["question"] in skip:
            continue
        columns["prompt"].append(entry["question"])
        columns["answer"].append(str(entry["answer"]))
        columns[ITEM].append(json.dumps({"task": task, "options": options, "seed": seed, "size": size, "index": index}))
    return columns
