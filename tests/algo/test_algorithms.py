"""The loop's policies and variants (docs/math.md, "Policies" and "The algorithm"; DAPO)."""

import json

import torch

from grpo_cli.config import TrainConfig
from grpo_cli.data.tasks import PromptBatch
from grpo_cli.generate.hf import HFGenerator
from grpo_cli.models.distributed import SINGLE
from grpo_cli.models.loading import load_model, load_tokenizer
from grpo_cli.models.policies import Policies
from grpo_cli.models.precision import Precision
from grpo_cli.rewards import Judge, build_reward
from grpo_cli.rollout import source
from grpo_cli.run import build as run_setup
from grpo_cli.run import trainer
from grpo_cli.run.console import Console
from grpo_cli.samples.rollout import Rollout
from grpo_cli.samples.settings import StepSettings
from grpo_cli.update import step
from helpers import padded


def small_config(**algo) -> TrainConfig:
    cfg = TrainConfig()
    cfg.trainer.prompts_per_step, cfg.trainer.steps, cfg.trainer.micro_batch_size = 4, 3, 8
    cfg.trainer.eval_before_after, cfg.trainer.progress, cfg.trainer.save_every = False, False, 1000
    cfg.sampler.group_size = 4
    cfg.data.max_operand, cfg.data.num_test = 9, 20
    for k, v in algo.items():
        setattr(cfg.algo, k, v)
    return cfg


def params(model) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


def same(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def test_two_inner_iterations_make_two_optimiser_steps_and_the_first_pass_ratios_are_exactly_one(monkeypatch):
    cfg = small_config(num_iterations=2, beta=0.0)
    torch.manual_seed(0)
    policy, tok = load_model("builtin:tiny", device="cpu"), load_tokenizer("builtin:tiny")
    optimizer, _ = run_setup.build_optimizer(policy, cfg.optimizer, 10)
    seen = []
    real = step.policy_loss

    def recording(*args, **kwargs):
        loss, metrics = real(*args, **kwargs)
        seen.append(metrics)
        return loss, metrics

    monkeypatch.setattr(step, "policy_loss", recording)
    batch = PromptBatch(["1+2=", "3+4=", "5+5=", "9+8="], ["3", "7", "10", "17"], seeds=[0, 1, 2, 3])
    reward, settings = build_reward(cfg.reward), StepSettings.of(cfg, Judge(cfg.reward, build_reward(cfg.reward)))
    scored = source.LocalSource(HFGenerator(tok), Policies(policy), reward, settings).sample(batch)
    step.grpo_step(Policies(policy), optimizer, scored, settings)
    steps = {int(s["step"]) for s in optimizer.state.values()}
    assert steps == {2}  # AdamW counted two optimiser steps for every parameter
    micro_batches = len(seen) // 2
    first, second = seen[:micro_batches], seen[micro_batches:]
    assert all(m["ratio_min"] == 1.0 == m["ratio_max"] for m in first)
    assert any(m["ratio_min"] != 1.0 or m["ratio_max"] != 1.0 for m in second)


def recorded_samplers(monkeypatch):
    """Snapshots of the weights of every model the loop sampled from."""
    snapshots = []
    real = HFGenerator.generate

    def recording(self, model, *args, **kwargs):
        snapshots.append(params(model))
        return real(self, model, *args, **kwargs)

    monkeypatch.setattr(HFGenerator, "generate", recording)
    return snapshots


def test_a_frozen_behaviour_keeps_sampling_from_the_initial_weights_while_the_policy_changes(monkeypatch, tmp_path):
    initial = params(load_model("builtin:tiny", device="cpu"))
    snapshots = recorded_samplers(monkeypatch)
    cfg = small_config(behaviour="frozen", beta=0.0)
    trainer.train(cfg, tmp_path, Console(progress=False))
    assert len(snapshots) == cfg.trainer.steps
    assert all(same(s, initial) for s in snapshots)
    final = params(load_model(str(tmp_path / "final"), device="cpu"))
    assert not same(final, initial)
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[-1]["kl_behaviour"] > 0  # the policy moved away from the behaviour that sampled


def test_a_lagged_behaviour_is_refreshed_to_the_policy_every_k_steps(monkeypatch, tmp_path):
    snapshots = recorded_samplers(monkeypatch)
    saved = []
    real_refresh = Policies.refresh

    def spy(self, step):
        real_refresh(self, step)
        saved.append(params(self.policy))

    monkeypatch.setattr(Policies, "refresh", spy)
    cfg = small_config(behaviour="lagged", behaviour_refresh=2, beta=0.0)
    cfg.trainer.steps = 4
    trainer.train(cfg, tmp_path, Console(progress=False))
    assert same(snapshots[0], snapshots[1])  # steps 1-2 sample from the initial copy
    assert same(snapshots[2], saved[1]) and same(snapshots[3], saved[1])  # steps 3-4: the policy after step 2
    assert not same(snapshots[2], snapshots[0])


def test_the_reference_is_refreshed_to_the_policy_only_on_its_schedule():
    policy = load_model("builtin:tiny", device="cpu")
    policies = Policies.load(small_config(ref_refresh=2), Precision("fp32"), policy)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01)
    policies.refresh(1)
    assert not same(params(policies.held_reference), params(policy))
    policies.refresh(2)
    assert same(params(policies.held_reference), params(policy))


def test_dynamic_sampling_drops_flat_groups_and_refills_the_batch():
    policy, tok = load_model("builtin:tiny", device="cpu"), load_tokenizer("builtin:tiny")
    cfg = small_config(dynamic_sampling=True, max_refill_rounds=3)

    def reward(prompts, completions, answers):  # "flat..." prompts score 0 always; others alternate 1, 0
        return [0.0 if p.startswith("flat") else float(i % 2) for i, p in enumerate(prompts)]

    batches = {
        1: PromptBatch(["good1=", "flat1=", "flat2=", "flat3="], list("abcd"), [1] * 4),
        2: PromptBatch(["good2=", "good3=", "flat4=", "good4="], list("efgh"), [2] * 4),
    }
    roll, answers, metrics = source.collect(
        HFGenerator(tok),
        policy,
        PromptBatch(["flat0=", "good0=", "flat5=", "flat6="], list("wxyz"), [0] * 4),
        reward,
        StepSettings.of(cfg, Judge(cfg.reward, reward)),
        refill=lambda r: batches[r],
    )
    stats = metrics.reduce(SINGLE)
    assert roll.prompts == ["good0=", "good1=", "good2=", "good3="] and answers == ["x", "a", "e", "f"]
    assert (roll.rewards.amax(1) != roll.rewards.amin(1)).all()
    assert padded(roll)[0].shape[0] == 16 and len(roll.completions) == 16
    assert abs(stats["dropped_frac"] - (1 - 4 / 12)) < 1e-12  # 12 groups sampled (8 flat, the last good one unused)
    # what is logged describes everything sampled, not the kept (mixed by construction) groups
    assert abs(stats["zero_var_frac"] - 7 / 12) < 1e-6 and abs(stats["reward_mean"] - 5 * 0.5 / 12) < 1e-6


def test_mask_truncated_removes_cut_off_completions_from_the_loss():
    roll = Rollout.of_rows(["p"], 2, [[7], [7]], [[3, 4], [5, 6]], truncated=[False, True], completions=["a", "b"])
    rows = roll.row_of_token()
    assert step.loss_mask(roll, False, rows).tolist() == [0, 1, 1, 0, 1, 1]  # the prompts' tokens never enter it
    assert step.loss_mask(roll, True, rows).tolist() == [0, 1, 1, 0, 0, 0]


def test_every_preset_trains_two_steps_and_logs_entropy_and_both_kls(tmp_path):
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf

    from grpo_cli.config import register_configs

    register_configs()
    for preset in ("grpo", "dr_grpo", "dapo", "gspo", "seq_ratio", "trl"):
        with initialize_config_module("grpo_cli.conf", version_base="1.3"):
            cfg = OmegaConf.to_object(compose("train", overrides=[f"algo={preset}"]))
        small = small_config()
        cfg.trainer, cfg.sampler, cfg.data = small.trainer, small.sampler, small.data
        cfg.trainer.steps = 2
        trainer.train(cfg, tmp_path / preset, Console(progress=False))
        row = [json.loads(line) for line in (tmp_path / preset / "metrics.jsonl").read_text().splitlines()][-1]
        assert {"entropy", "kl", "kl_behaviour", "dropped_frac", "ratio_min", "ratio_max"} <= set(row), preset
        assert row["entropy"] > 0
