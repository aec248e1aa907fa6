"""grpo-cli from Python (a notebook, a script): the three commands, taking the command line's overrides.

    from grpo_cli import train, evaluate, sample

    def brevity(completions, **kwargs):            # any reward function, TRL's convention included
        return [1.0 / (1 + len(c)) for c in completions]

    summary = train("trainer.steps=20", "output_dir=runs/nb", reward_funcs=[brevity])
    scores = evaluate(f"checkpoint={summary['run_dir']}", "samples=0")
    rows = sample(f"checkpoint={summary['run_dir']}", "prompt='3+4='")

How it works in detail: docs/internals.md, grpo_cli/api.py.
"""

from __future__ import annotations

import sys
import types
from typing import Any, Callable, Sequence

from grpo_cli.errors import GrpoError

MODULE = "grpo_cli.notebook_rewards"  # where reward_funcs live while a call runs, so reward.fn can name them


def _register(f) -> str:
    """`f` put in MODULE under its own name (numbered when another object holds it): its spec, MODULE:name."""
    module = sys.modules.setdefault(MODULE, types.ModuleType(MODULE))
    name = getattr(f, "__name__", "reward").replace("<lambda>", "reward")
    taken = {n for n in vars(module) if not n.startswith("__")}
    base, i = name, 2
    while name in taken and getattr(module, name) is not f:
        name, i = f"{base}_{i}", i + 1
    setattr(module, name, f)
    return f"{MODULE}:{name}"


def _env_overrides(tools, environment_factory) -> list[str]:
    """TRL's `tools` and `environment_factory`, given as Python objects, as env.tools and env.factory."""
    out = []
    if tools is not None:
        tools = [tools] if callable(tools) else list(tools)
        if not all(callable(t) for t in tools):
            raise GrpoError("tools must be a function or a list of typed functions with docstrings.")
        out.append(f"env.tools=[{','.join(map(_register, tools))}]")
    if isinstance(environment_factory, dict):  # several: each row's environment column names one (TRL's dict)
        if not environment_factory or not all(callable(f) for f in environment_factory.values()):
            raise GrpoError("environment_factory as a dict maps names to classes (or functions) making environments.")
        named = ",".join(f"{name}:'{_register(f)}'" for name, f in environment_factory.items())
        out.append(f"env.factory={{{named}}}")
    elif environment_factory is not None:
        if not callable(environment_factory):
            raise GrpoError("environment_factory must be a class (or a function) making one environment per episode.")
        out.append(f"env.factory={_register(environment_factory)}")
    return out


def _reward_overrides(reward_funcs, reward_weights) -> list[str]:
    if reward_funcs is None:
        if reward_weights is not None:
            raise GrpoError("reward_weights needs reward_funcs, the functions they weigh.")
        return []
    funcs = [reward_funcs] if callable(reward_funcs) else list(reward_funcs)
    if not funcs or not all(callable(f) for f in funcs):
        raise GrpoError("reward_funcs must be a function or a list of functions fn(completions, **kwargs) -> floats.")
    out = ["reward=python", f"reward.fn=[{','.join(map(_register, funcs))}]"]
    if reward_weights is not None:
        out.append(f"reward.weights=[{','.join(str(float(w)) for w in reward_weights)}]")
    return out


def _dataset_file(ds, name: str) -> str:
    """A `datasets.Dataset` as a parquet file in the user's cache, named by its content's fingerprint, so a
    run's config names a file that outlives the call (resume and evaluate read it again)."""
    import os
    from pathlib import Path

    if not hasattr(ds, "to_parquet") or not hasattr(ds, "column_names"):
        raise GrpoError(
            f"{name} must be a datasets.Dataset (a DatasetDict: pass one split, e.g. ds['train']), "
            f"not {type(ds).__name__}."
        )
    root = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "grpo-cli" / "datasets"
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{getattr(ds, '_fingerprint', None) or abs(hash(tuple(map(str, ds[:50].items()))))}.parquet"
    if not path.exists():
        tmp = path.with_suffix(".tmp")
        ds.to_parquet(str(tmp))
        tmp.replace(path)
    return str(path)


def _data_overrides(overrides: Sequence[str], train_dataset, eval_dataset) -> list[str]:
    """TRL's `train_dataset=` / `eval_dataset=` as data=files with those files."""
    if train_dataset is None:
        if eval_dataset is not None:
            raise GrpoError("eval_dataset needs train_dataset (or data.test_file= with data=files).")
        return []
    if any(str(o).split("=", 1)[0] in ("data", "data.train_file", "data.test_file") for o in overrides):
        raise GrpoError("train_dataset= is the training data: leave out data=, data.train_file= and data.test_file=.")
    out = ["data=files", f"data.train_file='{_dataset_file(train_dataset, 'train_dataset')}'"]
    if eval_dataset is not None:
        out.append(f"data.test_file='{_dataset_file(eval_dataset, 'eval_dataset')}'")
    return out


def _call(command: str, overrides: Sequence[str], extra: list[str]) -> Any:
    import grpo_cli.cli as cli

    try:
        return cli.main([command, *map(str, overrides), *extra])
    except SystemExit as e:
        if e.code in (0, None):
            return cli._result
        raise GrpoError(cli._error or f"grpo {command} stopped with exit code {e.code}; see the lines above.") from None


def train(
    *overrides: str,
    reward_funcs: Callable | Sequence[Callable] | None = None,
    reward_weights: Sequence[float] | None = None,
    tools: Sequence[Callable] | None = None,
    environment_factory: Callable | None = None,
    train_dataset=None,
    eval_dataset=None,
) -> dict:
    """`grpo train OVERRIDES`; the run summary. `train_dataset` / `eval_dataset`: `datasets.Dataset` objects,
    as TRL's trainer takes them (without eval_dataset, data.test_size of the training rows are held out)."""
    return _call(
        "train",
        overrides,
        _reward_overrides(reward_funcs, reward_weights)
        + _env_overrides(tools, environment_factory)
        + _data_overrides(overrides, train_dataset, eval_dataset),
    )


def evaluate(
    *overrides: str,
    reward_funcs: Callable | Sequence[Callable] | None = None,
    reward_weights: Sequence[float] | None = None,
    tools: Sequence[Callable] | None = None,
    environment_factory: Callable | None = None,
) -> dict:
    """`grpo evaluate OVERRIDES`; the scores of every model (eval.json's content)."""
    return _call(
        "evaluate",
        overrides,
        _reward_overrides(reward_funcs, reward_weights) + _env_overrides(tools, environment_factory),
    )


def sample(
    *overrides: str,
    reward_funcs: Callable | Sequence[Callable] | None = None,
    reward_weights: Sequence[float] | None = None,
    tools: Sequence[Callable] | None = None,
    environment_factory: Callable | None = None,
) -> list[dict]:
    """`grpo sample OVERRIDES`; one dict per completion (prompt, completion, tokens, reward when scored)."""
    return _call(
        "sample",
        overrides,
        _reward_overrides(reward_funcs, reward_weights) + _env_overrides(tools, environment_factory),
    )
