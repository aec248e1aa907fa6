"""`env.verifiers=...`: an environment of the verifiers library (docs/how-to/ecosystem.md) as the run's agent: its
own rollout (single- or multi-turn, its tools, its parser) through the run's endpoint, scored by its own rubric.
The rows come from the data group; each row's prompt messages and answer are the rollout's input."""

from __future__ import annotations

import json

from grpo_cli.errors import GrpoError


def load(spec: str, args: dict, base: str | None):
    """The environment `spec` names: FILE.py:FUNC or mod:FUNC called with `args`, or an installed environment's
    id (verifiers.load_environment)."""
    try:
        import verifiers as vf
    except ImportError:
        raise GrpoError("env.verifiers needs the verifiers package: pip install 'grpo-cli[verifiers]'.") from None
    if ":" in spec:
        from grpo_cli.registry import load_function

        made = load_function(spec, base, key="env.verifiers")(**args)
    else:
        try:
            made = vf.load_environment(spec, **args)
        except Exception as e:  # the library's own failure to find or build it
            raise GrpoError(
                f"env.verifiers={spec} could not be loaded ({type(e).__name__}: {e}); install the environment's "
                "package, or name its loader as FILE.py:load_environment."
            ) from None
    if not isinstance(made, vf.Environment):
        raise GrpoError(f"env.verifiers={spec} gave a {type(made).__name__}, not a verifiers Environment.")
    return made


def verifiers_agent(cfg):
    """The agent that runs the environment's rollout for a row and returns its rubric's reward and metrics."""
    import verifiers as vf

    environment = load(str(cfg.verifiers), dict(cfg.verifiers_args or {}), cfg.fn_dir)

    async def agent(client, model, row):
        answer = row.get("answer", "")
        given = vf.RolloutInput(prompt=row["prompt"], answer=str(answer), example_id=0, task="default", info={})
        out = await environment.run_rollout(given, client, model, sampling_args={})
        if out.get("error"):
            raise RuntimeError(f"the verifiers rollout failed: {json.dumps(out['error'], default=str)[:300]}")
        return {"reward": float(out["reward"]), **{k: float(v) for k, v in (out.get("metrics") or {}).items()}}

    return agent
