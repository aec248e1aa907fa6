"""What leaves the run: a model card in final/README.md (huggingface_hub's ModelCard), and with
`hub.push=true` an upload of final/ to a hub repository at the end of the run."""

from __future__ import annotations

import os
from pathlib import Path

from grpo_cli.errors import GrpoError, first_line

HEADLINES = {  # summary key -> how the card names it
    "reward_first": "mean reward, first step",
    "reward_last20": "mean reward, last 20 steps",
    "greedy_accuracy_before": "held-out greedy accuracy before",
    "greedy_accuracy_after": "held-out greedy accuracy after",
    "sampled_accuracy_before": "held-out sampled accuracy before",
    "sampled_accuracy_after": "held-out sampled accuracy after",
}


def recipe(cfg) -> tuple[str, str, str]:
    """The card's algorithm, sampling and optimisation lines."""
    a, s, o, t, lora = cfg.algo, cfg.sampler, cfg.optimizer, cfg.trainer, cfg.model.lora
    high = f"/{a.clip_eps_high}" if a.clip_eps_high is not None else ""
    algorithm = (
        f"`algo={a.name}`: clip {a.clip_eps}{high}, beta {a.beta} ({a.kl_estimator}), {a.aggregation}, "
        f"ratio per {a.ratio_level}, advantages scaled by {a.scale}"
    )
    sampling = (
        f"G = {s.group_size} completions per prompt, temperature {s.temperature}, up to {s.max_new_tokens} new tokens"
    )
    tuned = "full fine-tuning"
    if lora.r:
        tuned = f"LoRA r={lora.r}, alpha={lora.alpha} (merged into these weights; the adapter alone is in `adapter/`)"
    optimisation = f"AdamW lr {o.lr:g} ({o.scheduler}), {t.steps} steps of {t.prompts_per_step} prompts, {t.precision}"
    return algorithm, sampling, f"{optimisation}, {tuned}"


def card_text(cfg, summary: dict, command: str) -> str:
    """The card: YAML metadata the hub reads (base model, library, tags), then what made the model."""
    from huggingface_hub import ModelCardData

    base = cfg.model.path
    data = ModelCardData(
        library_name="transformers",
        tags=["grpo", "grpo-cli", "reinforcement-learning"],
        base_model=None if base.startswith(("builtin:", "/", ".", "~")) else base,
    )
    t = cfg.trainer
    algorithm, sampling, optimisation = recipe(cfg)
    data_name = cfg.data.hub_name or cfg.data.train_file or cfg.data.name
    rows = "\n".join(
        f"| {name} | {summary[key]:.3f} |" for key, name in HEADLINES.items() if isinstance(summary.get(key), float)
    )
    correct = (
        f"\n\nAccuracy counts a completion as correct when {summary['correct']}." if summary.get("correct") else ""
    )
    return f"""---
{data.to_yaml()}
---

# {Path(summary.get("run_dir", "run")).name}: {cfg.model.name} post-trained with GRPO

Trained by grpo-cli {_version()} with Group Relative Policy Optimization from `{base}`.

| | |
| --- | --- |
| data | `{data_name}` (`data={cfg.data.name}`{", chat template" if cfg.data.chat_template else ""}) |
| reward | `{cfg.reward.name}`{f" ({', '.join(cfg.reward.terms)})" if cfg.reward.terms else ""} |
| algorithm | {algorithm} |
| sampling | {sampling} |
| optimisation | {optimisation} |
| seed | {t.seed} |

## Results

| metric | value |
| --- | --- |
{rows}{correct}

## How it was made

```
{command}
```

The full resolved configuration is `config.yaml` beside the weights.
"""


def write_model_card(final: Path, cfg, summary: dict, command: str) -> Path:
    """final/README.md, written whole (temporary file, then rename)."""
    from huggingface_hub import ModelCard

    path, tmp = Path(final) / "README.md", Path(final) / ".README.md.tmp"
    try:
        ModelCard(card_text(cfg, summary, command)).save(tmp)
        os.replace(tmp, path)
    except OSError as e:
        from grpo_cli.errors import write_failure

        tmp.unlink(missing_ok=True)
        raise write_failure(path, e) from None
    return path


def check_push(cfg) -> None:
    """hub.push=true, refused before any work when it cannot succeed: no repo id, or no hub."""
    if not cfg.hub.push:
        return
    if not cfg.hub.repo_id:
        raise GrpoError("hub.push=true needs hub.repo_id, the repository to upload final/ to (e.g. me/my-grpo-model).")
    from huggingface_hub import constants

    from grpo_cli.models.hub import hub_unreachable

    why = "HF_HUB_OFFLINE=1 is set" if constants.HF_HUB_OFFLINE else hub_unreachable()
    if why:
        raise GrpoError(
            f"hub.push=true but the Hugging Face hub cannot be reached ({why}); train with hub.push=false "
            "and upload final/ later with `hf upload REPO_ID RUN_DIR/final`."
        )


def push(final: Path, cfg, console) -> str:
    """Upload final/ to hub.repo_id (created if missing); the repository's URL."""
    from huggingface_hub import HfApi

    api = HfApi()
    try:
        api.create_repo(cfg.hub.repo_id, private=cfg.hub.private, exist_ok=True)
        info = api.upload_folder(
            repo_id=cfg.hub.repo_id, folder_path=str(final), commit_message="grpo-cli: trained model"
        )
    except (OSError, ValueError) as e:  # no token, no rights, network gone mid-run (HfHubHTTPError is an OSError)
        raise GrpoError(
            f"Could not push {final} to the hub repository {cfg.hub.repo_id} ({first_line(e)[:200]}); the "
            "trained model is in final/: fix the token or repo id and upload it with "
            f"`hf upload {cfg.hub.repo_id} {final}`."
        ) from None
    console.print(f"pushed {final} to {cfg.hub.repo_id}")
    return str(getattr(info, "commit_url", cfg.hub.repo_id))


def _version() -> str:
    """This package's version, as the card names it (no link: the project has no public home yet)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("grpo-cli")
    except PackageNotFoundError:
        return "(source checkout)"
