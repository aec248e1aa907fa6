"""The shape of the package: a sub-package per stage with imports flowing one way between them, no import
cycle (lazy imports inside functions included), no module over 450 lines, no function over 60 lines or
with more than 12 parameters, so every file reads in a sitting and `train` and the step stay readable; no line
over 120 characters, module docstrings of 15 lines or fewer, the loop at 30 lines without a `try`, and two
ratchets on size: the package's lines and what a default one-step `grpo train` imports of it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "grpo_cli"
MAX_FUNCTION_LINES = 60
MAX_PARAMETERS = 12
MAX_MODULE_LINES = 450
MAX_LINE = 120  # characters, as ruff's line-length
MAX_DOCSTRING_LINES = 15  # a module's docstring: what it is for (figures live in docs/benchmarks.md)
MAX_LOOP_LINES = 30
# Ratchets: the figures measured when they were set (lines as `wc -l` counts them). 2026-12-07: 17,747 lines;
# then env.agent (episodes/agent.py, chains.py, endpoint.py: agents as code behind an OpenAI-compatible endpoint)
# added its 1,040 in rooms of their own, loaded only with env.agent set: 18,791; reasoning-gym, OpenEnv and
# verifiers 290 more, each loaded only when named: 19,081 (their settings, in config/, are on every run's path). A
# default one-step run imports 11,349 lines in 73 modules once the machine's peaks are cached (the probe, 75 more,
# runs on a machine's first run). Then agents in helper processes and confined (episodes/agent_host.py,
# agent_workers.py, moved out of agent.py and grown by 340) and the endpoint's forced tool_choice, top_logprobs,
# streaming, env.agent_sampling and their failures (+176), loaded only with env.agent: 19,607; the setting
# env.agent_sampling is on every run's path: 11,351. Then settings frozen at the edge (config/declare.py's
# Settings, freeze, amended): 19,639; a default list setting no longer imports its registry (run/trackers.py):
# 11,234 in 72 modules. generator.decode=compiled (generate/steps.py, and the sampler out of hf.py into
# generate/sampling.py, both on every run's path, one compile cache and warning for both): 19,741 and 11,336 in
# 73 modules.
# Lower them when the code shrinks; a change that grows past them
# needs a room of its own, or a lazy import.
MAX_PACKAGE_LINES = 19_741
MAX_DEFAULT_RUN_IMPORT_LINES = 11_336
# The stages, bottom up: a package imports only from those before it and from the shared root modules.
STAGES = (
    "procs",
    "sandbox",
    "samples",
    "models",
    "algo",
    "rewards",
    "data",
    "generate",
    "episodes",
    "rollout",
    "update",
    "demo",
    "run",
    "commands",
)
SHARED = ("errors", "registry", "config", "conf")  # the shared vocabulary: root modules and the config package


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """The package modules `path` imports anywhere in it (top level or inside a function)."""
    name, found = _module_name(path), set()
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            # `from pkg import mod` depends on pkg.mod, not on what pkg/__init__ imports (it has run already)
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        found |= {t for t in targets if t in modules and t != name}
    return found


def import_graph() -> dict[str, set[str]]:
    files = sorted(PACKAGE.rglob("*.py"))
    modules = {_module_name(f) for f in files}
    return {_module_name(f): _imports(f, modules) for f in files}


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}  # 1 = on the current path, 2 = done

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = 1
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return path[path.index(nxt) :] + [nxt] if nxt in path else [node, nxt]
            if nxt not in state:
                cycle = visit(nxt, path + [nxt])
                if cycle:
                    return cycle
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state:
            cycle = visit(start, [start])
            if cycle:
                return cycle
    return None


def test_the_cycle_finder_finds_a_cycle_through_a_lazy_import(tmp_path):
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b"}, "b": set(), "c": {"a", "b"}}) is None
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "x.py").write_text("def f():\n    from pkg import y\n")
    (pkg / "y.py").write_text("from pkg.x import f\n")
    modules = {"pkg.x", "pkg.y"}
    global PACKAGE
    saved, PACKAGE = PACKAGE, pkg
    try:
        assert _imports(pkg / "x.py", modules) == {"pkg.y"} and _imports(pkg / "y.py", modules) == {"pkg.x"}
    finally:
        PACKAGE = saved


def test_the_package_has_no_import_cycle():
    graph = import_graph()
    assert len(graph) > 30 and graph["grpo_cli.run.trainer"]  # the walk saw the package
    assert find_cycle(graph) is None, f"import cycle: {' -> '.join(find_cycle(graph))}"


def _body_lines(fn: ast.FunctionDef) -> int:
    """Lines of a function, its docstring left out."""
    lines = fn.end_lineno - fn.lineno + 1
    first = fn.body[0]
    if (
        isinstance(first, ast.Expr)
        and isinstance(getattr(first, "value", None), ast.Constant)
        and isinstance(first.value.value, str)
    ):
        lines -= first.end_lineno - first.lineno + 1
    return lines


def _parameters(fn: ast.FunctionDef) -> int:
    """Parameters a caller passes: self and cls left out, *args and **kwargs counted once each."""
    a = fn.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)] + [x.arg for x in (a.vararg, a.kwarg) if x]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def functions():
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                yield f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name}", node


def test_no_function_is_longer_than_a_screen_or_takes_more_than_twelve_parameters():
    long = [f"{where} ({_body_lines(fn)} lines)" for where, fn in functions() if _body_lines(fn) > MAX_FUNCTION_LINES]
    assert not long, f"functions over {MAX_FUNCTION_LINES} lines: " + "; ".join(long)
    wide = [f"{where} ({_parameters(fn)})" for where, fn in functions() if _parameters(fn) > MAX_PARAMETERS]
    assert not wide, f"functions with more than {MAX_PARAMETERS} parameters: " + "; ".join(wide)


def test_the_limits_are_measured_as_said():
    source = "def f(self, a, b=1, *args, c, **kw):\n    '''doc\n    more'''\n    x = 1\n    return x\n"
    fn = ast.parse(source).body[0]
    assert _parameters(fn) == 5 and _body_lines(fn) == 3  # the def line and two statements; not the docstring


def test_no_module_is_longer_than_a_sitting():
    big = [
        f"{p.relative_to(PACKAGE.parent)} ({n})"
        for p in sorted(PACKAGE.rglob("*.py"))
        if (n := p.read_text().count("\n")) > MAX_MODULE_LINES
    ]
    assert not big, f"modules over {MAX_MODULE_LINES} lines: " + "; ".join(big)


def _stage(module: str) -> str | None:
    """A module's stage package; None for a root module."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in STAGES else None


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports against the stages' order (a root module other than the shared ones is an entry point)."""
    upward = []
    for module, targets in graph.items():
        here = _stage(module)
        for target in targets:
            there, root = _stage(target), target.split(".")[1]
            if there is None and root in SHARED:
                continue  # the shared vocabulary
            if here is None and (module.split(".") + [""])[1] not in SHARED:
                continue  # an entry point (cli, api) may import any stage
            if there is None or here is None or STAGES.index(there) > STAGES.index(here):
                upward.append(f"{module} -> {target}")
    return sorted(upward)


def test_imports_flow_one_way_between_the_stages():
    assert upward_imports(
        {
            "grpo_cli.models.x": {"grpo_cli.update.y", "grpo_cli.errors"},
            "grpo_cli.update.y": {"grpo_cli.models.x"},
            "grpo_cli.cli": {"grpo_cli.run.z"},
            "grpo_cli.config": {"grpo_cli.cli"},
        }
    ) == ["grpo_cli.config -> grpo_cli.cli", "grpo_cli.models.x -> grpo_cli.update.y"]
    graph = import_graph()
    assert {_stage(m) for m in graph} - {None} == set(STAGES)  # every package is a stage, in the order
    upward = upward_imports(graph)
    assert not upward, "imports against the stages' order: " + "; ".join(upward)


def test_the_docs_layout_names_every_package_and_module():
    readme = (PACKAGE.parent / "docs" / "development.md").read_text()
    layout = readme[readme.index("Layout, by stage") :]
    layout = layout[: layout.index("`tests/test_house.py` keeps the house so")]
    named = set(re.findall(r"`([\w/]+\.py|\w+/)`", layout))
    modules = {p.name for p in PACKAGE.glob("*.py")} | {
        f"{p.name}/" for p in PACKAGE.iterdir() if (p / "__init__.py").exists()
    }
    modules |= {p.name for stage in STAGES for p in (PACKAGE / stage).glob("*.py")}
    rewards = {p.name for p in (PACKAGE / "rewards").glob("*.py")} - {"reward_pool.py", "reward_worker.py"}
    missing = sorted(modules - named - rewards - {"__init__.py"})  # the rewards: "one module per reward"
    assert not missing, f"docs/development.md's layout does not name: {', '.join(missing)}"
    for stage in STAGES:  # and each package says what lives there, in its docstring's first line
        doc = ast.get_docstring(ast.parse((PACKAGE / stage / "__init__.py").read_text()))
        assert doc and doc.splitlines()[0].endswith("."), stage


def test_no_line_is_wider_than_the_formatter_s():
    roots = [PACKAGE, PACKAGE.parent / "tests", PACKAGE.parent / "scripts"]
    wide = [
        f"{p.relative_to(PACKAGE.parent)}:{i}"
        for root in roots
        for p in sorted(root.rglob("*.py"))
        for i, line in enumerate(p.read_text(encoding="utf-8").splitlines(), 1)
        if len(line) > MAX_LINE
    ]
    assert not wide, f"lines over {MAX_LINE} characters: " + ", ".join(wide)


def test_module_docstrings_say_what_the_module_is_for_in_fifteen_lines():
    long = []
    for p in sorted(PACKAGE.rglob("*.py")):
        doc = ast.get_docstring(ast.parse(p.read_text()), clean=False)
        lines = doc.count("\n") + 1 if doc else 0  # the closing quotes' own line counts
        if lines > MAX_DOCSTRING_LINES:
            long.append(f"{p.relative_to(PACKAGE.parent)} ({lines})")
    assert not long, f"module docstrings over {MAX_DOCSTRING_LINES} lines: " + "; ".join(long)


def test_the_loop_reads_like_the_algorithm():
    tree = ast.parse((PACKAGE / "run" / "trainer.py").read_text())
    (train,) = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "train"]
    assert _body_lines(train) <= MAX_LOOP_LINES, f"run/trainer.py's train is {_body_lines(train)} lines"
    assert not any(isinstance(n, ast.Try) for n in ast.walk(train)), "the loop holds a try"


def test_the_package_stays_within_its_lines():
    lines = sum(p.read_text().count("\n") for p in PACKAGE.rglob("*.py"))
    assert lines <= MAX_PACKAGE_LINES, f"the package is {lines} lines (the ratchet: {MAX_PACKAGE_LINES})"


DEFAULT_RUN = """
import os, sys, tempfile
from pathlib import Path
import grpo_cli
from grpo_cli.cli import main
try:
    main(["train", f"output_dir={tempfile.mkdtemp()}/run", "trainer.steps=1"])
except SystemExit as e:
    assert not e.code, e.code
root = Path(grpo_cli.__file__).parent
files = {m.__file__ for m in list(sys.modules.values()) if str(getattr(m, "__file__", "")).startswith(str(root))}
print(len(files), sum(Path(f).read_text().count("\\n") for f in files))
"""


def test_a_default_one_step_run_imports_only_what_it_uses():
    """Optional engines (vLLM, episodes, the sandbox, LoRA, torchrun, the hub, reward models) load when asked:
    a default run imports no more of the package than the ratchet allows."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
    for _ in range(2):  # the second run: the machine's peaks cached by the first (a probe runs once per machine)
        out = subprocess.run([sys.executable, "-c", DEFAULT_RUN], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    modules, lines = map(int, out.stdout.split()[-2:])
    assert lines <= MAX_DEFAULT_RUN_IMPORT_LINES, (
        f"{modules} modules, {lines} lines (the ratchet: {MAX_DEFAULT_RUN_IMPORT_LINES})"
    )
