"""Code named by a string: registries name what they hold by import path ("module:attribute") until it is
used, so the names can be read before torch loads; the user's functions and classes are named by a module or
a file (`mypkg.rewards:score`, `my_rewards.py:score`) and loaded from there."""

from __future__ import annotations

import importlib
import os
import re
import sys
from typing import Any, Callable

from grpo_cli.errors import GrpoError


def load(entry: Callable | str) -> Any:
    """A registry entry: a "module:attribute" string imported now, or the object itself."""
    if isinstance(entry, str):
        module, attribute = entry.split(":")
        return getattr(importlib.import_module(module), attribute)
    return entry


def is_file_spec(spec: str) -> bool:
    """`my_rewards.py:score` or `dir/rewards.py:score`: a file, not a module name."""
    return spec.partition(":")[0].endswith(".py") or "/" in spec.partition(":")[0]


def function_name(spec: str) -> str:
    """The function's own name, which its term is logged under when reward.fn lists several."""
    module, sep, attr = spec.partition(":")
    return attr if sep else spec.rpartition(".")[2]


def split_spec(spec: str) -> tuple[str, str]:
    """(module or file, function) of `mypkg.rewards:score`, `mypkg.rewards.score` or `my_rewards.py:score`."""
    module_name, sep, attr = spec.partition(":")
    if not sep and not is_file_spec(spec):
        module_name, _, attr = spec.rpartition(".")
    return module_name, attr


def load_function(spec: str, base: str | None = None, key: str = "reward.fn"):
    """The callable `spec` names, or a GrpoError saying why it cannot be had (naming the config `key`).
    `base` (reward.fn_dir, else the current directory) is where a relative file path and a module beside
    the user's files are found."""
    base = os.path.abspath(base or os.getcwd())
    module_name, attr = split_spec(spec)
    if not module_name or not attr:
        raise GrpoError(f"{key}={spec!r} names no function; write it as mypkg.rewards:score or my_rewards.py:score.")
    hint = f", or name the file ({key}=path/to/{module_name.rpartition('.')[2]}.py:{attr})"
    module = _user_module(module_name, spec, base, key, hint)
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise GrpoError(f"{key}={spec!r}: {module_name!r} has no function {attr!r}.")
    return fn


def import_plugin(spec: str, base: str | None = None):
    """The module `plugins=[spec]` names (a file, `my_format.py`, or a module, `mypkg.formats`), imported once:
    what it registers (a tool-call format, an environment kind, a generator, a reward, an advantage, a loss) is
    there before the config is checked."""
    return _user_module(spec, spec, os.path.abspath(base or os.getcwd()), "plugins", ", or name its file")


def _user_module(name: str, spec: str, base: str, key: str, hint: str):
    """The user's module `name`: a file (`x.py`, `dir/x.py`) found from `base`, or a module importable with `base`
    on sys.path (`grpo` run beside my_rewards.py finds it, and so do evaluate and sample later)."""
    if name.endswith(".py") or "/" in name:
        return _import_file(spec, os.path.join(base, os.path.expanduser(name)), key)
    if base not in sys.path:
        sys.path.append(base)
    try:
        return importlib.import_module(name)
    except Exception as e:  # a missing module or one that fails on import: both are the user's to fix
        raise GrpoError(
            f"{key}={spec!r} cannot be imported ({type(e).__name__}: {e}); put its module on PYTHONPATH or in "
            f"{base}{hint}."
        ) from None


def _import_file(spec: str, path: str, key: str = "reward.fn"):
    """The module in the file `path`, imported once under its own name (its directory on sys.path, so it can
    import the files beside it)."""
    import importlib.util

    path = os.path.normpath(path)
    if not os.path.isfile(path):
        raise GrpoError(
            f"{key}={spec!r}: there is no file {path}; give the path to your file "
            "(relative to the directory grpo runs in)."
        )
    name = "grpo_reward_" + re.sub(r"\W", "_", path)
    if name in sys.modules:
        return sys.modules[name]
    if os.path.dirname(path) not in sys.path:
        sys.path.append(os.path.dirname(path))
    module_spec = importlib.util.spec_from_file_location(name, path)
    assert module_spec is not None and module_spec.loader is not None  # a .py file that exists
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        del sys.modules[name]
        raise GrpoError(f"{key}={spec!r}: {path} fails on import ({type(e).__name__}: {e}); fix the file.") from None
    return module
