"""The config composed and checked before Hydra runs the job, in well under two seconds and before torch
is imported: a composition error (an unknown key, a wrong type, a missing group option, a malformed
override), a key added with `+` that the schema does not know, a missing required value, and every bad
value (config/declare.py) become one sentence naming the key, what is allowed and the fix. A sweep (`-m`) is
checked combination by combination before its first job starts.
"""

from __future__ import annotations

import difflib
import itertools
import re
from dataclasses import fields, is_dataclass
from pathlib import Path

from grpo_cli.errors import GrpoError, first_line

# TRL GRPOConfig's names (and a few of transformers' TrainingArguments) -> grpo-cli's key, with what differs.
# docs/coming-from-trl.md prints this table; the did-you-mean of an unknown key reads it first.
TRL_NAMES: dict[str, tuple[str, str]] = {
    "num_generations": ("sampler.group_size", "G completions per prompt"),
    "epsilon": ("algo.clip_eps", "the clip range; algo.eps is the epsilon inside the reward std"),
    "epsilon_high": ("algo.clip_eps_high", "DAPO's clip-higher"),
    "delta": ("algo.clip_ratio_c", "dual-clip bound for negative advantages"),
    "beta": ("algo.beta", "KL weight; TRL's default is 0.0, grpo-cli's 0.04"),
    "loss_type": (
        "algo.aggregation",
        "grpo: seq_mean_token_mean, dapo: token_mean, dr_grpo: constant_norm; "
        "cispo and sapo are algo.loss, or the presets algo=grpo, dapo, dr_grpo, cispo, sapo",
    ),
    "scale_rewards": ("algo.scale", "group, batch, or none for TRL's false"),
    "importance_sampling_level": ("algo.ratio_level", "token, or sequence_mean for TRL's sequence (GSPO)"),
    "num_iterations": ("algo.num_iterations", "μ, the passes over each batch"),
    "mask_truncated_completions": ("algo.mask_truncated", ""),
    "sync_ref_model": ("algo.ref_refresh", "steps between copies of the policy into the reference"),
    "vllm_importance_sampling_correction": ("algo.sampler_correction", "tis, capped at algo.sampler_correction_cap"),
    "use_bias_correction_kl": (
        "algo.kl_ratio",
        "the KL weighted by the ratio; TRL's default is true, grpo-cli's false",
    ),
    "max_completion_length": ("sampler.max_new_tokens", ""),
    "max_prompt_length": ("data.max_prompt_length", ""),
    "temperature": ("sampler.temperature", ""),
    "learning_rate": ("optimizer.lr", ""),
    "lr": ("optimizer.lr", ""),
    "lr_scheduler_type": ("optimizer.scheduler", ""),
    "warmup_steps": ("optimizer.warmup_steps", ""),
    "weight_decay": ("optimizer.weight_decay", ""),
    "max_grad_norm": ("optimizer.max_grad_norm", ""),
    "gradient_accumulation_steps": (
        "trainer.micro_batch_size",
        "completions per micro-batch; a step accumulates its whole batch, prompts_per_step x G, over them",
    ),
    "per_device_train_batch_size": ("trainer.micro_batch_size", "completions per forward/backward"),
    "generation_batch_size": ("trainer.prompts_per_step", "prompts per step; the batch is that times G"),
    "max_steps": ("trainer.steps", ""),
    "steps": ("trainer.steps", ""),
    "num_train_epochs": ("trainer.steps", "grpo-cli counts steps"),
    "bf16": ("trainer.precision", "trainer.precision=bf16-mixed, or auto"),
    "fp16": ("trainer.precision", "fp16 training is not offered; bf16-mixed or auto"),
    "seed": ("trainer.seed", ""),
    "logging_steps": ("trainer.log_every", ""),
    "save_steps": ("trainer.save_every", ""),
    "save_total_limit": ("trainer.keep_last", ""),
    "report_to": ("trainer.trackers", "a list of tensorboard, wandb, mlflow, trackio"),
    "gradient_checkpointing": ("model.gradient_checkpointing", ""),
    "use_vllm": ("generator", "generator=vllm"),
    "reward_funcs": ("reward.fn", "reward=python reward.fn=[my.py:f,my.py:g]"),
    "reward_weights": ("reward.weights", ""),
    "model_name_or_path": ("model.path", ""),
    "dataset_name": ("data.hub_name", "data=hub"),
    "tools": ("env.tools", "GRPOTrainer's tools: env.tools=[my_tools.py:f,my_tools.py:g]"),
    "environment_factory": ("env.factory", "GRPOTrainer's environment_factory: env.factory=my_env.py:MyEnv"),
    "max_tool_calling_iterations": ("env.max_turns", "it counts model turns: TRL's iterations + 1"),
}


def suggest(key: str, schema) -> str:
    """The end of the sentence for an unknown dotted key ('; did you mean X?'): TRL's name for it first, then
    the nearest key in the same place or the same name elsewhere, else the keys that are there."""
    last = key.rpartition(".")[2]
    if key.startswith("generator."):  # a key of another back-end's settings
        from grpo_cli.generate.base import GENERATORS

        owners = [name for name, b in GENERATORS.items() if last in {f.name for f in fields(b.settings)}]
        if owners:
            return f" of this generator: it is generator={' or generator='.join(owners)}'s; drop it or choose that one."
    if last in TRL_NAMES:
        target, note = TRL_NAMES[last]
        if target != key:
            return f"; {last} is TRL's name: here it is {target}{f' ({note})' if note else ''}."
    parent = key.rpartition(".")[0]
    siblings = [x for x in schema_keys(schema) if x.rpartition(".")[0] == parent]
    near = difflib.get_close_matches(key, siblings, n=1, cutoff=0.75)
    if near:
        return f"; did you mean {near[0]}?"
    elsewhere = [x for x in schema_keys(schema) if x.rpartition(".")[2] == last]
    if elsewhere:
        return f"; did you mean {elsewhere[0]}?"
    shown = [x.rpartition(".")[2] for x in siblings]
    return f"; the keys {'under ' + parent if parent else 'at the top'} are {', '.join(shown)}."


# Flags after which Hydra prints and exits without running a job: left to Hydra.
HYDRA_ONLY = ("--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--version")
MAX_COMBINATIONS = 256
WITH_ARGUMENT = (
    "--cfg",
    "-c",
    "--package",
    "-p",
    "--config-path",
    "-cp",
    "--config-name",
    "-cn",
    "--config-dir",
    "-cd",
)
HYDRA_FLAGS = (*HYDRA_ONLY, *WITH_ARGUMENT, "-m", "--multirun", "--run", "-r", "--resolve", "--experimental-rerun")


def search_path_override(config_dir: str) -> str:
    """`--config-dir DIR` as the override that adds DIR to Hydra's search path (what Hydra does with the flag);
    a directory that is not there is refused."""
    import os

    path = os.path.abspath(os.path.expanduser(config_dir))
    if not os.path.isdir(path):
        raise GrpoError(
            f"--config-dir {config_dir}: there is no directory {path}; give the folder holding your "
            "presets (e.g. myconf/experiment/mine.yaml for experiment=mine)."
        )
    return f"hydra.searchpath=[file://{path}]"


def flag_sentence(flag: str, value: str | None) -> str:
    """`--steps 10` (argparse habits, TRL's scripts): the key=value that was meant."""
    name = flag.lstrip("-").split("=", 1)[0].replace("-", "_")
    value = flag.split("=", 1)[1] if "=" in flag else value if value is not None and "=" not in value else "..."
    target = TRL_NAMES.get(name, (None,))[0]
    fix = f"here it is {target}={value}" if target and "." in target else "`grpo <command> --help` lists the keys"
    return f"{flag.split('=', 1)[0]} is not an option: grpo takes key=value overrides; {fix}."


def check_command_line(command: str, args: list[str], schema, disk: bool = True) -> None:
    """Compose `command`'s config with these command-line args and check it; a GrpoError if anything is wrong.
    `disk`: the paths `train` names as well (that they are there), for a single run."""
    if any(a in HYDRA_ONLY or a.startswith("--info") for a in args):
        return
    overrides, skip = [], False
    for i, a in enumerate(args):  # drop flags (and --cfg's / --package's argument) and Hydra's own settings
        if skip:
            skip = False
        elif a in WITH_ARGUMENT:
            skip = True
            if a in ("--config-dir", "-cd") and i + 1 < len(args):  # the user's own presets: searched as Hydra will
                overrides.append(search_path_override(args[i + 1]))
        elif a.startswith("-") and a.split("=", 1)[0] not in HYDRA_FLAGS:
            raise GrpoError(flag_sentence(a, args[i + 1] if i + 1 < len(args) else None))
        elif not a.startswith("-") and not a.lstrip("+~").startswith(("hydra.", "hydra/")):
            overrides.append(a)
    multirun = "-m" in args or "--multirun" in args
    for combination in expand(overrides) if multirun else [overrides]:
        # a sweep's jobs are checked on disk as each starts: a job's path may be another's output, and a job
        # whose model is missing is a row of the sweep's table, the others running
        check_one(command, combination, schema, disk and not multirun)


def expand(overrides: list[str]) -> list[list[str]]:
    """The jobs of a sweep, each as plain overrides (ranges and intervals, which a sweeper samples, are left out)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
    except Exception as e:  # the parser's own error types
        raise GrpoError(parse_sentence(e)) from None
    options = []
    for text, o in zip(overrides, parsed):
        if not o.is_sweep_override():
            options.append([text])
        elif o.is_discrete_sweep():
            key = text.split("=", 1)[0]
            options.append([f"{key}={v}" for v in o.sweep_string_iterator()])
    return [list(c) for c in itertools.islice(itertools.product(*options), MAX_COMBINATIONS)]


def compose_config(command: str, overrides: list[str], schema=None):
    """The command's config composed from `overrides` as Hydra would, as the schema's dataclass object;
    a composition error, an unknown key or a missing value is one sentence (GrpoError)."""
    from hydra import compose, initialize_config_module
    from omegaconf import OmegaConf
    from omegaconf.errors import MissingMandatoryValue

    import grpo_cli.generate.base  # noqa: F401 - registers the generator back-ends' options and settings
    from grpo_cli.config import register_configs, schema_of

    register_configs(command)
    schema = schema or schema_of(command)
    with initialize_config_module("grpo_cli.conf", version_base="1.3"):
        try:
            cfg = compose(command, overrides=overrides)
        except Exception as e:  # Hydra's and OmegaConf's composition errors
            raise GrpoError(composition_sentence(e, schema)) from None
    unknown = unknown_keys(cfg, schema)
    if unknown:
        key, near = unknown[0]
        raise GrpoError(f"{key} is not a setting{near}")
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        raise GrpoError(
            f"{e.full_key} is required here and has no value: set {e.full_key}=... on the command line."
        ) from None


def check_one(command: str, overrides: list[str], schema, disk: bool = True) -> None:
    from grpo_cli.config import check
    from grpo_cli.run import path_checks

    plain = compose_config(command, overrides, schema)
    check(plain)
    if command == "train" and disk:
        path_checks.check_train_paths(plain)


def _nested(f):
    """The dataclass a field holds (a config group), or None for a leaf."""
    default = f.default_factory() if callable(f.default_factory) else f.default
    return type(default) if is_dataclass(default) else None


def schema_keys(schema, prefix: str = "") -> list[str]:
    """Every dotted key of a dataclass schema."""
    out = []
    for f in fields(schema):
        out.append(prefix + f.name)
        if _nested(f) is not None:
            out += schema_keys(_nested(f), f"{prefix}{f.name}.")
    return out


def unknown_keys(node, schema, prefix: str = "", root=None) -> list[tuple[str, str]]:
    """(key, '; did you mean K?') for each key of the composed config (a DictConfig) that its schema lacks; a group
    is held to the schema its option chose (a generator back-end's settings)."""
    from omegaconf import DictConfig, OmegaConf

    known = {f.name: f for f in fields(schema)}
    found = []
    for k in node:
        v = node[k] if OmegaConf.is_missing(node, k) is False else None
        if k not in known:
            found.append((prefix + k, suggest(prefix + k, root or schema)))
        elif _nested(known[k]) is not None and isinstance(v, DictConfig):
            inner = OmegaConf.get_type(v) if is_dataclass(OmegaConf.get_type(v)) else _nested(known[k])
            found += unknown_keys(v, inner, f"{prefix}{k}.", root or schema)
    return found


def composition_sentence(e: Exception, schema) -> str:
    """One sentence for a Hydra/OmegaConf composition error."""
    from hydra.errors import MissingConfigException, OverrideParseException

    cause = e.__cause__ or e
    mark = getattr(e, "problem_mark", None)
    if mark is not None:  # a YAML file (a user's preset under --config-dir) that does not parse
        problem = str(getattr(e, "problem", None) or first_line(e)).rstrip(".")
        return (
            f"{mark.name} does not parse as YAML at line {mark.line + 1}, column {mark.column + 1} ({problem}); fix "
            "that file."
        )
    if isinstance(e, OverrideParseException):
        return parse_sentence(e)
    if isinstance(e, MissingConfigException):
        group = (e.missing_cfg_file or "").split("/")[0]
        options = ", ".join(sorted(e.options or []))
        return (
            f"{first_line(e).rstrip('.')}; {group} takes {options}."
            if options
            else f"{first_line(e).rstrip('.')}; check the group and option names with `grpo <command> --help`."
        )
    key = getattr(cause, "full_key", None)
    text = first_line(cause)
    if key and ("not in" in str(cause) or "Key '" in str(cause)):
        return f"{key} is not a setting{suggest(key, schema)}"
    if key and "could not be converted" in str(cause):
        value = str(cause).split("'")[1] if "'" in str(cause) else "?"
        kind = str(cause).split("converted to ")[-1].split()[0].rstrip(".").lower()
        return f"{key}={value} is not {'an' if kind[:1] in 'aeiou' else 'a'} {kind}; give {key} a value of that type."
    if key and "is not a ListConfig, list or tuple" in str(cause):
        value = getattr(cause, "value", None) or "VALUE"
        return f"{key} takes a list: {key}=[{value}] (several: {key}=[a,b])."
    if "Ambiguous value for argument" in text:
        arg = text.split("'")[1] if "'" in text else "the value"
        return (
            f"{arg} is a comma-separated list, and a comma-separated list is a sweep: add -m to run one job per "
            "value (or quote it, key=\"'a,b'\", if it is one string)."
        )
    if key:
        return f"{key}: {text.rstrip('.')}."
    return f"{text.rstrip('.')}; check the override's spelling and value (`grpo <command> --help` lists the groups)."


def parse_sentence(e: Exception) -> str:
    text = first_line(e).rstrip(".")
    return (
        f"{text}; write overrides as key=value, and quote a value holding spaces, commas or '=' as key=\"'...'\" "
        "(a comma-separated list is a sweep, which needs -m)."
    )


def _override_value(value) -> str:
    """`value` written in Hydra's override grammar: strings quoted, lists and dicts in brackets."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_override_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ",".join(f"{k}:{_override_value(v)}" for k, v in value.items()) + "}"
    text = str(value)
    if re.fullmatch(r"[A-Za-z_./@~][A-Za-z0-9_./:@+~-]*", text) and text not in ("true", "false", "null"):
        return text  # as a user would type it (output_dir=runs/x), which the command line's own handling expects
    # Hydra's quoted string: a quote is escaped; a backslash is literal unless it precedes the closing quote
    body = text.replace("'", "\\'")
    trailing = len(body) - len(body.rstrip("\\"))
    return "'" + body + "\\" * trailing + "'"


def _flat(tree: dict, prefix: str = "") -> list[tuple[str, object]]:
    out = []
    for key, value in tree.items():
        if (
            isinstance(value, dict) and value and not (prefix == "env." and key == "factory")
        ):  # a dict value stays whole
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((f"{prefix}{key}", value))
    return out


def config_file_overrides(args: list[str]) -> list[str]:
    """`--config FILE` (TRL's habit: a run in a YAML file) as overrides before the command line's, which win:
    a group's option (`model: qwen`) or any keys, nested or dotted (`trainer: {steps: 50}`, `optimizer.lr: 1e-4`),
    so a run's own config.yaml works too. A missing or unreadable file is one sentence."""
    at = next((i for i, a in enumerate(args) if a == "--config" or a.startswith("--config=")), None)
    if at is None:
        return args
    if args[at] == "--config":
        if at + 1 >= len(args):
            raise GrpoError("--config needs a file: grpo train --config run.yaml [key=value ...].")
        path, rest = args[at + 1], args[:at] + args[at + 2 :]
    else:
        path, rest = args[at].split("=", 1)[1], args[:at] + args[at + 1 :]
    import yaml

    try:
        tree = yaml.safe_load(Path(path).read_text())
    except OSError as e:
        raise GrpoError(f"--config {path}: {e.strerror or e}; give the path of a YAML file of settings.") from None
    except yaml.YAMLError as e:
        where = getattr(e, "problem_mark", None)
        raise GrpoError(
            f"--config {path} is not valid YAML{f' (line {where.line + 1})' if where else ''}; fix the file."
        ) from None
    if tree is None:
        tree = {}
    if not isinstance(tree, dict):
        raise GrpoError(f"--config {path} holds a {type(tree).__name__}, not settings; write key: value lines.")
    given = {a.split("=", 1)[0].lstrip("+~") for a in rest if "=" in a and not a.startswith("-")}
    overrides = [f"{key}={_override_value(value)}" for key, value in _flat(tree) if key not in given]
    # before the command line's first override, so Hydra sees the overrides in one run (never split by --cfg job)
    at = next((i for i, a in enumerate(rest) if "=" in a and not a.startswith("-")), len(rest))
    return rest[:at] + overrides + rest[at:]
