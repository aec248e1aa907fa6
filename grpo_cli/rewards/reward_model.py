"""reward=model: the scalar head of a sequence-classification model scoring prompt + completion.

Any `AutoModelForSequenceClassification` with one label, from a hub id or a local directory, run
in eval mode without gradients, `reward.model_batch_size` texts at a time on `reward.model_device`.
"""

from __future__ import annotations

import torch
from transformers import AutoModelForSequenceClassification, AutoTokenizer

from grpo_cli.errors import GrpoError, first_line
from grpo_cli.models.loading import resolve_device, resolve_path


def build(cfg):
    if not cfg.model_path or cfg.model_batch_size < 1:  # checks.check_reward refuses these
        raise ValueError(
            f"reward.model_path={cfg.model_path!r}, model_batch_size={cfg.model_batch_size}: run the checks."
        )
    location, device = (
        resolve_path(cfg.model_path, key="reward.model_path"),
        resolve_device(cfg.model_device, key="reward.model_device"),
    )
    try:
        tokenizer = AutoTokenizer.from_pretrained(location)
        model = AutoModelForSequenceClassification.from_pretrained(location)
    except (OSError, ValueError, RuntimeError) as e:  # missing files, a wrong architecture, mismatched weights
        raise GrpoError(
            f"Could not load a reward model from {cfg.model_path!r} ({first_line(e)}); check the hub id and your "
            "network, "
            "or pass reward.model_path=LOCAL_DIR."
        ) from None
    if model.config.num_labels != 1:
        raise GrpoError(
            f"The reward model {cfg.model_path!r} has {model.config.num_labels} labels; reward=model needs one (a "
            "scalar score)."
        )
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    model.config.pad_token_id = tokenizer.pad_token_id  # the head reads the last non-pad token
    model.to(device).eval()
    size = cfg.model_batch_size

    @torch.no_grad()
    def reward(batch):
        texts = [p + c for p, c in zip(batch.prompts, batch.completions)]
        scores = []
        for s in range(0, len(texts), size):
            enc = tokenizer(texts[s : s + size], return_tensors="pt", padding=True, truncation=True).to(device)
            scores += model(**enc).logits[:, 0].float().tolist()
        return scores

    reward.in_process = True  # batched forwards on the trainer's device; a worker per completion would lose both
    return reward
