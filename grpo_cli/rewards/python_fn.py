"""reward=python: any function of yours, named by a dotted path: `reward.fn=mypkg.rewards:score`.

The calling convention, once per batch of completions:

    fn(prompts=[...], completions=[...], answers=[...], completion_tokens=[...], **columns) -> floats

Every argument is a list with one entry per completion (a prompt's G completions repeat its row):
`prompts` is the text the model was prompted with, `completions` what it wrote, `answers` the
dataset's reference answer as text (data.answer_field), `completion_tokens` each completion's length
in tokens (EOS included when one was generated), `completion_ids` its token ids, and `columns` every
dataset column by its name, when the caller has the dataset rows (training steps and `grpo evaluate`).
Return one finite float per completion (a list, tuple, numpy array or tensor). Accept `**kwargs` to
ignore what you do not use.

A reward function written for TRL's GRPOTrainer, `fn(prompts, completions, completion_ids, **kwargs)`
reading dataset columns from kwargs, runs unchanged. As in TRL, `None` for a completion means "no
score from this function": it adds 0 to the weighted sum (TRL sums with nansum).

A completion counts as correct (accuracy, pass@k, maj@k) when its reward reaches the function's
`max_reward` attribute (set `score.max_reward = 5.0` beside it), 1.0 when it has none, or
`reward.correct_threshold` when given.

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


def parameters(fn) -> tuple[set[str], bool]:
    """The keyword arguments `fn` accepts, and whether it takes **kwargs (then it is passed everything): a
    function that names only what it uses is not handed arguments it has no parameter for."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function without a signature: pass everything
        return set(), True
    return ({p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)},
            any(p.kind == p.VAR_KEYWORD for p in params))


def build(cfg):
    if not cfg.fn:  # checks.check_reward refuses it
        raise ValueError("reward=python without reward.fn: run the checks.")
    fn = load_function(cfg.fn)
    accepted, takes_all = parameters(fn)

    def reward(batch):
        kwargs = {
            **batch.columns,
            "prompts": batch.prompts,
            "completions": batch.completions,
            "answers": batch.answers,
            "completion_tokens": batch.completion_tokens,
            "completion_ids": batch.completion_ids,
        }
        return fn(**(kwargs if takes_all else {k: v for k, v in kwargs.items() if k in accepted}))

    reward.max_value = float(getattr(fn, "max_reward", 1.0))  # what counts as "correct" (rewards.Judge)
    return reward
