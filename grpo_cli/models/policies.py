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
from typing import Callable, ContextManager

import torch

from grpo_cli.config import reference_in_worker
from grpo_cli.models.loading import load_model


def load_policy(m, precision, resume_from=None):
    """The model being trained (`m`: the model config group): from model.path, or from the checkpoint
    being resumed."""
    if m.lora.r == 0:
        weights = str(resume_from) if resume_from else m.path
        return load_model(
            weights,
            precision.param_dtype,
            m.device,
            m.trust_remote_code,
            gradient_checkpointing=m.gradient_checkpointing,
            recompute_pointwise=m.recompute_pointwise,
        )
    base = load_model(
        m.path,
        precision.frozen_dtype,
        m.device,
        m.trust_remote_code,
        gradient_checkpointing=m.gradient_checkpointing,
        quantize=m.lora.quantize,
        recompute_pointwise=m.recompute_pointwise,
    )
    from grpo_cli.models.lora import add_adapter, load_adapter, peft_module

    if m.lora.quantize:
        base = peft_module().prepare_model_for_kbit_training(base, use_gradient_checkpointing=m.gradient_checkpointing)
    if resume_from:
        return load_adapter(base, resume_from, trainable=True)
    return add_adapter(base, m.lora)


def frozen_model(m, precision, path: str | None = None, key: str = "model.path"):
    """A frozen model in the compute dtype, as a reference or behaviour is held (`m`: the model config group;
    `path` default m.path; `key` names the setting in the sentence if it cannot be loaded)."""
    return load_model(path or m.path, precision.frozen_dtype, m.device, m.trust_remote_code, key=key).requires_grad_(
        False
    )


BASE = "base"  # a role the policy itself runs with its LoRA adapter off: exactly the initial model, no second copy


class Policies:
    """The policies by role (docs/math.md, "Policies"): the one being trained, the KL reference (None when
    beta = 0) and the behaviour policy that samples (None on-policy). A role holds a frozen model, BASE, or (a
    lagged behaviour under LoRA) an AdapterCopy (lora.py) swapped into the policy; `reference` and `behaviour`
    are context factories yielding the model to run. A refreshed reference and a lagged behaviour are the state a
    checkpoint keeps."""

    def __init__(self, policy, reference=None, behaviour=None, algo=None):
        self.policy, self.held_reference, self.held_behaviour, self.algo = policy, reference, behaviour, algo

    @classmethod
    def load(cls, cfg, precision, policy) -> "Policies":
        """The run's roles around `policy`, loaded as the config asks (frozen models in the compute dtype)."""
        m, algo, lora = cfg.model, cfg.algo, cfg.model.lora.r > 0
        scored_here = algo.beta != 0 and not reference_in_worker(cfg)  # else the worker scores the reference
        reference = (BASE if lora else frozen_model(m, precision)) if scored_here else None
        behaviour = None
        if algo.behaviour == "frozen":
            behaviour = (
                BASE
                if lora and not algo.behaviour_path
                else frozen_model(
                    m, precision, algo.behaviour_path, "algo.behaviour_path" if algo.behaviour_path else "model.path"
                )
            )
        elif algo.behaviour == "lagged" and lora:
            from grpo_cli.models.lora import AdapterCopy

            behaviour = AdapterCopy(policy)
        elif algo.behaviour == "lagged":
            behaviour = frozen_model(m, precision)
        return cls(policy, reference, behaviour, algo)

    @property
    def reference(self) -> Callable[[], ContextManager] | None:
        return self._role(self.held_reference)

    @property
    def behaviour(self) -> Callable[[], ContextManager] | None:
        return self._role(self.held_behaviour)

    def _role(self, held) -> Callable[[], ContextManager] | None:
        if held is None:
            return None
        if held is BASE:
            from grpo_cli.models.lora import adapter_disabled

            return lambda: adapter_disabled(self.policy)
        if isinstance(held, torch.nn.Module):
            return lambda: nullcontext(held)
        return lambda: held.swapped_in(self.policy)  # an AdapterCopy (lora.py)

    def refresh(self, step: int) -> None:
        """Copy the policy into the lagged behaviour every behaviour_refresh steps and into the reference every
        ref_refresh steps (DeepSeekMath's iterative RL); load_state_dict casts to the frozen dtype."""
        algo, reference, behaviour = self.algo, self.held_reference, self.held_behaviour
        if algo is None:
            return
        if isinstance(reference, torch.nn.Module) and algo.ref_refresh and step % algo.ref_refresh == 0:
            reference.load_state_dict(self.policy.state_dict())
        if algo.behaviour == "lagged" and step % algo.behaviour_refresh == 0:
            if isinstance(behaviour, torch.nn.Module):
                behaviour.load_state_dict(self.policy.state_dict())
            else:
                behaviour.refresh(self.policy)

    def state_dict(self) -> dict:
        """What is not on disk already: a refreshed reference, a lagged behaviour."""
        out, algo = {}, self.algo
        if isinstance(self.held_reference, torch.nn.Module) and algo.ref_refresh:
            out["reference"] = self.held_reference.state_dict()
        if algo.behaviour == "lagged":
            held = self.held_behaviour
            out["behaviour"] = held.state_dict() if isinstance(held, torch.nn.Module) else held.state
        return out

    def load_state_dict(self, state: dict) -> None:
        if "reference" in state:
            self.held_reference.load_state_dict(state["reference"])
        if "behaviour" in state:
            held = self.held_behaviour
            if isinstance(held, torch.nn.Module):
                held.load_state_dict(state["behaviour"])
            else:
                held.state = {k: v.to(held.state[k].device) for k, v in state["behaviour"].items()}
