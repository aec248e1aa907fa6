"""`grpo <command> --help`: the config groups with their options, and every key with the value this command
line gives it and the comment its YAML file holds, in well under two seconds (no torch, no Hydra run).
Hydra's own help (`--hydra-help`) lists the same groups but not what the keys mean."""

from __future__ import annotations

import re
from importlib import resources

from grpo_cli.commands.compose import compose_config
from grpo_cli.errors import GrpoError

KEY_LINE = re.compile(r"^(\s*)([A-Za-z_]\w*):(.*)$")
WHAT = {"train": "post-train a model with GRPO", "evaluate": "score checkpoints on a data split",
        "sample": "completions from a checkpoint"}


def yaml_comments(text: str, prefix: str = "") -> dict[str, str]:
    """{dotted key: its end-of-line comment} of a config file, the `defaults` list and `hydra` section aside."""
    out, stack = {}, []
    for line in text.splitlines():
        m = KEY_LINE.match(line)
        if not m:
            continue
        indent, key, rest = len(m[1]), m[2], m[3]
        while stack and stack[-1][0] >= indent:
            stack.pop()
        stack.append((indent, key))
        path = [k for _, k in stack]
        if path[0] in ("defaults", "hydra"):
            continue
        comment = re.split(r"\s#\s?", rest, maxsplit=1)
        if len(comment) == 2 and comment[1].strip():
            out[prefix + ".".join(path)] = comment[1].strip()
    return out


def _conf():
    return resources.files("grpo_cli") / "conf"


def groups() -> dict[str, list[str]]:
    """Each config group and its options, from the files under grpo_cli/conf."""
    return {d.name: sorted(f.name[:-5] for f in d.iterdir() if f.name.endswith(".yaml"))
            for d in sorted(_conf().iterdir(), key=lambda d: d.name) if d.is_dir() and not d.name.startswith("_")}


def _flat(node, prefix: str = "") -> list[tuple[str, object]]:
    if isinstance(node, dict):
        return [kv for k, v in node.items() for kv in (_flat(v, f"{prefix}{k}.") if isinstance(v, dict) and v else
                                                        [(f"{prefix}{k}", v)])]
    return [(prefix.rstrip("."), node)]


def key_comments(command: str, chosen: dict[str, str] | None = None) -> tuple[dict, dict[str, str]]:
    """({group: the option in use}, {dotted key: its comment}) of `command` with the group options `chosen`
    (the defaults where not chosen): `--help` and the docs' reference (scripts/docs_reference.py) read this."""
    chosen = chosen or {}
    primary = (_conf() / f"{command}.yaml").read_text()
    defaults = dict(re.findall(r"^\s*-\s*(\w+):\s*(\w+)", primary, re.M))
    comments = yaml_comments(primary)
    in_use = {}
    for group, options in groups().items():
        option = chosen.get(group, defaults.get(group))
        if group not in defaults and group not in chosen:
            continue
        in_use[group] = option
        # the option in use first; a key it leaves uncommented (one flat schema serves every reward and data
        # source) takes the comment of another option of the same group, never of another preset
        for name in [option] + [o for o in options if o != option]:
            file = _conf() / group / f"{name}.yaml"
            text = file.read_text() if name and file.is_file() else ""
            if "@package _global_" in text and name != option:
                continue
            for k, v in yaml_comments(text, "" if "@package _global_" in text else f"{group}.").items():
                comments.setdefault(k, v)
    return in_use, comments


def command_help(command: str, args: list[str]) -> str:
    """The help text of `grpo COMMAND ARGS --help`: the values are those ARGS compose."""
    from dataclasses import asdict

    overrides = [a for a in args if a not in ("--help", "-h")]
    plain = compose_config(command, [o for o in overrides if not o.startswith("-")])
    chosen = {o.split("=", 1)[0]: o.split("=", 1)[1] for o in overrides if "=" in o and "." not in o.split("=")[0]}
    in_use, comments = key_comments(command, chosen)
    lines = [f"grpo {command}: {WHAT.get(command, '')}.",
             "Pick an option of a group (group=option), set any key (key=value), sweep with -m (key=a,b);",
             "`--cfg job` prints the composed config, `--hydra-help` Hydra's own help.", "",
             "== Configuration groups (group=option; in use: the option after 'now') =="]
    for group, options in groups().items():
        if group in in_use:
            lines.append(f"{group}: {', '.join(options)}  (now: {in_use.get(group) if in_use.get(group) not in (None, 'null') else 'none'})")
    lines += ["", "== Settings (key=value): the value this command line gives, and what it means =="]
    flat = _flat(asdict(plain))
    width = min(max(len(f"{k} = {_show(v)}") for k, v in flat), 44)
    for key, value in flat:
        left = f"{key} = {_show(value)}"
        note = comments.get(key, "")
        lines.append(f"{left:<{width}}  # {note}" if note else left)
    return "\n".join(lines)


def _show(value) -> str:
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
