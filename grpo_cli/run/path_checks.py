"""What the disk shows of `grpo train`'s config, checked after its values and before torch loads (10 s on a
small machine): a model directory that is not there or holds no model, a data file or resume path that is
not there, a reward.fn, env.factory or env.tools module that is nowhere on the path. The loaders say the
same later; here a mistake costs a second. Kept apart from the settings' declarations (config/), whose values the
docs' example
commands are checked against (their paths, such as /models/my-sft, are examples)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from grpo_cli.config.commands import NO_RESUME
from grpo_cli.config.data import FILE_FORMATS
from grpo_cli.config.declare import Problems
from grpo_cli.config.reward import term_specs
from grpo_cli.models.paths import local_problem
from grpo_cli.registry import is_file_spec, split_spec


def check_train_paths(cfg) -> None:
    """What the disk shows of `grpo train`'s paths and modules, before torch loads (as the module's docstring
    lists them); one sentence for all that is wrong."""
    p = Problems()
    if str(cfg.model.path).strip():
        p.need(not (problem := local_problem(str(cfg.model.path), "model.path")), problem or "")
    if cfg.reward.model_path and "model" in {kind for _, kind, _ in term_specs(cfg.reward)}:
        p.need(not (problem := local_problem(str(cfg.reward.model_path), "reward.model_path")), problem or "")
    if cfg.data.name == "files":
        for key in ("train_file", "test_file"):
            path = getattr(cfg.data, key, None)
            if path and Path(path).suffix.lower() in FILE_FORMATS:
                p.need(Path(path).expanduser().is_file(), f"data.{key}={path} does not exist")
    resume = str(cfg.resume).strip() if cfg.resume is not None else ""
    if resume.lower() not in (*NO_RESUME, "auto"):  # as run/resume.resolve_resume reads it
        p.need(
            Path(resume).expanduser().exists(),
            f"resume={resume} is neither a checkpoint nor a run directory: "
            "nothing is there; pass resume=auto, a checkpoints/step-N path, "
            "or resume=false",
        )
    factories = cfg.env.factory.items() if isinstance(cfg.env.factory, Mapping) else [("", cfg.env.factory)]
    specs = [("env.tools", str(t), cfg.env.fn_dir) for t in cfg.env.tools or []]
    specs += [(f"env.factory{'.' + str(k) if k else ''}", str(v), cfg.env.fn_dir) for k, v in factories if v]
    specs += [
        ("reward.fn", spec, cfg.reward.fn_dir) for _, kind, spec in term_specs(cfg.reward) if kind == "python" and spec
    ]
    for key, spec, base in specs:
        if not is_file_spec(spec) and (":" in spec or "." in spec):
            p.need(not (problem := missing_module(key, spec, base)), problem or "")
    p.raise_if_any()


def missing_module(key: str, spec: str, base: str | None) -> str | None:
    """The clause for a `module:name` spec whose top-level module is nowhere to be found (on the path, or in
    `base`, where the loader also looks), as rewards/python_fn.load_function says it; None when it may load.
    Nothing is imported: that waits until torch is loaded, as before."""
    import importlib.util

    module, attr = split_spec(spec)
    top, base = module.split(".")[0], os.path.abspath(base or os.getcwd())
    if (
        not top
        or is_file_spec(spec)
        or importlib.util.find_spec(top) is not None
        or os.path.exists(os.path.join(base, top + ".py"))
        or os.path.isdir(os.path.join(base, top))
    ):
        return None
    return (
        f"{key}={spec!r} cannot be imported (ModuleNotFoundError: No module named {top!r}); put its module on "
        f"PYTHONPATH or in {base}, or name the file ({key}=path/to/{module.rpartition('.')[2]}.py:{attr})"
    )
