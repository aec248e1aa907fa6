"""The docs site: the reference lists every config key (read here from the schemas, not from the generator),
the committed reference pages are what scripts/docs_reference.py writes, the links between pages hold, and
`mkdocs build --strict` passes."""

import dataclasses
import importlib.util
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from grpo_cli.config import COMMAND_SCHEMAS
from helpers import REPO

REFERENCE = REPO / "docs" / "reference" / "config.md"


def schema_keys(schema, prefix: str = "") -> list[str]:
    """Every dotted key of a dataclass schema, nested dataclasses walked."""
    keys = []
    for f in dataclasses.fields(schema):
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        if dataclasses.is_dataclass(default):
            keys += schema_keys(type(default), f"{prefix}{f.name}.")
        else:
            keys.append(prefix + f.name)
    return keys


def _generator():
    spec = importlib.util.spec_from_file_location("docs_reference", REPO / "scripts" / "docs_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("command", sorted(COMMAND_SCHEMAS))
def test_the_reference_lists_every_config_key(command):
    text = REFERENCE.read_text()
    keys = schema_keys(COMMAND_SCHEMAS[command])
    assert len(keys) > 20
    missing = [k for k in keys if f"| `{k}` |" not in text]
    assert not missing, f"docs/reference/config.md lacks {missing}; run python scripts/docs_reference.py"


def test_the_committed_reference_pages_are_what_the_generator_writes():
    for path, text in _generator().pages().items():
        assert path.read_text() == text, f"{path.relative_to(REPO)} is stale: run python scripts/docs_reference.py"


def test_the_reference_shows_the_allowed_values_the_checks_enforce():
    """Read from each setting's declaration: a registry's names (algo.kl_estimator, trainer.health) and a range."""
    assert "| `algo.kl_estimator` | `k3` | `k1`, `k2`, `k3` |" in REFERENCE.read_text()
    assert "| `trainer.health` | `warn` | `warn`, `stop`, `off` |" in REFERENCE.read_text()
    assert "| `sampler.top_p` | `1.0` | > 0 and <= 1 |" in REFERENCE.read_text()


def test_every_relative_link_of_the_readme_and_the_docs_points_at_a_file():
    pages = [REPO / "README.md", *(REPO / "docs").rglob("*.md")]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", page.read_text()):
            if not target.startswith(("http://", "https://")) and not (page.parent / target).exists():
                broken.append(f"{page.relative_to(REPO)} -> {target}")
    assert not broken, broken


def test_mkdocs_builds_the_site_strict(tmp_path):
    if shutil.which("mkdocs", path=str(Path(sys.executable).parent)) is None:
        pytest.skip("mkdocs is not installed in this environment (make setup installs the docs extra)")
    out = subprocess.run(
        [str(Path(sys.executable).parent / "mkdocs"), "build", "--strict", "--site-dir", str(tmp_path)],
        cwd=REPO,
        capture_output=True,
        text=True,
        env={"NO_MKDOCS_2_WARNING": "1", "PATH": "/usr/bin:/bin"},
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (tmp_path / "reference" / "config" / "index.html").exists()


def test_a_group_option_sets_only_what_differs_from_the_declared_defaults():
    """A default is declared once, with its setting (grpo_cli/config/): an option's YAML holds only what the option
    changes, so no value is written twice (a preset, experiment/, may restate one to say why)."""
    from omegaconf import OmegaConf

    from grpo_cli.config import TrainConfig

    defaults = TrainConfig()
    restated = []
    for path in sorted((REPO / "grpo_cli" / "conf").glob("*/*.yaml")):
        if path.parent.name == "experiment":
            continue
        tree = OmegaConf.to_container(OmegaConf.load(path))
        tree.pop("defaults", None)
        if "@package _global_" not in path.read_text():
            tree = {path.parent.name: tree}

        def walk(node, holder, key=""):
            for k, v in node.items():
                value = getattr(holder, k)
                if isinstance(v, dict) and v and not isinstance(value, dict):
                    walk(v, value, f"{key}{k}.")
                elif v == value:
                    restated.append(f"{path.relative_to(REPO)}: {key}{k}")

        walk(tree, defaults)
    assert not restated, restated
