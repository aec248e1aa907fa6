import pytest
import torch

from tiny_models import tiny


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A freshly built tiny model (a few warm-up steps): tests do not depend on the shipped weights."""
    torch.set_num_threads(1)
    out = tmp_path_factory.mktemp("tiny")
    return tiny.build(out, steps=30, log=lambda *_: None)


@pytest.fixture(scope="session")
def tiny_model(tiny_dir):
    from grpo_cli.models.loading import load_model, load_tokenizer

    return load_model(str(tiny_dir), device="cpu"), load_tokenizer(str(tiny_dir))


# The tiny model's tokenizer knows digits, + and =: a chat template made of them (a system message
# becomes "<content>+", the generation prompt "=").
CHAT_TEMPLATE = (
    "{% for m in messages %}{% if m['role'] == 'system' %}{{ m['content'] }}+{% else %}{{ m['content'] }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}={% endif %}"
)


@pytest.fixture
def chat_dir(tiny_dir, tmp_path):
    """The tiny model with CHAT_TEMPLATE as its chat template."""
    import shutil

    from grpo_cli.models.loading import load_tokenizer

    out = tmp_path / "chat"
    shutil.copytree(tiny_dir, out)
    tok = load_tokenizer(str(out))
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def qwen_dir(tmp_path_factory):
    """The agent tests' model: a random 2-layer Llama with a character tokenizer, Qwen's special and added tokens
    and its template (tests/episodes/episode_kit.py)."""
    from episode_kit import build_qwen_dir

    return build_qwen_dir(tmp_path_factory.mktemp("qwen_tools"))


@pytest.fixture
def scripted():
    """The scripted generator (tests/episodes/episode_kit.py), registered as generator=scripted for one test."""
    from episode_kit import Scripted

    from grpo_cli.generate.base import register_generator
    from helpers import forget_generator

    register_generator("scripted", Scripted)
    Scripted.contexts, Scripted.calls = [], []
    yield Scripted
    forget_generator("scripted")


# `make test-fast` (pytest --fast): the default suite without the tests listed in tests/slow_tests.txt, those
# that took over a second each in a full run (mostly whole training runs). `make slow-list` rewrites the
# list from a run's `--durations=0` report.
SLOW_LIST = __import__("pathlib").Path(__file__).with_name("slow_tests.txt")


def pytest_configure(config):
    """The machine peaks a run probes (floors.py) are cached in a directory of the test session's, not the
    user's home: runs in the suite probe once per process, on whatever load the machine has then."""
    import os
    import tempfile

    if "GRPO_CLI_CACHE" not in os.environ:  # a pytest-xdist worker inherits its controller's
        os.environ["GRPO_CLI_CACHE"] = config._grpo_cache = tempfile.mkdtemp(prefix="grpo-cli-cache-")


def pytest_unconfigure(config):
    """The session's cache goes with it (one was left in /tmp by every run before)."""
    import os
    import shutil

    made = getattr(config, "_grpo_cache", None)
    if made:
        shutil.rmtree(made)
        os.environ.pop("GRPO_CLI_CACHE", None)


def pytest_addoption(parser):
    parser.addoption("--fast", action="store_true", help="leave out the tests listed in tests/slow_tests.txt")


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--fast"):
        return
    slow = {
        line.rsplit("  ", 1)[0].strip()
        for line in SLOW_LIST.read_text().splitlines()  # "<node id>  <seconds>s"
        if line.strip() and not line.startswith("#")
    }
    keep = [item for item in items if item.nodeid not in slow]
    config.hook.pytest_deselected(items=[item for item in items if item.nodeid in slow])
    items[:] = keep
