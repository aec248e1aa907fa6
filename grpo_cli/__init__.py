"""grpo-cli: GRPO post-training from the command line (`grpo train|evaluate|sample`) or from Python
(`from grpo_cli import train, evaluate, sample`; see grpo_cli/api.py)."""

__all__ = ["train", "evaluate", "sample", "GrpoError"]


def __getattr__(name: str):
    # Imported when first asked for: `import grpo_cli` stays free of Hydra, torch and transformers.
    if name in ("train", "evaluate", "sample"):
        from grpo_cli import api

        return getattr(api, name)
    if name == "GrpoError":
        from grpo_cli.errors import GrpoError

        return GrpoError
    raise AttributeError(f"module 'grpo_cli' has no attribute {name!r}")
