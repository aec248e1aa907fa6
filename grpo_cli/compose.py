"""The config composed and checked before Hydra runs the job, in well under two seconds and before torch
is imported: a composition error (an unknown key, a wrong type, a missing group option, a malformed
override), a key added with `+` that the schema does not know, a missing required value, and every bad
value (checks.py) become one sentence naming the key, what is allowed and the fix. A sweep (`-m`) is
checked combination by combination before its first job starts.
"""

from __future__ import annotations

import difflib
import itertools
from dataclasses import fields, is_dataclass

from grpo_cli.errors import GrpoError, first_line

# Flags after which Hydra prints and exits without running a job: left to Hydra.
HYDRA_ONLY = ("--help", "-h", "--hydra-help", "--info", "-i", "--shell-completion", "-sc", "--version")
MAX_COMBINATIONS = 256


def check_command_line(command: str, args: list[str], schema) -> None:
    """Compose `command`'s config with these command-line args and check it; a GrpoError if anything is wrong."""
    if any(a in HYDRA_ONLY or a.startswith("--info") for a in args):
        return
    overrides, skip = [], False
    for a in args:  # drop flags (and --cfg's / --package's argument) and Hydra's own settings
        if skip:
            skip = False
        elif a in ("--cfg", "-c", "--package", "-p", "--config-path", "-cp", "--config-name", "-cn", "--config-dir", "-cd"):
            skip = True
        elif not a.startswith("-") and not a.lstrip("+~").startswith(("hydra.", "hydra/")):
            overrides.append(a)
    multirun = "-m" in args or "--multirun" in args
    for combination in (expand(overrides) if multirun else [overrides]):
        check_one(command, combination, schema)


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

    from grpo_cli.config import register_configs, schema_of

    register_configs()
    schema = schema or schema_of(command)
    with initialize_config_module("grpo_cli.conf", version_base="1.3"):
        try:
            cfg = compose(command, overrides=overrides)
        except Exception as e:  # Hydra's and OmegaConf's composition errors
            raise GrpoError(composition_sentence(e, schema)) from None
    unknown = unknown_keys(OmegaConf.to_container(cfg, resolve=False), schema)
    if unknown:
        key, near = unknown[0]
        raise GrpoError(f"{key} is not a setting{near}; remove it (a `+` adds a key, but nothing reads one the schema "
                        f"does not know).")
    try:
        return OmegaConf.to_object(cfg)
    except MissingMandatoryValue as e:
        raise GrpoError(f"{e.full_key} is required here and has no value: set {e.full_key}=... on the command line.") from None


def check_one(command: str, overrides: list[str], schema) -> None:
    from grpo_cli import checks

    plain = compose_config(command, overrides, schema)
    {"train": checks.check_train, "evaluate": checks.check_evaluate, "sample": checks.check_sample}[command](plain)


def _nested(f):
    """The dataclass a field holds (a config group), or None for a leaf."""
    default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
    return type(default) if is_dataclass(default) else None


def schema_keys(schema, prefix: str = "") -> list[str]:
    """Every dotted key of a dataclass schema."""
    out = []
    for f in fields(schema):
        out.append(prefix + f.name)
        if _nested(f) is not None:
            out += schema_keys(_nested(f), f"{prefix}{f.name}.")
    return out


def unknown_keys(node: dict, schema, prefix: str = "") -> list[tuple[str, str]]:
    """(key, ' (did you mean K?)') for each key of the composed config that the schema lacks."""
    known = {f.name: f for f in fields(schema)}
    found = []
    for k, v in node.items():
        if k not in known:
            near = difflib.get_close_matches(k, list(known), n=1)
            found.append((prefix + k, f" (did you mean {prefix}{near[0]}?)" if near else ""))
        elif _nested(known[k]) is not None and isinstance(v, dict):
            found += unknown_keys(v, _nested(known[k]), f"{prefix}{k}.")
    return found


def composition_sentence(e: Exception, schema) -> str:
    """One sentence for a Hydra/OmegaConf composition error."""
    from hydra.errors import MissingConfigException, OverrideParseException

    cause = e.__cause__ or e
    if isinstance(e, OverrideParseException):
        return parse_sentence(e)
    if isinstance(e, MissingConfigException):
        group = (e.missing_cfg_file or "").split("/")[0]
        options = ", ".join(sorted(e.options or []))
        return (f"{first_line(e).rstrip('.')}; {group} takes {options}." if options else f"{first_line(e).rstrip('.')}; "
                "check the group and option names with `grpo <command> --help`.")
    key = getattr(cause, "full_key", None)
    text = first_line(cause)
    if key and ("not in" in str(cause) or "Key '" in str(cause)):
        siblings = [x for x in schema_keys(schema) if x.rsplit(".", 1)[0] == key.rsplit(".", 1)[0]]
        near = difflib.get_close_matches(key, siblings, n=1)
        hint = f"did you mean {near[0]}?" if near else f"the keys there are {', '.join(s.rsplit('.', 1)[-1] for s in siblings)}."
        return f"{key} is not a setting; {hint}"
    if key and "could not be converted" in str(cause):
        value = str(cause).split("'")[1] if "'" in str(cause) else "?"
        kind = str(cause).split("converted to ")[-1].split()[0].rstrip(".").lower()
        return f"{key}={value} is not {'an' if kind[:1] in 'aeiou' else 'a'} {kind}; give {key} a value of that type."
    if key:
        return f"{key}: {text.rstrip('.')}."
    return f"{text.rstrip('.')}; check the override's spelling and value (`grpo <command> --help` lists the groups)."


def parse_sentence(e: Exception) -> str:
    text = first_line(e).rstrip(".")
    return (f"{text}; write overrides as key=value, and quote a value holding spaces, commas or '=' as key=\"'...'\" "
            "(a comma-separated list is a sweep, which needs -m).")
