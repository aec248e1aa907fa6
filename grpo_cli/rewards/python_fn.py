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
How it works in detail: docs/internals.md, grpo_cli/rewards/python_fn.py.
"""

from __future__ import annotations

from grpo_cli.errors import GrpoError
from grpo_cli.registry import load_function


def parameters(fn) -> tuple[set[str], bool]:
    """The keyword arguments `fn` accepts, and whether it takes **kwargs (then it is passed everything): a
    function that names only what it uses is not handed arguments it has no parameter for."""
    import inspect

    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C function without a signature: pass everything
        return set(), True
    return (
        {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)},
        any(p.kind == p.VAR_KEYWORD for p in params),
    )


PASSED = ("prompts", "completions", "answers", "completion_tokens", "completion_ids", "environments")


def check_signature(fn, spec: str, columns: list[str]) -> None:
    """A GrpoError when `fn` requires an argument no call passes (module docstring): a parameter without a
    default that is neither one of PASSED nor a dataset column, or one taken only by position."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):  # no signature to read: it is called and its error reported then
        return
    name = getattr(fn, "__name__", spec)
    by_position = [p.name for p in params if p.kind == p.POSITIONAL_ONLY and p.default is p.empty]
    missing = [
        p.name
        for p in params
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.default is p.empty
        and p.name not in PASSED
        and p.name not in columns
    ] + by_position
    if missing:
        shown = ", ".join(c for c in columns if not c.startswith("_"))
        raise GrpoError(
            f"reward.fn={spec!r}: {name}() requires {', '.join(missing)}, which no call passes: a reward is called "
            f"with keywords, {', '.join(PASSED[:-1])} and the dataset's columns ({shown}); rename the parameter, give "
            "it a default, or take **kwargs."
        )


def build(cfg):
    """The term of one function: `cfg.fn` a single spec (rewards.term_specs gives each of a list its own cfg)."""
    if not cfg.fn or not isinstance(cfg.fn, str):  # checks.check_reward refuses it
        raise ValueError(f"reward=python with reward.fn={cfg.fn!r}: run the checks.")
    fn = load_function(cfg.fn, getattr(cfg, "fn_dir", None))
    accepted, takes_all = parameters(fn)

    def reward(batch):
        conversational = batch.prompt_messages is not None
        if batch.episodes is not None:  # multi-turn: the whole episode's messages, and its environment (TRL's)
            completions = [ep.messages for ep in batch.episodes]
        elif conversational:
            completions = [[{"role": "assistant", "content": c}] for c in batch.completions]
        else:
            completions = batch.completions
        kwargs = {
            **batch.columns,
            "prompts": batch.prompt_messages if conversational else batch.prompts,
            "completions": completions,
            "answers": batch.answers,
            "completion_tokens": batch.completion_tokens,
            "completion_ids": batch.completion_ids,
            **({"environments": [ep.environment for ep in batch.episodes]} if batch.episodes is not None else {}),
        }
        return fn(**(kwargs if takes_all else {k: v for k, v in kwargs.items() if k in accepted}))

    reward.max_value = float(getattr(fn, "max_reward", 1.0))  # what counts as "correct" (rewards.Judge)
    reward.user_code = True  # what it raises is the user's to fix: one sentence naming the completion
    return reward
