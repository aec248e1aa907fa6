import pytest
import torch

from grpo_cli import tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A freshly built tiny model (a few warm-up steps): tests do not depend on the shipped weights."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tiny")
    return tiny.build(out, steps=30, log=lambda *_: None)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from grpo_cli.models import load_model, load_tokenizer

    return load_model(str(tiny_dir), device="cpu"), load_tokenizer(str(tiny_dir))
