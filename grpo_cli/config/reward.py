"""The `reward` group: one flat schema for every reward, so `combo` builds any term from the same keys; each key
is read (and checked) where a term in use reads it."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import Any, List, Optional

from grpo_cli.config.declare import MAX_TIMEOUT_S, Settings, rule, setting
from grpo_cli.config.model import device_problem
from grpo_cli.registry import function_name, is_file_spec, load

ENVIRONMENT_REWARDS = ("auto", "none")  # the environment's own reward when it scores (auto: else exact_match)
EXTRACTS = ("last_number", "hash", "boxed", "regex", "full")  # the answer inside a completion
ANSWER_READERS = ("exact_match", "math")  # the terms that compare with the data's answer (none to compare: refused)


def rewards() -> tuple[str, ...]:
    """The rewards a term can name (rewards.BUILDERS: its modules are imported only when built)."""
    return tuple(load("grpo_cli.rewards:BUILDERS"))


def term_names(r) -> list[str]:
    """The rewards the `reward` group adds up: reward.terms under combo, none under none, else reward.name
    (auto standing for exact_match)."""
    names = list(r.terms) if r.name == "combo" else [] if r.name == "none" else [r.name]
    return ["exact_match" if n == "auto" else n for n in names]


def term_specs(r) -> list[tuple[str, str, Optional[str]]]:
    """(logged name, reward, reward.fn) of every term: a list in `reward.fn` makes one term per function, named
    after it (TRL's `reward_funcs`)."""
    out: list[tuple[str, str, Optional[str]]] = []
    for name in term_names(r):
        if name == "python" and isinstance(r.fn, (list, tuple)):
            for spec in r.fn:
                label, taken = function_name(str(spec)), {n for n, _, _ in out}
                label = (
                    next(f"{label}_{i}" for i in range(2, len(out) + 3) if f"{label}_{i}" not in taken)
                    if label in taken
                    else label
                )
                out.append((label, "python", str(spec)))
        else:
            out.append((name, name, r.fn if name == "python" else None))
    return out


def uses(term: str):
    """`when`: the key is read by reward term `term`."""
    return lambda c: term in term_names(c.reward)


def user_file(path: str, base: str | None) -> str:
    """Where a file the config names is: relative to `base` (reward.fn_dir, env.fn_dir), else to the directory
    grpo runs in."""
    return os.path.normpath(os.path.join(os.path.abspath(base or os.getcwd()), os.path.expanduser(path)))


def _compiles(key: str, flags: int = 0):
    def problem(value) -> str | None:
        try:
            re.compile(value, flags)
        except re.error as e:
            return f"{key} {value!r} does not compile ({e}); fix the regex"
        return None

    return problem


@dataclass
class RewardConfig(Settings):
    name: str = setting(
        "auto",
        "the reward: auto (an environment's own, else exact_match), none, combo, or a term",
        choices=lambda: (*ENVIRONMENT_REWARDS, *rewards(), "combo"),
    )
    terms: List[str] = setting(
        factory=list, help="rewards to combine: exact_match, math, format, length, model, python, code", choices=rewards
    )
    weights: List[float] = setting(factory=list, help="one weight per term, e.g. [1.0, 0.2] ([] = all 1.0)")
    extract: str = setting(
        "last_number",
        "last_number | hash (text after ####) | boxed (\\boxed{...}) | regex (uses pattern) | full (whole completion)",
        choices=EXTRACTS,
    )
    pattern: Optional[str] = setting(None, "regex with one group, used when extract=regex")
    format_pattern: str = setting(
        r"<think>.*?</think>\s*<answer>.*?</answer>",
        "format: regex the whole completion must match",
        check=_compiles("reward.format_pattern", re.DOTALL),
        when=uses("format"),
    )
    max_length: int = setting(512, "length: L_max, tokens at which the penalty reaches -1", low=1, when=uses("length"))
    overlong_buffer: int = setting(128, "length: L_cache, tokens before max_length where it grows", when=uses("length"))
    model_path: Optional[str] = setting(None, "model: hub id or directory of a one-label classifier")
    model_batch_size: int = setting(16, "model: texts scored per forward pass", low=1, when=uses("model"))
    model_device: str = setting(
        "auto",
        "model: auto = cuda when present, else cpu",
        when=uses("model"),
        check=device_problem("reward.model_device"),
    )
    fn: Any = setting(None, "python: your function(s), my_rewards.py:score or [a.py:f,b.py:g]")
    fn_dir: Optional[str] = setting(None, "python: where relative files and modules are found (a run saves it)")
    correct: str = setting(
        "reward",
        "what accuracy, pass@k and maj@k count as right: reward (reaches the threshold) "
        "| answer (extracted answer matches)",
        choices=("reward", "answer"),
    )
    correct_threshold: Optional[float] = setting(
        None, "the reward a correct completion reaches (null = the reward's maximum)", finite=True
    )
    tests_field: str = setting(
        "tests",
        "code: dataset column of each row's tests (stdin/stdout pairs or asserts)",
        when=uses("code"),
        check=lambda v: (
            None if v else "reward=code needs reward.tests_field, the dataset column holding each row's tests"
        ),
    )
    code_cpu_s: float = setting(
        2.0,
        "code: CPU seconds a test may use (the wall clock allows 2x + 1 s)",
        low=0,
        above=True,
        high=600,
        when=uses("code"),
    )
    code_memory_mib: int = setting(512, "code: address space of a test's process, MiB", low=32, when=uses("code"))
    code_output_kib: int = setting(
        1024, "code: the largest file a test may write, stdout included, KiB", low=1, when=uses("code")
    )
    code_processes: int = setting(16, "code: processes a test may have (per test namespace)", low=1, when=uses("code"))
    sandbox: str = setting(
        "os",
        "code: os (namespaces, a read-only view, seccomp) | process (without them, chosen explicitly)",
        choices=("os", "process"),
        when=uses("code"),
    )
    workers: int = setting(
        0, "score in N worker processes, each completion with a deadline (0 = in the training process)", low=0
    )
    timeout_s: float = setting(
        30.0,
        "workers: seconds a completion may take; past it, or if its worker dies, it scores None",
        low=0,
        above=True,
        high=MAX_TIMEOUT_S,
    )
    max_failed_fraction: float = setting(
        0.1, "workers: a step with more completions failed than this share stops the run", low=0, high=1
    )
    worker_memory_gib: float = setting(4.0, "workers: each worker's address-space limit, GiB (0 = none)", low=0)


@rule("reward.extract", "reward.pattern")
def _pattern(p, c) -> None:
    r = c.reward
    if r.extract != "regex":
        return
    try:
        groups = re.compile(r.pattern or "").groups
    except re.error as e:
        p.append(f"reward.pattern {r.pattern!r} does not compile ({e}); fix the regex")
        return
    p.need(
        bool(r.pattern),
        "reward.extract=regex needs reward.pattern, a regex with one capture group such as 'answer: (\\d+)'",
    )
    p.need(
        not r.pattern or groups >= 1,
        f"reward.pattern={r.pattern} has no capture group; put the answer part in parentheses, e.g. 'answer: (\\d+)'",
    )


@rule("reward.name", "reward.terms", "reward.weights", "reward.fn")
def _terms_and_weights(p, c) -> None:
    r = c.reward
    if r.name == "combo":
        p.need(bool(r.terms), "reward=combo needs reward.terms, the rewards to add up (e.g. [exact_match,format])")
        p.need(
            len(set(r.terms)) == len(r.terms),
            f"reward.terms={list(r.terms)} names a reward twice (several python "
            "rewards are one python term with a list: reward.fn=[a.py:f,b.py:g])",
        )
    else:
        p.need(not r.terms, "reward.terms is only read by reward=combo")
    fns = r.fn if isinstance(r.fn, (list, tuple)) else None
    if fns is not None:
        p.need(
            bool(fns) and all(isinstance(f, str) and f for f in fns),
            f"reward.fn={list(fns)} must list functions such as [my_rewards.py:fmt,mypkg.rewards:acc]",
        )
    specs = term_specs(r)
    for file in sorted({s.partition(":")[0] for _, kind, s in specs if kind == "python" and s and is_file_spec(s)}):
        where = user_file(file, r.fn_dir)  # a reward file that is not there: refused before torch is imported
        p.need(
            os.path.isfile(where),
            f"reward.fn names {file}, but there is no file {where}; give the path to your "
            "rewards file (relative to the directory grpo runs in)",
        )
    if fns is not None or r.name == "combo":
        labels = [label for label, _, _ in specs]
        p.need(
            not r.weights or not labels or len(r.weights) == len(labels),
            f"reward.weights has {len(r.weights)} "
            f"values for the {len(labels)} reward terms {labels}; give one weight per term",
        )
    else:
        p.need(not r.weights, "reward.weights is only read by reward=combo or a list of functions in reward.fn")
    for i, w in enumerate(r.weights):
        p.need(
            isinstance(w, (int, float)) and w == w and abs(w) != float("inf"),
            f"reward.weights[{i}]={w} must be a finite number",
        )
    p.need(
        not r.weights or any(w != 0 for w in r.weights if isinstance(w, (int, float))),
        f"reward.weights={list(r.weights)} are all zero, so every completion would score 0 and nothing would be "
        "learned; give at least one term a non-zero weight",
    )


@rule("reward.max_length", "reward.overlong_buffer")
def _overlong_buffer(p, c) -> None:
    r = c.reward
    if "length" in term_names(r):
        p.need(
            0 <= r.overlong_buffer < r.max_length,
            f"reward.overlong_buffer={r.overlong_buffer} must be >= 0 and below reward.max_length={r.max_length}",
        )


@rule("reward.model_path", "reward.fn")
def _what_the_terms_need(p, c) -> None:
    r, names = c.reward, term_names(c.reward)
    if "model" in names:
        p.need(bool(r.model_path), "reward=model needs reward.model_path, a one-label sequence classifier")
    if "python" in names:
        p.need(
            bool(r.fn),
            "reward=python needs reward.fn, your function such as my_rewards.py:score or mypkg.rewards:score",
        )
