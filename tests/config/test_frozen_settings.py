"""Settings are fixed at the edge: Hydra composes mutable groups, the edge freezes them, and a builder that derives
a copy (a reward term's own `fn`) gets one as fixed as the original."""

from __future__ import annotations

import pickle
from dataclasses import FrozenInstanceError, asdict

import pytest

from grpo_cli.config import RewardConfig, TrainConfig, freeze
from grpo_cli.config.declare import amended


def test_a_frozen_config_refuses_every_assignment_and_keeps_its_values():
    cfg = TrainConfig()
    cfg.trainer.steps = 3  # before the edge: Hydra and the edge's own normalizing assign freely
    before = asdict(cfg)
    assert freeze(cfg) is cfg
    with pytest.raises(FrozenInstanceError, match="TrainerConfig.steps is frozen"):
        cfg.trainer.steps = 4
    with pytest.raises(FrozenInstanceError, match="TrainConfig.reward is frozen"):
        cfg.reward = RewardConfig()
    with pytest.raises(FrozenInstanceError):
        cfg.model.lora.r = 8  # a group inside a group
    assert asdict(cfg) == before and cfg.trainer.steps == 3
    shipped = pickle.loads(pickle.dumps(cfg))  # as a worker receives it
    with pytest.raises(FrozenInstanceError):
        shipped.algo.beta = 1.0
    assert asdict(shipped) == before


def test_an_amended_copy_is_frozen_when_its_original_is_and_leaves_the_original_alone():
    loose = RewardConfig()
    mine = amended(loose, fn="mod:f")
    mine.name = "python"  # the original was not frozen, nor is its copy
    fixed = freeze(RewardConfig(fn="mod:g"))
    term = amended(fixed, fn="mod:h")
    assert (term.fn, fixed.fn, term.name) == ("mod:h", "mod:g", fixed.name)
    with pytest.raises(FrozenInstanceError):
        term.fn = "mod:i"
