"""Writes the docs' reference pages from the code, so they cannot drift from it:

- docs/reference/config.md: every key of `grpo train`, `grpo evaluate` and `grpo sample` with its default
  (the config the command composes with no overrides), the values the checks allow (read from the
  `Problems.choice` calls of grpo_cli/run/checks.py) and what it means (its comment in grpo_cli/conf/);
  every config group with its options; the registries a plug-in adds to.
- docs/reference/cli.md: `grpo --help` and each command's header.

`make docs` runs it before `mkdocs build --strict`; tests/test_docs.py fails when the committed pages
differ from what it writes (`python scripts/docs_reference.py` rewrites them), and checks, from the schemas
alone, that every key is listed.

    python scripts/docs_reference.py [--check]
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import sys
from dataclasses import asdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUT = ROOT / "docs" / "reference"
COMMANDS = ("train", "evaluate", "sample")
SHARED = ("model", "reward", "sampler", "generator", "env", "data", "optimizer", "algo", "trainer", "hub")


def allowed_values() -> dict[str, tuple]:
    """{key: the values `check_*` accepts}: each `p.choice("key", value, ALLOWED)` call of checks.py, and the
    (key, value, ALLOWED) tuples a loop hands to one, with ALLOWED evaluated in that module."""
    from grpo_cli.run import checks

    tree = ast.parse(Path(checks.__file__).read_text())
    names = vars(checks)
    out: dict[str, tuple] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "choice" and len(node.args) == 3:
            key = node.args[0]
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                out[key.value] = tuple(eval(compile(ast.Expression(node.args[2]), "checks", "eval"), names))
        if isinstance(node, ast.For) and isinstance(node.iter, ast.Tuple):
            for item in node.iter.elts:
                if isinstance(item, ast.Tuple) and len(item.elts) == 3 and isinstance(item.elts[0], ast.Constant):
                    out[item.elts[0].value] = tuple(eval(compile(ast.Expression(item.elts[2]), "checks", "eval"), names))
    return out


def _cell(text) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _rows(command: str, allowed: dict[str, tuple], keep) -> list[str]:
    from grpo_cli.commands.compose import compose_config
    from grpo_cli.commands.help import _flat, _show, key_comments

    _, comments = key_comments(command)
    rows = []
    for key, value in _flat(asdict(compose_config(command, []))):
        if keep(key):
            choices = ", ".join(f"`{v}`" for v in allowed.get(key, ()))
            rows.append(f"| `{key}` | `{_cell(_show(value))}` | {choices} | {_cell(comments.get(key, ''))} |")
    return rows


def _group_table() -> list[str]:
    from grpo_cli.commands.help import _conf, groups

    lines = ["| group | option | what it is |", "| --- | --- | --- |"]
    for group, options in groups().items():
        for option in options:
            block = []  # the file's opening comment
            for ln in (_conf() / group / f"{option}.yaml").read_text().splitlines():
                if not ln.startswith("#"):
                    break
                if "@package" not in ln:
                    block.append(ln.lstrip("# ").strip())
            first = " ".join(block)
            lines.append(f"| `{group}` | `{option}` | {_cell(first)} |")
    return lines


def _registries() -> list[str]:
    from grpo_cli.algo.advantages import ADVANTAGES
    from grpo_cli.algo.losses import AGGREGATIONS, POLICY_LOSSES
    from grpo_cli.rewards import REWARDS
    from grpo_cli.generate.base import GENERATORS
    from grpo_cli.episodes.tool_formats import TOOL_FORMATS
    from grpo_cli.run.trackers import TRACKERS

    table = [("rewards (`reward.name`, `reward.terms`)", REWARDS, "grpo_cli/rewards/__init__.py"),
             ("policy losses (`algo.loss`)", POLICY_LOSSES, "`@register_loss` in grpo_cli/algo/losses.py"),
             ("aggregations (`algo.aggregation`)", AGGREGATIONS, "grpo_cli/algo/losses.py"),
             ("advantage estimators (`algo.advantage`)", ADVANTAGES, "`@register_advantage` in grpo_cli/algo/advantages.py"),
             ("generators (`generator.name`)", GENERATORS, "`register_generator` in grpo_cli/generate/base.py"),
             ("tool-call formats (`env.tool_format`)", TOOL_FORMATS, "grpo_cli/episodes/tool_formats.py"),
             ("trackers (`trainer.trackers`)", TRACKERS, "grpo_cli/run/trackers.py")]
    lines = ["| registry | names | where one is added |", "| --- | --- | --- |"]
    for what, names, where in table:
        where = where if where.startswith("`") else f"`{where}`"
        lines.append(f"| {what} | {', '.join(f'`{n}`' for n in names)} | {where} |")
    return lines


HEADER = "| key | default | allowed | what it means |\n| --- | --- | --- | --- |"


def config_page() -> str:
    allowed = allowed_values()
    parts = ["# Configuration reference", "",
             "Generated by `scripts/docs_reference.py` from the schemas (`grpo_cli/config.py`), the comments of the",
             "YAML files under `grpo_cli/conf/` and the values the checks allow (`grpo_cli/run/checks.py`). The",
             "defaults are those of the command with no overrides; a group option or a preset changes some of them",
             "(`grpo train experiment=tool_use --help` prints the values a command line composes). Set a key with",
             "`key=value`, pick an option with `group=option`.", "", "## Config groups", "", *_group_table(), ""]
    for group in SHARED:
        parts += [f"## `{group}`", "", HEADER, *_rows("train", allowed, lambda k, g=group: k.startswith(g + ".")), ""]
    parts += ["## `grpo train`: top-level keys", "", HEADER,
              *_rows("train", allowed, lambda k: "." not in k), ""]
    for command in COMMANDS[1:]:
        parts += [f"## `grpo {command}`", "",
                  f"`grpo {command}` shares the groups `model`, `reward`, `sampler`, `generator`, `env` and `data` "
                  f"with `grpo train` (above); its own keys:", "", HEADER,
                  *_rows(command, allowed, lambda k: "." not in k), ""]
    parts += ["## Registries", "",
              "What a name in the config can point at, and where a new one is registered:", "", *_registries(), ""]
    return "\n".join(parts)


def _run_cli(args: list[str]) -> str:
    from grpo_cli.cli import main

    buffer = io.StringIO()
    with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
        try:
            main(args)
        except SystemExit:
            pass
    return buffer.getvalue().rstrip()


def cli_page() -> str:
    parts = ["# Command-line reference", "",
             "Generated by `scripts/docs_reference.py` from the commands' own help.", "", "## `grpo --help`", "",
             "```text", _run_cli(["--help"]), "```", ""]
    for command in COMMANDS:
        head = _run_cli([command, "--help"]).split("\n== Settings")[0]
        parts += [f"## `grpo {command} --help`", "",
                  "The groups and the first lines; every key follows, as in the [configuration reference](config.md).",
                  "", "```text", head, "```", ""]
    parts += ["## Flags", "",
              "| flag | what it does |", "| --- | --- |",
              "| `--config FILE` | a YAML file of settings (`key: value`, nested or dotted), applied before the command line's, which win |",
              "| `--config-dir DIR` | Hydra's: a directory searched for config files first, e.g. your own `experiment/*.yaml` presets |",
              "| `--config-name NAME` | Hydra's: the primary config to compose, a file of `--config-dir` in place of the built-in one |",
              "| `-m`, `--multirun` | a sweep: one job per combination of the comma-separated values |",
              "| `--cfg job` | print the composed config and exit |",
              "| `--help`, `-h` | the groups and every key with its value and meaning |",
              "| `--hydra-help` | Hydra's own help |",
              "| `--version` | the installed version |",
              "| `--completion bash` / `zsh` | a tab-completion script: `eval \"$(grpo --completion bash)\"` |", ""]
    return "\n".join(parts)


def pages() -> dict[Path, str]:
    return {OUT / "config.md": config_page(), OUT / "cli.md": cli_page()}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when a committed page differs, write nothing")
    args = ap.parse_args()
    stale = []
    for path, text in pages().items():
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(path.relative_to(ROOT))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            print(f"wrote {path.relative_to(ROOT)} ({text.count(chr(10))} lines)")
    if stale:
        print(f"stale: {', '.join(map(str, stale))}; run python scripts/docs_reference.py", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
