"""Typed schemas for every config group, registered in Hydra's ConfigStore.

The YAML files under `conf/` hold the values and a comment per key; these dataclasses hold the
types. Hydra merges the YAML into them, so a mistyped key (`trainer.stepz=3`) or a wrong type
(`trainer.steps=many`) fails at composition with the key named, before any work starts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from hydra.core.config_store import ConfigStore

from grpo_cli.choices import LORA_TARGETS


@dataclass
class LoraConfig:
    r: int = 0  # 0 = full fine-tuning
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: Any = field(default_factory=lambda: list(LORA_TARGETS))  # a list, or the string all-linear
    quantize: Optional[str] = None  # 4bit: QLoRA (bitsandbytes, CUDA)


@dataclass
class ModelConfig:
    name: str = "tiny"
    path: str = "builtin:tiny"
    device: str = "auto"
    trust_remote_code: bool = False
    gradient_checkpointing: bool = False
    recompute_pointwise: str = "auto"  # auto | true | false (models/recompute.py)
    lora: LoraConfig = field(default_factory=LoraConfig)


@dataclass
class RewardConfig:
    """One flat schema for every reward, so `combo` can build any term from the same keys."""

    name: str = "auto"
    terms: List[str] = field(default_factory=list)
    weights: List[float] = field(default_factory=list)
    extract: str = "last_number"
    pattern: Optional[str] = None
    format_pattern: str = r"<think>.*?</think>\s*<answer>.*?</answer>"
    max_length: int = 512
    overlong_buffer: int = 128
    model_path: Optional[str] = None
    model_batch_size: int = 16
    model_device: str = "auto"
    fn: Any = None  # a function spec, or a list of them (one term each)
    fn_dir: Optional[str] = None
    correct: str = "reward"
    correct_threshold: Optional[float] = None
    tests_field: str = "tests"
    code_cpu_s: float = 2.0
    code_memory_mib: int = 512
    code_output_kib: int = 1024
    code_processes: int = 16
    sandbox: str = "os"
    workers: int = 0
    timeout_s: float = 30.0
    max_failed_fraction: float = 0.1
    worker_memory_gib: float = 4.0


@dataclass
class SamplerConfig:
    group_size: int = 8
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    max_new_tokens: int = 6


@dataclass
class OptimizerConfig:
    name: str = "adamw"
    lr: float = 3e-4
    betas: List[float] = field(default_factory=lambda: [0.9, 0.99])
    weight_decay: float = 0.0
    eps: float = 1e-8
    scheduler: str = "constant_with_warmup"
    warmup_steps: int = 0
    max_grad_norm: float = 1.0


@dataclass
class DataConfig:
    """One flat schema for every data source; the template keys apply to all of them."""

    name: str = "arithmetic"
    max_operand: int = 49
    num_test: int = 200
    seed: int = 0
    prompt_field: str = "prompt"
    answer_field: str = "answer"
    digits: int = 3
    signs: str = "+"
    hops: int = 2
    num_train: int = 10000
    train_file: Optional[str] = None
    test_file: Optional[str] = None
    test_size: float = 0.1
    hub_name: Optional[str] = None
    hub_config: Optional[str] = None
    train_split: str = "train"
    test_split: Optional[str] = "test"
    answer_extract: Optional[str] = None
    template: Optional[str] = None
    chat_template: bool = False
    system_prompt: Optional[str] = None
    max_prompt_length: Optional[int] = None


@dataclass
class AlgoConfig:
    name: str = "grpo"
    clip_eps: float = 0.2
    clip_eps_high: Optional[float] = None
    loss: str = "clip"
    loss_args: Dict[str, Any] = field(default_factory=dict)
    clip_ratio_c: Optional[float] = None
    entropy_coef: float = 0.0
    beta: float = 0.04
    kl_estimator: str = "k3"
    num_iterations: int = 1
    aggregation: str = "seq_mean_token_mean"
    ratio_level: str = "token"
    advantage: str = "grpo"
    scale: str = "group"
    std: str = "population"
    eps: float = 1e-6
    behaviour: str = "current"
    behaviour_path: Optional[str] = None
    behaviour_refresh: int = 0
    ref_refresh: int = 0
    mask_truncated: bool = False
    dynamic_sampling: bool = False
    max_refill_rounds: int = 4
    sampler_correction: str = "none"
    sampler_correction_cap: float = 2.0


@dataclass
class GeneratorConfig:
    name: str = "hf"
    gpu_memory_utilization: float = 0.3
    kv_cache_gib: float = 1.0
    max_model_len: Optional[int] = None
    sleep: bool = True
    enforce_eager: bool = False
    worker: bool = False
    device: Optional[str] = None
    threads: int = 0
    timeout_s: float = 600.0
    decode: str = "auto"
    weights: str = "full"  # "bf16": training rollouts sampled with the weights in bf16 (generation.HFGenerator)
    matmul: str = "auto"  # "packed": a CPU's float32 decode multiplies by oneDNN-packed weights (models/packed.py)
    score_reference: bool = True  # the worker scores the KL reference too (reference_in_worker)


@dataclass
class EnvConfig:
    """Multi-turn episodes (episodes.py): off while neither tools nor factory is set."""

    tools: List[str] = field(default_factory=list)  # tool functions, mod:fn or file.py:fn
    factory: Any = None  # an environment class (TRL's environment_factory), mod:Class or file.py:Class; or {name: ...}
    fn_dir: Optional[str] = None  # where relative files and modules are found (set by grpo train)
    max_turns: int = 4
    max_tokens: int = 256
    timeout_s: float = 10.0
    concurrency: int = 16
    workers: int = 0  # environment worker processes (env_worker.py); 0 = in the training process, on threads
    worker_memory_gib: float = 4.0
    sandbox: str = "none"  # "os": the workers confined by the kernel (env_sandbox.py)
    tool_format: str = "auto"


@dataclass
class TrainerConfig:
    steps: int = 300
    prompts_per_step: int = 32
    micro_batch_size: int = 64
    packing: bool = True
    shared_prompts: bool = True
    max_tokens_per_micro_batch: int = 0
    memory_gib: float = 0.0
    seed: int = 0
    log_every: int = 1
    save_every: int = 100
    eval_before_after: bool = True
    eval_before_at: str = "start"
    eval_prompts: int = 200
    zero_variance_warn_steps: int = 5
    health: str = "warn"
    progress: bool = True
    keep_last: int = 0
    eval_every: int = 50
    log_completions_every: int = 50
    log_completions_groups: int = 2
    trackers: List[str] = field(default_factory=list)
    tracker_project: str = "grpo-cli"
    precision: str = "fp32"
    threads: int = 0
    nonfinite_patience: int = 3
    strategy: str = "auto"
    max_staleness: int = 0
    deterministic: bool = False


@dataclass
class HubConfig:
    push: bool = False
    repo_id: Optional[str] = None
    private: bool = True


@dataclass
class TrainConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    algo: AlgoConfig = field(default_factory=AlgoConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    output_dir: Optional[str] = None
    resume: Optional[str] = None
    overwrite: bool = False
    objective: Optional[str] = None
    hub: HubConfig = field(default_factory=HubConfig)


def reference_in_worker(cfg) -> bool:
    """Whether the generation worker computes the KL reference's log-probs of what it samples (on its own core
    or device, while the trainer updates), so the trainer holds no reference: a worker runs
    (trainer.max_staleness > 0 or generator.worker), algo.beta != 0, generator.score_reference, the policy
    samples (no behaviour policy) and the reference is never refreshed from the policy (algo.ref_refresh=0)."""
    t, a = cfg.trainer, cfg.algo
    return (bool(t.max_staleness or cfg.generator.worker) and a.beta != 0 and cfg.generator.score_reference
            and a.behaviour == "current" and not a.ref_refresh)


@dataclass
class EvaluateConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    checkpoint: Any = None  # a path, a list of paths, or null: Hydra accepts `checkpoint=[a,b]` only untyped
    split: str = "test"
    limit: Optional[int] = None
    samples: int = 8
    k: List[int] = field(default_factory=lambda: [1, 4, 8])
    batch_size: int = 64
    seed: int = 0
    output_dir: Optional[str] = None
    precision: str = "fp32"
    threads: int = 0


@dataclass
class SampleConfig:
    model: ModelConfig = field(default_factory=ModelConfig)
    reward: RewardConfig = field(default_factory=RewardConfig)
    sampler: SamplerConfig = field(default_factory=SamplerConfig)
    data: DataConfig = field(default_factory=DataConfig)
    generator: GeneratorConfig = field(default_factory=GeneratorConfig)
    env: EnvConfig = field(default_factory=EnvConfig)
    checkpoint: Optional[str] = None
    prompt: Optional[str] = None
    prompts: List[str] = field(default_factory=list)
    prompts_file: Optional[str] = None
    answer: Optional[str] = None
    greedy: bool = False
    batch_size: int = 16
    seed: int = 0
    output: Optional[str] = None
    precision: str = "fp32"
    threads: int = 0


GROUP_SCHEMAS: dict[str, Any] = {
    "model": ModelConfig,
    "reward": RewardConfig,
    "sampler": SamplerConfig,
    "optimizer": OptimizerConfig,
    "data": DataConfig,
    "algo": AlgoConfig,
    "generator": GeneratorConfig,
    "env": EnvConfig,
}


COMMAND_SCHEMAS: dict[str, Any] = {"train": TrainConfig, "evaluate": EvaluateConfig, "sample": SampleConfig}


def register_configs(*commands: str) -> None:
    """Register the primary schemas (`<command>_schema`) of these commands (all three when none is named); each
    primary YAML names its schema first in its defaults. Once a process, and only those asked for: storing turns
    a dataclass into a config, tens of milliseconds each on the way to a run's first line."""
    cs = ConfigStore.instance()
    for command in commands or COMMAND_SCHEMAS:
        schema = COMMAND_SCHEMAS[command]
        if f"{command}_schema.yaml" not in cs.repo:
            cs.store(name=f"{command}_schema", node=schema)


def schema_of(command: str):
    """The dataclass schema of a command's config."""
    return COMMAND_SCHEMAS[command]
