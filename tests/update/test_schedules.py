"""The learning-rate schedules (grpo_cli/update/schedules.py): every one against transformers' own
get_scheduler (an independent implementation), step by step past the end of training, with and without
warm-up; a few values worked by hand; a checkpoint of transformers' scheduler loads into ours."""

import math

import pytest
import torch

from grpo_cli.update.schedules import SCHEDULES, schedule
from grpo_cli.update.schedules import SCHEDULES as SCHEDULERS


def optimizer(lr: float = 3e-4):
    return torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=lr)


def rates(sched, steps: int) -> list[float]:
    out = []
    for _ in range(steps):
        out.append(sched.get_last_lr()[0])
        sched.optimizer.step()
        sched.step()
    return out


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("warmup, total", [(0, 20), (5, 20), (20, 20), (3, 1)])
def test_every_schedule_equals_transformers_step_by_step(name, warmup, total):
    from transformers import get_scheduler

    if name == "polynomial" and warmup == total:
        pytest.skip("transformers divides by zero there (total == warm-up); ours holds the rate")
    theirs = rates(get_scheduler(name, optimizer(), num_warmup_steps=warmup, num_training_steps=total), total + 5)
    ours = rates(schedule(name, optimizer(), warmup, total), total + 5)
    assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-18)


def test_values_worked_by_hand():
    kw = dict(warmup=4, total=12, lr=1e-3)
    s = SCHEDULES
    assert [s["constant_with_warmup"](t, **kw) for t in (0, 2, 4, 9)] == [0.0, 0.5, 1.0, 1.0]
    assert [s["linear"](t, **kw) for t in (2, 4, 8, 12, 13)] == [0.5, 1.0, 0.5, 0.0, 0.0]
    assert s["cosine"](8, **kw) == pytest.approx(0.5)  # half-way down half a cosine
    assert s["cosine_with_restarts"](6, **kw) == pytest.approx((1 + math.cos(math.pi / 4)) / 2)
    assert s["polynomial"](8, **kw) == pytest.approx(((1e-3 - 1e-7) * 0.5 + 1e-7) / 1e-3)
    assert s["inverse_sqrt"](16, **kw) == pytest.approx(0.5)  # 1 / sqrt(16 / 4)
    assert s["inverse_sqrt"](2, warmup=0, total=12, lr=1e-3) == pytest.approx(1 / math.sqrt(10_002 / 10_000))


def test_a_checkpoint_of_transformers_scheduler_loads_into_ours():
    from transformers import get_scheduler

    theirs = get_scheduler("cosine", optimizer(), num_warmup_steps=2, num_training_steps=10)
    rates(theirs, 6)
    ours = schedule("cosine", optimizer(), 2, 10)
    ours.load_state_dict(theirs.state_dict())
    assert rates(ours, 4) == pytest.approx(rates(theirs, 4))


def test_starting_a_run_does_not_import_transformers_optimization():
    import subprocess
    import sys

    code = (
        "import sys, torch\nfrom grpo_cli.run.build import build_optimizer\nfrom grpo_cli.config import "
        "OptimizerConfig\n"
        "build_optimizer(torch.nn.Linear(2, 2), OptimizerConfig(), 10)\n"
        "print('transformers.optimization' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False"]  # (what that module imports, peft among them, varies with the transformers release)
