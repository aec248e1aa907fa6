"""`grpo <command> --help`: the config groups with their options, and every key with the value this command line
gives it and the help its declaration holds (config/), in well under two seconds (no torch, no Hydra run).
Hydra's own help (`--hydra-help`) lists the same groups but not what the keys mean."""

from __future__ import annotations

import re
from importlib import resources

from grpo_cli.commands.compose import compose_config
from grpo_cli.config.declare import declared, walk
from grpo_cli.errors import GrpoError

WHAT = {
    "train": "post-train a model with GRPO",
    "evaluate": "score checkpoints on a data split",
    "sample": "completions from a checkpoint",
}


def _conf():
    return resources.files("grpo_cli") / "conf"


def groups() -> dict[str, list[str]]:
    """Each config group and its options: the files under grpo_cli/conf, and the options registered in code (a
    generator back-end's settings)."""
    from hydra.core.config_store import ConfigStore

    import grpo_cli.generate.base  # noqa: F401 - registers the built-in back-ends' options

    found = {
        d.name: {f.name[:-5] for f in d.iterdir() if f.name.endswith(".yaml")}
        for d in _conf().iterdir()
        if d.is_dir() and not d.name.startswith("_")
    }
    for group, options in ConfigStore.instance().repo.items():
        if isinstance(options, dict) and group != "hydra":  # Hydra stores its own groups there too
            found.setdefault(group, set()).update(name[:-5] for name in options if name.endswith(".yaml"))
    return {group: sorted(options) for group, options in sorted(found.items())}


def in_use(command: str, chosen: dict[str, str]) -> dict[str, str]:
    """{group: the option in use}: the one `chosen` on the command line, else the primary config's default."""
    primary = (_conf() / f"{command}.yaml").read_text()
    defaults = dict(re.findall(r"^\s*-\s*(\w+):\s*(\w+)", primary, re.M))
    return {g: chosen[g] if g in chosen else defaults[g] for g in groups() if g in defaults or g in chosen}


def _flat(config) -> list[tuple[str, object, str]]:
    """(dotted key, value, its declared help) of every setting of a composed config object."""
    return [(key, value, getattr(declared(f), "help", "")) for key, f, value, _ in walk(config)]


def command_help(command: str, args: list[str]) -> str:
    """The help text of `grpo COMMAND ARGS --help`: the values are those ARGS compose."""
    overrides = [a for a in args if a not in ("--help", "-h")]
    plain = compose_config(command, [o for o in overrides if not o.startswith("-")])
    chosen = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in overrides if "=" in o and "." not in o.split("=")[0]}
    using = in_use(command, chosen)
    lines = [
        f"grpo {command}: {WHAT.get(command, '')}.",
        "Pick an option of a group (group=option), set any key (key=value), sweep with -m (key=a,b);",
        "`--cfg job` prints the composed config, `--hydra-help` Hydra's own help.",
        "",
        "== Configuration groups (group=option; in use: the option after 'now') ==",
    ]
    for group, options in groups().items():
        if group in using:
            now = using[group] if using[group] not in (None, "null") else "none"
            lines.append(f"{group}: {', '.join(options)}  (now: {now})")
    lines += ["", "== Settings (key=value): the value this command line gives, and what it means =="]
    flat = _flat(plain)
    width = min(max(len(f"{k} = {show(v)}") for k, v, _ in flat), 44)
    for key, value, note in flat:
        left = f"{key} = {show(value)}"
        lines.append(f"{left:<{width}}  # {note}" if note else left)
    return "\n".join(lines)


def show(value) -> str:
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)


def print_help(command: str, args: list[str]) -> int:
    try:
        print(command_help(command, args))
    except GrpoError as e:
        from grpo_cli.run.console import Console

        Console(progress=False).error(str(e))
        return 2
    return 0
