"""The three commands' schemas, built from the groups, and the rules between groups; registered in Hydra's
ConfigStore, so a mistyped key or a wrong type fails at composition with the key named."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional

from grpo_cli.config.algo import AlgoConfig
from grpo_cli.config.data import DataConfig, SamplerConfig
from grpo_cli.config.declare import Settings, rule, setting
from grpo_cli.config.env import EnvConfig
from grpo_cli.config.generator import GeneratorConfig, HFGeneratorConfig
from grpo_cli.config.model import ModelConfig, OptimizerConfig
from grpo_cli.config.reward import ANSWER_READERS, RewardConfig, term_names
from grpo_cli.config.trainer import HubConfig, TrainerConfig

OBJECTIVES = ("reward_last20", "greedy_accuracy_after", "sampled_accuracy_after", "seconds")
INFERENCE_PRECISIONS = ("fp32", "bf16", "fp16")  # evaluate and sample: the weights' dtype


@dataclass
class Shared(Settings):
    """The groups every command composes."""

    model: ModelConfig = setting(factory=ModelConfig, help="policy, reference and tokenizer")
    reward: RewardConfig = setting(factory=RewardConfig, help="how a completion is scored")
    sampler: SamplerConfig = setting(factory=SamplerConfig, help="how completions are sampled")
    data: DataConfig = setting(factory=DataConfig, help="prompts and answers, train and test splits")
    generator: GeneratorConfig = setting(factory=HFGeneratorConfig, help="what samples them")
    env: EnvConfig = setting(factory=EnvConfig, help="multi-turn episodes: tools and environments")
    plugins: List[str] = setting(
        factory=list, help="files or modules imported first, registering formats, kinds, generators, rewards, losses"
    )


NO_RESUME = ("", "false", "none", "no", "0")  # resume= values that start a new run (as null does)


@dataclass
class TrainConfig(Shared):
    optimizer: OptimizerConfig = setting(factory=OptimizerConfig, help="optimiser, schedule, grad clipping")
    algo: AlgoConfig = setting(factory=AlgoConfig, help="the objective: clipping, KL, aggregation, advantages")
    trainer: TrainerConfig = setting(factory=TrainerConfig, help="the loop")
    output_dir: Optional[str] = setting(None, "where the run writes; null = Hydra's run directory")
    resume: Optional[str] = setting(None, "auto (the checkpoint `latest` names, else start fresh) | PATH | false")
    overwrite: bool = setting(
        False, "true: a run directory that already holds a run is emptied first (without it: refused)"
    )
    objective: Optional[str] = setting(
        None, "for a sweeper that optimises (Optuna): the summary number `grpo train` returns", choices=OBJECTIVES
    )
    hub: HubConfig = setting(factory=HubConfig, help="pushing final/ to the Hugging Face hub")


@dataclass
class Inference(Shared):
    """What evaluate and sample share beside the groups."""

    checkpoint: Any = setting(None, "a checkpoint, a run directory, or a model (default: model.path)")
    batch_size: int = setting(64, "prompts per generate call", low=1)
    seed: int = setting(0, "seed for anything sampled", low=0)
    precision: str = setting("fp32", "fp32 | bf16 | fp16: the dtype the model runs in", choices=INFERENCE_PRECISIONS)
    threads: int = setting(0, "torch CPU threads; 0 = OMP_NUM_THREADS if set, else the cores available", low=0)


@dataclass
class EvaluateConfig(Inference):
    checkpoint: Any = setting(
        None, "checkpoints to score: a path, a list [a,b], a run directory (its checkpoints), or null for model.path"
    )
    split: str = setting(
        "test",
        "which split of the data group to score",
        check=lambda v: None if str(v).strip() else "split is empty; name a split of the data group, such as test",
    )
    limit: Optional[int] = setting(None, "score at most this many prompts (null = all)", low=1)
    samples: int = setting(
        8, "n: completions per prompt, sampled as the sampler group says, for pass@k and maj@k (0 = greedy only)", low=0
    )
    k: List[int] = setting(
        factory=lambda: [1, 4, 8], help="pass@k (unbiased) and maj@k (majority vote) for each k <= samples"
    )
    output_dir: Optional[str] = setting(None, "where eval.json goes; null = Hydra's run directory")


@dataclass
class SampleConfig(Inference):
    checkpoint: Optional[str] = setting(None, "a checkpoint, a run directory (its final/), or null for model.path")
    prompt: Optional[str] = setting(None, "one prompt")
    prompts: List[str] = setting(factory=list, help="or several")
    prompts_file: Optional[str] = setting(
        None,
        'or a file: one prompt per line, or .jsonl rows with "prompt" '
        '(optional "answer", and columns an environment\'s reset reads)',
    )
    answer: Optional[str] = setting(None, "when given, each completion is scored against it with the reward group")
    greedy: bool = setting(False, "the most likely token at every step instead of sampling")
    batch_size: int = setting(16, "prompts per generate call", low=1)
    output: Optional[str] = setting(None, "optional .jsonl file to write the completions to")


COMMAND_SCHEMAS: dict[str, type] = {"train": TrainConfig, "evaluate": EvaluateConfig, "sample": SampleConfig}


def schema_of(command: str) -> type:
    """The dataclass schema of a command's config."""
    return COMMAND_SCHEMAS[command]


def register_configs(*commands: str) -> None:
    """Register the primary schemas (`<command>_schema`) of these commands (all three when none is named); each
    primary YAML names its schema first in its defaults. Once a process, and only those asked for: storing turns a
    dataclass into a config, tens of milliseconds each on the way to a run's first line."""
    from hydra.core.config_store import ConfigStore

    cs = ConfigStore.instance()
    for command in commands or COMMAND_SCHEMAS:
        if f"{command}_schema.yaml" not in cs.repo:  # the generator's node as every back-end's: its option picks one
            cs.store(name=f"{command}_schema", node=COMMAND_SCHEMAS[command](generator=GeneratorConfig()))


def reference_in_worker(cfg) -> bool:
    """Whether the generation worker computes the KL reference's log-probs of what it samples (on its own core or
    device, while the trainer updates), so the trainer holds no reference: a worker runs, algo.beta != 0,
    generator.score_reference, the policy samples and the reference is never refreshed from the policy."""
    t, a = cfg.trainer, cfg.algo
    return (
        bool(t.max_staleness or cfg.generator.worker)
        and a.beta != 0
        and cfg.generator.score_reference
        and a.behaviour == "current"
        and not a.ref_refresh
    )


@rule("sampler.group_size", "trainer")
def _groups_of_two(p, c) -> None:
    g = c.sampler.group_size
    p.need(g >= 2, f"sampler.group_size must be at least 2 (got {g}): a group of one has no relative advantage")


@rule("reward.name", "env.factory", "data.name", "trainer")
def _who_scores(p, c) -> None:
    p.need(
        c.reward.name != "none" or bool(c.env.factory),
        "reward=none leaves the scoring to an environment, and "
        "there is none; set env.factory to an environment with get_reward() (or a step environment), or name a reward",
    )
    if c.data.name == "none":
        p.need(
            bool(c.env.factory),
            "data=none has no prompts of its own: an environment's reset() writes each one; "
            "set env.factory to such an environment (or give data)",
        )
        reading = sorted(t for t in term_names(c.reward) if t in ANSWER_READERS)
        p.need(
            c.reward.name == "auto" or not reading,
            f"data=none has no answers for reward {', '.join(reading)} to "
            "compare with; use reward=auto (the environment's get_reward()) or a reward that reads no answer",
        )


@rule("generator.weights", "trainer.precision")
def _sampling_precision(p, c) -> None:
    weights = getattr(c.generator, "weights", "full")
    p.need(
        weights != "bf16" or c.trainer.precision in ("auto", "fp32"),
        f"generator.weights=bf16 samples in bf16, which trainer.precision={c.trainer.precision} already does; drop one",
    )


@rule("objective", "trainer.eval_before_after")
def _objective(p, c) -> None:
    p.need(
        not (c.objective or "").endswith("accuracy_after") or c.trainer.eval_before_after,
        f"objective={c.objective} is measured by the held-out evaluation at the end; set "
        "trainer.eval_before_after=true or choose objective=reward_last20",
    )


@rule("trainer.max_staleness", "algo.behaviour", "generator.device", "generator.worker")
def _worker(p, c) -> None:
    t, g, a = c.trainer, c.generator, c.algo
    p.need(
        t.max_staleness == 0 or a.behaviour == "current",
        f"trainer.max_staleness={t.max_staleness} lags the sampling weights behind the policy, and algo.behaviour="
        f"{a.behaviour} already samples from a policy of its own; set trainer.max_staleness=0 (generator.worker=true "
        "still samples it in a worker process) or algo.behaviour=current",
    )
    p.need(
        not g.device or bool(g.worker) or t.max_staleness > 0,
        f"generator.device={g.device} places the generation worker, but there is none (generator.worker=false and "
        "trainer.max_staleness=0); set generator.worker=true, or drop generator.device",
    )


@rule("k", "samples")
def _pass_at_k(p, c) -> None:
    ks = sorted(set(c.k)) if c.samples else []
    p.need(
        not ks or 1 <= ks[0] <= ks[-1] <= c.samples,
        f"k={ks} asks for pass@k and maj@k from samples={c.samples} completions per prompt; each k must be between "
        f"1 and samples: raise samples to {max(ks or [1])} or drop the larger k (samples=0 scores greedy completions "
        "only)",
    )


@rule("prompt", "prompts", "prompts_file")
def _some_prompt(p, c) -> None:
    p.need(
        bool(c.prompt or c.prompts or c.prompts_file),
        'no prompt given; pass prompt="...", prompts=[...] or prompts_file=FILE',
    )
