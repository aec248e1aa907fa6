"""One declaration per setting: a schema field's type, default, allowed values or range, one-line help and check,
written once beside the field (`setting`). `--help`, the docs' reference, the YAML files' comments and the checks
read it. A rule between keys is a function registered with the keys it reads (`rule`). Everything is checked
before torch loads: the allowed values a registry holds are named by import path and read from it then."""

from __future__ import annotations

import math
import typing
from collections.abc import Callable, Iterator
from dataclasses import MISSING, FrozenInstanceError, dataclass, field, fields, is_dataclass, replace

from grpo_cli.errors import GrpoError
from grpo_cli.registry import import_plugin, load

MAX_TIMEOUT_S = 86400.0  # a deadline past a day is a typo (and past threading.TIMEOUT_MAX, a crash mid-run)


@dataclass(frozen=True)
class Declared:
    """What a setting declares beside its type and default (setting's arguments)."""

    help: str
    choices: tuple | str | Callable | None = None
    low: float | None = None
    high: float | None = None
    above: bool = False  # low is excluded
    below: bool = False  # high is excluded
    finite: bool = False  # a number, finite, whatever its range
    when: Callable | None = None
    check: Callable | None = None

    def allowed(self) -> tuple:
        """The allowed values: the declared tuple, a registry's names ("module:NAME"), or a callable's."""
        choices = self.choices
        if isinstance(choices, str):
            choices = load(choices)
        if callable(choices):
            choices = choices()
        return tuple(choices or ())

    def range_text(self, integer: bool = False) -> str:
        if integer and self.low is not None and self.high is not None and not (self.above or self.below):
            return f"between {self.low:g} and {self.high:g}"
        lo = "" if self.low is None else f"{'>' if self.above else '>='} {self.low:g}"
        hi = "" if self.high is None else f"{'<' if self.below else '<='} {self.high:g}"
        return " and ".join(x for x in (lo, hi) if x)


def setting(
    default=MISSING,
    help: str = "",
    *,
    factory=None,
    choices=None,
    low=None,
    high=None,
    above=False,
    below=False,
    finite=False,
    when=None,
    check=None,
):
    """A schema field declared once (see the module docstring): `choices` a tuple, a "module:NAME" registry or a
    callable; `low`/`high` a range (`above`/`below` exclude the bound), `finite` a finite number; `when(config)`
    whether it is read (checked
    only then); `check(value)` a clause naming what is wrong, or None. A None value of a setting whose default is
    None means "off" and is not checked."""
    meta = {"declared": Declared(help, choices, low, high, above, below, finite, when, check)}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Rule:
    keys: tuple[str, ...]  # the dotted keys it reads: it runs where the config has all their groups
    check: Callable  # check(problems, config)


RULES: list[Rule] = []


class Settings:
    """A config group's base. Hydra needs its groups mutable while it composes; the edge (`grpo train` once its
    config is checked and its paths made absolute, `evaluate` and `sample` once the saved settings are merged)
    calls `freeze`, and from then on every builder reads settings that can no longer change under it."""

    def __setattr__(self, name: str, value) -> None:
        if self.__dict__.get("_frozen"):
            raise FrozenInstanceError(f"{type(self).__name__}.{name} is frozen: settings are fixed at the edge")
        object.__setattr__(self, name, value)


def freeze(config):
    """`config` and every group in it, frozen; returns `config`. A list stays a list (config.yaml and the resume
    check compare it as one): its key cannot be reassigned, though its items are not guarded."""
    for f in fields(config):
        value = getattr(config, f.name)
        if is_dataclass(value):
            freeze(value)
    object.__setattr__(config, "_frozen", True)
    return config


def amended(config, **changes):
    """A copy of `config` with `changes`, frozen when `config` is (a reward term's own `fn`, one environment of a
    dict of them)."""
    out = replace(config, **changes)
    return freeze(out) if config.__dict__.get("_frozen") else out


def rule(*keys: str):
    """Register `check(problems, config)`, a rule between `keys`."""

    def add(fn: Callable) -> Callable:
        RULES.append(Rule(keys, fn))
        return fn

    return add


class Problems(list):
    """What is wrong, as clauses of one sentence."""

    def need(self, ok: bool, message: str) -> None:
        if not ok:
            self.append(message)

    def raise_if_any(self) -> None:
        if self:
            raise GrpoError("; ".join(self) + ".")


def declared(f) -> Declared | None:
    return f.metadata.get("declared")


def nested(f) -> type | None:
    """The dataclass a field holds (a config group), or None for a leaf."""
    default = f.default_factory() if f.default_factory is not MISSING else f.default
    return type(default) if is_dataclass(default) else None


def walk(config, prefix: str = "") -> Iterator[tuple[str, typing.Any, typing.Any, typing.Any]]:
    """(dotted key, field, value, its type) of every leaf setting of a config object."""
    hints = typing.get_type_hints(type(config))
    for f in fields(config):
        value = getattr(config, f.name)
        if is_dataclass(value):
            yield from walk(value, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f, value, hints.get(f.name)


def schema_walk(schema: type, prefix: str = "") -> Iterator[tuple[str, object]]:
    """(dotted key, field) of every setting of a schema class, its groups' defaults included."""
    for f in fields(schema):
        inner = nested(f)
        if inner is not None:
            yield from schema_walk(inner, f"{prefix}{f.name}.")
        else:
            yield f"{prefix}{f.name}", f


def is_int(kind) -> bool:
    return kind is int or typing.get_args(kind) == (int, type(None))


def value_problem(key: str, value, d: Declared, kind, default=MISSING) -> str | None:
    """The clause for a value its declaration refuses, or None. A choice left at its default is not looked up
    (a registry's module is imported only when a run names one of its entries)."""
    allowed = d.allowed() if d.choices is not None and value != default else None
    if allowed is not None:
        for v in value if isinstance(value, (list, tuple)) else [value]:
            if v not in allowed:
                return f"{key}={v!r} must be one of {', '.join(map(str, allowed))}"
    if d.finite or d.low is not None or d.high is not None:
        numeric = isinstance(value, (int, float)) and not isinstance(value, bool)
        if not numeric or not math.isfinite(value):
            return f"{key}={value} must be {'an integer' if is_int(kind) else 'a finite number'}"
        low_ok = d.low is None or (value > d.low if d.above else value >= d.low)
        high_ok = d.high is None or (value < d.high if d.below else value <= d.high)
        if not (low_ok and high_ok):
            return f"{key}={value} must be {d.range_text(is_int(kind))}"
    return d.check(value) if d.check is not None else None


def check(config) -> None:
    """Every declared setting of `config` and every rule between its keys; one GrpoError for all that is wrong."""
    for spec in getattr(config, "plugins", None) or ():  # what they register is allowed below
        import_plugin(spec)
    problems = Problems()
    for key, f, value, kind in walk(config):
        d = declared(f)
        if d is None or (value is None and f.default is None) or (d.when is not None and not d.when(config)):
            continue
        default = f.default_factory() if f.default_factory is not MISSING else f.default  # an empty list's too
        problem = value_problem(key, value, d, kind, default)
        if problem:
            problems.append(problem)
    groups = {f.name for f in fields(config)}
    for r in RULES:
        if all(k.split(".")[0] in groups for k in r.keys):
            r.check(problems, config)
    problems.raise_if_any()
