"""A verifiers environment for tests/episodes/test_agent.py: single-turn, its rubric 1.0 when the reply holds the
row's answer (a local loader: nothing is fetched)."""

import verifiers as vf
from datasets import Dataset


def holds_answer(completion, answer, **kwargs) -> float:
    text = completion[-1]["content"] if isinstance(completion, list) else str(completion)
    return float(str(answer) in (text or ""))


def replies(completion, **kwargs) -> float:
    return float(len(completion))


def load_environment(weight: float = 1.0):
    rows = Dataset.from_list([{"question": "1+1=", "answer": "2"}])
    return vf.SingleTurnEnv(dataset=rows, rubric=vf.Rubric(funcs=[holds_answer, replies], weights=[weight, 0.0]))
