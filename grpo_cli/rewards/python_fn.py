"""reward=python: any function of yours, named by a dotted path: `reward.fn=mypkg.rewards:score`.

The calling convention, once per batch of completions:

    fn(prompts=[...], completions=[...], answers=[...], completion_tokens=[...], **columns) -> floats

Every argument is a list with one entry per completion (a prompt's G completions repeat its row):
`prompts` is the text the model was prompted with, `completions` what it wrote, `answers` the
dataset's reference answer as text (data.answer_field), `completion_tokens` each completion's length
in tokens (EOS included when one was generated), and `columns` every dataset column by its name, when
the caller has the dataset rows (training steps and `grpo evaluate`). Return one finite float per
completion (a list, tuple, numpy array or tensor). Accept `**kwargs` to ignore what you do not use.

The module is imported from sys.path (PYTHONPATH) or the current directory; `mypkg.rewards.score`
works as well as `mypkg.rewards:score`.
"""

from __future__ import annotations

import importlib
import os
import sys

from grpo_cli.errors import GrpoError


def load_function(spec: str):
    """The callable `spec` names, or a GrpoError saying why it cannot be had."""
    module_name, sep, attr = spec.partition(":")
    if not sep:
        module_name, _, attr = spec.rpartition(".")
    if not module_name or not attr:
        raise GrpoError(f"reward.fn={spec!r} is not a dotted path; write it as mypkg.rewards:score.")
    if os.getcwd() not in sys.path and "" not in sys.path:  # `grpo` run beside my_rewards.py finds it
        sys.path.append(os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as e:  # a missing module or one that fails on import: both are the user's to fix
        raise GrpoError(
            f"reward.fn={spec!r} cannot be imported ({type(e).__name__}: {e}); put its module on PYTHONPATH "
            "or in the current directory."
        ) from None
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise GrpoError(f"reward.fn={spec!r}: module {module_name!r} has no function {attr!r}.")
    return fn


def build(cfg):
    if not cfg.fn:
        raise GrpoError("reward=python needs reward.fn, a dotted path to your function, e.g. reward.fn=mypkg.rewards:score.")
    fn = load_function(cfg.fn)

    def reward(batch):
        kwargs = {
            **batch.columns,
            "prompts": batch.prompts,
            "completions": batch.completions,
            "answers": batch.answers,
            "completion_tokens": batch.completion_tokens,
        }
        return fn(**kwargs)

    return reward
