"""A generator and a loss written outside the package, registered from this module, train end to end
through `trainer.train` without editing grpo_cli: the step asks the generator's capabilities, and the
loss is found by name with its own setting."""

from __future__ import annotations

import json

import pytest

from grpo_cli.algo.losses import POLICY_LOSSES, register_loss
from grpo_cli.config import TrainConfig
from grpo_cli.errors import GrpoError
from grpo_cli.generate.base import register_generator
from grpo_cli.generate.hf import HFGenerator
from grpo_cli.run.console import Console
from grpo_cli.run.trainer import train
from helpers import forget_generator


class RecordingGenerator(HFGenerator):
    """The model's own sampler, always returning its log-probs (a capability the step must honour by
    recording the sampler mismatch), and counting what it is asked."""

    returns_logprobs = True
    needs_weights = True
    made: list["RecordingGenerator"] = []

    def __init__(self, tokenizer, settings, **kw):
        super().__init__(tokenizer, settings, chat_template=kw["chat_template"], precision=kw["precision"])
        self.generated, self.updates, self.closed = 0, 0, False
        RecordingGenerator.made.append(self)

    def generate(self, model, prompts, group_size, sampling, seeds=None, *, with_logprobs=False):
        self.generated += 1
        return super().generate(model, prompts, group_size, sampling, seeds, with_logprobs=True)

    def update(self, model) -> None:
        self.updates += 1

    def close(self) -> None:
        self.closed = True


@pytest.fixture
def plugins():
    register_generator("recording", RecordingGenerator)

    @register_loss("scaled_reinforce", metrics=("scaled_reinforce_weight",), scale=1.0)
    def scaled_reinforce(t):
        """REINFORCE scaled by its own setting: -scale * A * log pi."""
        weight = t.ratio.detach() * 0 + t.args["scale"]
        return -weight * t.advantages * t.logp, {"scaled_reinforce_weight": weight}

    RecordingGenerator.made.clear()
    yield
    forget_generator("recording")
    POLICY_LOSSES.pop("scaled_reinforce")


def small_run(tmp_path) -> TrainConfig:
    cfg = TrainConfig(output_dir=str(tmp_path))
    cfg.trainer.prompts_per_step, cfg.trainer.steps, cfg.trainer.micro_batch_size = 4, 3, 16
    cfg.trainer.eval_before_after, cfg.trainer.eval_every, cfg.trainer.progress = False, 0, False
    cfg.trainer.log_completions_every, cfg.trainer.threads = 0, 1
    cfg.sampler.group_size = 4
    cfg.data.max_operand, cfg.data.num_test = 9, 20
    return cfg


def test_a_generator_and_a_loss_registered_outside_the_package_train_end_to_end(tmp_path, plugins):
    cfg = small_run(tmp_path)
    cfg.generator.name, cfg.algo.loss, cfg.algo.loss_args, cfg.algo.beta = (
        "recording",
        "scaled_reinforce",
        {"scale": 2.0},
        0.0,
    )
    summary = train(cfg, tmp_path, Console(progress=False))
    (gen,) = RecordingGenerator.made
    assert gen.generated == 3 and gen.updates == 4  # needs_weights: the weights the run starts from, then each update
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3] and summary["steps"] == 3
    assert all(r["scaled_reinforce_weight"] == 2.0 for r in rows)  # the loss's own metric, with its setting
    assert all("sampler/logp_diff" in r for r in rows)  # returns_logprobs: the sampler mismatch is measured
    assert all(r["sampler/logp_diff"] < 1e-4 for r in rows)  # the same numerics as the trainer's own forward
    assert (tmp_path / "final" / "config.json").exists()


def test_a_generator_missing_a_member_of_the_protocol_is_refused_when_built(plugins):
    from grpo_cli.generate.base import make_generator

    class NoCapabilities:  # generates, but declares none of the capabilities the step asks
        def __init__(self, tokenizer, settings, **placement):
            pass

        def generate(self, *args, **kwargs):
            raise AssertionError("never reached")

        update = sleep = close = generate

    register_generator("incomplete", NoCapabilities)
    try:
        with pytest.raises(TypeError, match="does not have every member of grpo_cli.generate.base.Generator"):
            make_generator(
                type("S", (), {"name": "incomplete"})(), None, chat_template=False, precision=None, device="cpu"
            )
    finally:
        forget_generator("incomplete")


def test_a_registered_loss_setting_it_does_not_declare_is_refused_in_one_sentence(tmp_path, plugins):
    cfg = small_run(tmp_path)
    cfg.algo.loss, cfg.algo.loss_args = "scaled_reinforce", {"scael": 2.0}
    with pytest.raises(
        GrpoError, match=r"algo.loss_args.scael is not a setting of algo.loss=scaled_reinforce \(its settings: scale\)"
    ):
        train(cfg, tmp_path, Console(progress=False))
    cfg.algo.loss, cfg.generator.name = "nope", "nope"
    with pytest.raises(
        GrpoError,
        match="generator.name='nope' must be one of hf, vllm, recording.*algo.loss='nope' must be "
        "one of clip, cispo, sapo, scaled_reinforce",
    ):
        train(cfg, tmp_path, Console(progress=False))


def test_a_registered_generator_samples_in_the_generation_worker_and_a_local_one_is_refused(tmp_path, plugins):
    """max_staleness=1 builds the generator in the worker process from its factory's import path (this
    module). The generator returns its own log-probs, so the worker recomputes the behaviour's in the
    training precision: with the same weights, they agree with the sampler's to rounding. A factory the
    worker cannot import (a lambda) is one sentence before any process starts."""
    cfg = small_run(tmp_path / "a")
    cfg.generator.name, cfg.trainer.max_staleness, cfg.algo.beta = "recording", 1, 0.0
    train(cfg, tmp_path / "a", Console(progress=False))
    rows = [json.loads(line) for line in (tmp_path / "a" / "metrics.jsonl").read_text().splitlines()]
    assert [r["staleness"] for r in rows] == [0.0, 1.0, 1.0]
    assert all(r["sampler/logp_diff"] < 1e-4 for r in rows) and rows[2]["ratio_mean"] != 1.0
    assert RecordingGenerator.made == []  # the trainer builds none: the worker samples and scores the held-out prompts
    register_generator("local", lambda tokenizer, settings, **kw: RecordingGenerator(tokenizer, settings, **kw))
    try:
        cfg = small_run(tmp_path / "b")
        cfg.generator.name, cfg.trainer.max_staleness = "local", 1
        with pytest.raises(GrpoError, match="generation worker cannot import"):
            train(cfg, tmp_path / "b", Console(progress=False))
    finally:
        forget_generator("local")
