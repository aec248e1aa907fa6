"""The agent tests' fixtures: the Qwen-shaped model directory (once per module) and the scripted generator."""

import pytest
from agents import Scripted, build_qwen_dir

from grpo_cli.generate.base import register_generator
from helpers import forget_generator


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """A random 2-layer Llama with a character tokenizer, Qwen's special and added tokens and its template."""
    return build_qwen_dir(tmp_path_factory.mktemp("qwen_tools"))


@pytest.fixture
def scripted():
    register_generator("scripted", Scripted)
    Scripted.contexts, Scripted.calls = [], []
    yield Scripted
    forget_generator("scripted")
