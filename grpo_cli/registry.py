"""Registries name what they hold by import path ("module:attribute") until it is used, so the names can
be read (checks.py, before torch loads) without importing what they name."""

from __future__ import annotations

import importlib
from typing import Any, Callable


def load(entry: Callable | str) -> Any:
    """A registry entry: a "module:attribute" string imported now, or the object itself."""
    if isinstance(entry, str):
        module, attribute = entry.split(":")
        return getattr(importlib.import_module(module), attribute)
    return entry
