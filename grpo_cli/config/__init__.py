"""Typed settings for every config group and command, each declared once (declare.py): its type, default, allowed
values or range, one-line help and check. Hydra merges the YAML of `conf/` into these dataclasses, so a mistyped key
or a wrong type fails at composition; `check` then refuses every bad value, before torch loads."""

from grpo_cli.config.algo import AlgoConfig
from grpo_cli.config.commands import (
    COMMAND_SCHEMAS,
    EvaluateConfig,
    SampleConfig,
    TrainConfig,
    reference_in_worker,
    register_configs,
    schema_of,
)
from grpo_cli.config.data import DataConfig, SamplerConfig
from grpo_cli.config.declare import check, freeze
from grpo_cli.config.env import EnvConfig
from grpo_cli.config.generator import GeneratorConfig, HFGeneratorConfig, VLLMGeneratorConfig
from grpo_cli.config.model import LoraConfig, ModelConfig, OptimizerConfig
from grpo_cli.config.reward import RewardConfig
from grpo_cli.config.trainer import HubConfig, TrainerConfig

__all__ = [
    "AlgoConfig",
    "COMMAND_SCHEMAS",
    "DataConfig",
    "EnvConfig",
    "EvaluateConfig",
    "GeneratorConfig",
    "HFGeneratorConfig",
    "HubConfig",
    "LoraConfig",
    "ModelConfig",
    "OptimizerConfig",
    "RewardConfig",
    "SampleConfig",
    "SamplerConfig",
    "TrainConfig",
    "TrainerConfig",
    "VLLMGeneratorConfig",
    "check",
    "freeze",
    "reference_in_worker",
    "register_configs",
    "schema_of",
]
