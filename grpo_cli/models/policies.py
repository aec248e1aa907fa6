"""A run's policies by role (docs/math.md, "Policies"), built from the config.

- The policy being trained: full weights (in the precision's parameter dtype), or, with
  `model.lora.r > 0`, a float32 LoRA adapter on a frozen base stored in the compute dtype.
- The KL reference, used when beta != 0: a frozen copy of the initial model; under LoRA the policy
  with its adapter off, which is exactly the initial model, with no second copy in memory.
- The behaviour policy, which samples when off-policy: a frozen model (`algo.behaviour=frozen`), or a
  copy refreshed every K steps (`lagged`); under LoRA the base with the adapter off (frozen, no path)
  or a lagged copy of the adapter alone.

Frozen models are stored in the compute dtype: nothing updates them.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from typing import Callable, ContextManager

import torch

from grpo_cli.config import reference_in_worker
from grpo_cli.models.lora import AdapterCopy, adapter_disabled, add_adapter, load_adapter
from grpo_cli.models.loading import load_model


@dataclass
class Policies:
    """The policies by role (docs/math.md, "Policies"): the one being trained, the KL reference (None
    when beta = 0) and the behaviour policy that samples (None on-policy, where the policy samples).
    A reference or behaviour is a context-manager factory yielding the model to run: a separate frozen
    model, or, under LoRA, the policy itself with its adapter off or a lagged adapter swapped in."""

    policy: torch.nn.Module
    reference: Callable[[], ContextManager] | None = None
    behaviour: Callable[[], ContextManager] | None = None

    @classmethod
    def of(cls, policy, reference=None, behaviour=None) -> "Policies":
        """From plain models: each role runs its own model."""
        scope = lambda model: (lambda: nullcontext(model)) if model is not None else None  # noqa: E731
        return cls(policy, scope(reference), scope(behaviour))


def load_policy(m, precision, resume_from=None):
    """The model being trained (`m`: the model config group): from model.path, or from the checkpoint
    being resumed."""
    if m.lora.r == 0:
        weights = str(resume_from) if resume_from else m.path
        return load_model(weights, precision.param_dtype, m.device, m.trust_remote_code,
                          gradient_checkpointing=m.gradient_checkpointing, recompute_pointwise=m.recompute_pointwise)
    base = load_model(m.path, precision.frozen_dtype, m.device, m.trust_remote_code,
                      gradient_checkpointing=m.gradient_checkpointing, quantize=m.lora.quantize,
                      recompute_pointwise=m.recompute_pointwise)
    if m.lora.quantize:
        from grpo_cli.models.lora import peft_module

        base = peft_module().prepare_model_for_kbit_training(base, use_gradient_checkpointing=m.gradient_checkpointing)
    if resume_from:
        return load_adapter(base, resume_from, trainable=True)
    return add_adapter(base, m.lora)


def frozen_model(m, precision, path: str | None = None, key: str = "model.path"):
    """A frozen model in the compute dtype, as a reference or behaviour is held (`m`: the model config group;
    `path` default m.path; `key` names the setting in the sentence if it cannot be loaded)."""
    return load_model(path or m.path, precision.frozen_dtype, m.device, m.trust_remote_code, key=key).requires_grad_(False)


class RunPolicies:
    """The policy with its reference and behaviour: what each role runs, when copies refresh, and the
    state a checkpoint must keep for them (a refreshed reference, a lagged behaviour)."""

    def __init__(self, cfg, precision, policy):
        self.policy, self.algo = policy, cfg.algo
        m, algo, lora = cfg.model, cfg.algo, cfg.model.lora.r > 0
        scored_here = algo.beta != 0 and not reference_in_worker(cfg)  # else the worker scores the reference
        self.reference = frozen_model(m, precision) if scored_here and not lora else None
        self.behaviour = None  # a frozen model, or (LoRA, lagged) an AdapterCopy
        self.behaviour_is_base = lora and algo.behaviour == "frozen" and not algo.behaviour_path
        if algo.behaviour == "frozen" and not self.behaviour_is_base:
            self.behaviour = frozen_model(m, precision, algo.behaviour_path,
                                          "algo.behaviour_path" if algo.behaviour_path else "model.path")
        elif algo.behaviour == "lagged":
            self.behaviour = AdapterCopy(policy) if lora else frozen_model(m, precision)
        self.reference_is_base = lora and scored_here

    def roles(self) -> Policies:
        """The step's view: a context per role yielding the model to run."""
        policy = self.policy
        reference = behaviour = None
        if self.reference_is_base:
            reference = lambda: adapter_disabled(policy)  # noqa: E731
        elif self.reference is not None:
            reference = lambda: nullcontext(self.reference)  # noqa: E731
        if self.behaviour_is_base:
            behaviour = lambda: adapter_disabled(policy)  # noqa: E731
        elif isinstance(self.behaviour, AdapterCopy):
            behaviour = lambda: self.behaviour.swapped_in(policy)  # noqa: E731
        elif self.behaviour is not None:
            behaviour = lambda: nullcontext(self.behaviour)  # noqa: E731
        return Policies(policy, reference, behaviour)

    def refresh(self, step: int) -> None:
        """Copy the policy into the lagged behaviour every behaviour_refresh steps and into the reference
        every ref_refresh steps (DeepSeekMath's iterative RL); load_state_dict casts to the frozen dtype."""
        algo = self.algo
        if self.reference is not None and algo.ref_refresh and step % algo.ref_refresh == 0:
            self.reference.load_state_dict(self.policy.state_dict())
        if algo.behaviour == "lagged" and step % algo.behaviour_refresh == 0:
            if isinstance(self.behaviour, AdapterCopy):
                self.behaviour.refresh(self.policy)
            else:
                self.behaviour.load_state_dict(self.policy.state_dict())

    def state_dict(self) -> dict:
        """What is not on disk already: a refreshed reference, a lagged behaviour."""
        out = {}
        if self.reference is not None and self.algo.ref_refresh:
            out["reference"] = self.reference.state_dict()
        if self.algo.behaviour == "lagged":
            out["behaviour"] = self.behaviour.state if isinstance(self.behaviour, AdapterCopy) else self.behaviour.state_dict()
        return out

    def load_state_dict(self, state: dict) -> None:
        if "reference" in state:
            self.reference.load_state_dict(state["reference"])
        if "behaviour" in state:
            if isinstance(self.behaviour, AdapterCopy):
                held = self.behaviour.state
                self.behaviour.state = {k: v.to(held[k].device) for k, v in state["behaviour"].items()}
            else:
                self.behaviour.load_state_dict(state["behaviour"])

