"""One GRPO step (docs/math.md, "The algorithm") on a scored rollout from the rollout source (source.py):
whiten the rewards within each group, compute only the log-probabilities the config needs, and run mu
clipped updates. `trainer.train` calls it once per step; benchmarks call it alone.

Every normaliser is global: under data parallelism (distributed.py) token and sequence counts are
summed over ranks, so the loss, its gradient and the logged metrics are those of the whole batch,
whatever the world size. Metrics stay device tensors until the step ends, then are reduced over ranks
and read in one collective (metrics.py).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor
from torch.profiler import record_function

from grpo_cli.algo.advantages import ADVANTAGES
from grpo_cli.algo.objective import POLICY_LOSSES, LossInputs, policy_loss, sampler_correction_weight, token_kl
from grpo_cli.models.distributed import SINGLE, Dist
from grpo_cli.models.forward import LogProbRequest, StepBatch, score_tokens
from grpo_cli.models.memory import GIB, current_bytes, peak_bytes
from grpo_cli.models.policies import Policies
from grpo_cli.models.precision import Precision
from grpo_cli.samples.metrics import PHASES, StepMetrics, clock
from grpo_cli.samples.rollout import Rollout
from grpo_cli.samples.settings import StepSettings


def loss_mask(roll: Rollout, mask_truncated: bool, row_of_token: Tensor) -> Tensor:
    """[N] the tokens that enter the loss: the model's own (the loss mask), none of a padding row, and with
    mask_truncated none of a completion cut off by max_new_tokens (DAPO's overlong filtering: its reward judges an
    unfinished answer)."""
    mask = roll.loss_mask.float()
    if mask_truncated:
        mask = mask * (~roll.truncated.to(mask.device))[row_of_token]
    if roll.weight is not None:
        mask = mask * roll.weight.to(mask.device)[row_of_token]
    return mask


def real_rows(roll: Rollout) -> Tensor:
    return roll.weight if roll.weight is not None else torch.ones(roll.rows, device=roll.tokens.device)


def optimise(
    policy,
    optimizer,
    roll: Rollout,
    settings: StepSettings,
    precision: Precision,
    *,
    record: StepMetrics | None = None,
    with_entropy: bool = False,
    dist: Dist = SINGLE,
    batch: StepBatch | None = None,
) -> tuple[bool, float]:
    """One optimiser step on the policy loss (algo.loss: the clipped surrogate by default; losses.py), with its KL
    term and entropy bonus, over the whole (global) rollout batch, accumulated over micro-batches with the batch's
    normalisers (docs/math.md, "Aggregation"); each micro-batch's tokens are flat, each with its row. This pass's
    metrics go to `record` when given, the entropy when `with_entropy`; `batch` the step's micro-batches (formed
    here when not given). Returns (skipped, gradient norm).

    A non-finite loss or gradient norm skips the step: the weights and the optimizer's moments stay as they were.
    The gradient norm is global (DDP all-reduces the gradients first), so every rank decides alike.
    """
    algo, temperature = settings.algo, settings.sampling.temperature
    batch = batch if batch is not None else StepBatch.for_model(roll, settings, policy, dist)
    full_mask = loss_mask(roll, algo.mask_truncated, batch.row_of_token)  # [N]
    request = LogProbRequest(batch.T, temperature, with_entropy or algo.entropy_coef != 0, algo.entropy_coef != 0)
    # The step's normalisers, summed over ranks, read in one sync before any work is queued.
    totals = dist.all_sum(torch.stack([full_mask.sum().float(), real_rows(roll).sum().float()])).tolist()
    optimizer.zero_grad(set_to_none=True)
    # One autocast region for the whole pass, so bf16-mixed casts each weight once rather than once per
    # micro-batch (and again in the checkpointed head's recompute); each backward steps outside it.
    with precision.autocast():
        for i in range(len(batch.parts)):
            with dist.no_sync(policy, last=i == len(batch.parts) - 1):  # gradients all-reduced once, after the last
                logp, entropy, index = batch.logprobs(policy, i, request)  # [K] each
                with precision.outside_autocast():
                    inputs, sampler = loss_inputs(logp, entropy, index, batch, full_mask, roll, settings, totals)
                    loss, m = policy_loss(inputs)
                    # DDP averages gradients over ranks: times the world size, that average is the global sum.
                    (loss * dist.world_size).backward()
            if record is not None:
                record_pass(record, m, loss, inputs, sampler, entropy if with_entropy else None, algo)
    return clipped_step(policy, optimizer, settings.max_grad_norm)


def loss_inputs(logp, entropy, index, batch: StepBatch, full_mask, roll: Rollout, settings: StepSettings, totals):
    """A micro-batch's LossInputs: its flat tokens (`index` into the step's) with their rows' advantages, the
    old, reference and sampler log-probs, and the step's normalisers (`totals`: tokens, sequences)."""
    algo = settings.algo
    assert roll.advantages is not None, "the loss follows the advantages"
    rows, mask = batch.row_of_token[index], full_mask[index]
    # On-policy with mu = 1, pi_theta_old is the current policy: ratio 1, gradient A * grad log pi.
    old = roll.old_logp[index] if roll.old_logp is not None else logp.detach()
    sampler = roll.sampler_logp[index] if roll.sampler_logp is not None else None
    weight = None
    if sampler is not None and algo.sampler_correction == "tis":
        weight = sampler_correction_weight(old, sampler, algo.sampler_correction_cap)
    return LossInputs(
        logp,
        old,
        roll.advantages[rows],
        mask,
        rows,
        num_segments=roll.rows,
        clip_eps=algo.clip_eps,
        clip_eps_high=algo.clip_eps_high,
        beta=algo.beta,
        kl_estimator=algo.kl_estimator,
        kl_ratio=algo.kl_ratio,
        ref_logp=roll.ref_logp[index] if roll.ref_logp is not None else None,
        aggregation=algo.aggregation,
        ratio_level=algo.ratio_level,
        max_completion_length=settings.sampling.max_new_tokens,
        num_sequences=max(totals[1], 1.0),
        num_tokens=totals[0],
        sampler_weight=weight,
        loss=algo.loss,
        loss_args=algo.loss_args,
        clip_ratio_c=algo.clip_ratio_c,
        entropy=entropy,
        entropy_coef=algo.entropy_coef,
    ), sampler


def clipped_step(policy, optimizer, max_grad_norm: float) -> tuple[bool, float]:
    """Clip the gradients' global norm and step, unless it is not finite: (skipped, the norm)."""
    params = [p for p in policy.parameters() if p.grad is not None]
    max_norm = max_grad_norm if max_grad_norm > 0 else math.inf
    grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm)) if params else 0.0  # a host sync
    finite = math.isfinite(grad_norm)  # a non-finite loss gives non-finite gradients, hence this norm
    if finite:
        optimizer.step()
    optimizer.zero_grad(set_to_none=True)  # a skipped step's gradients are thrown away
    return not finite, grad_norm


def record_pass(record: StepMetrics, m: dict, loss: Tensor, inputs: LossInputs, sampler, entropy, algo) -> None:
    """A micro-batch's metrics: the loss, the entropy, the KL to the behaviour, the loss's own, the sampler's gap."""
    logp, old, mask, weight = inputs.logp, inputs.old_logp, inputs.mask, inputs.sampler_weight
    tokens = mask.sum()
    if entropy is not None:
        record.mean("entropy", (entropy.detach() * mask).sum(), tokens)
    record.sum("loss", loss.detach())
    record.mean("kl_behaviour", (token_kl(old, logp.detach(), "k3") * mask).sum(), tokens)
    for k in ("kl", "clip_frac_low", "clip_frac_high", "ratio_mean", *POLICY_LOSSES[algo.loss].metrics):
        if k in m:
            record.mean(k, m[k] * tokens, tokens)
    record.min("ratio_min", m["ratio_min"])
    record.max("ratio_max", m["ratio_max"])
    if sampler is not None:  # the engine against the trainer (docs/math.md, "Sampler mismatch")
        record_mismatch(record, old, sampler, mask, weight, algo.sampler_correction_cap)


def record_mismatch(record: StepMetrics, old, sampler, mask, weight, cap: float) -> None:
    """How far the sampler's log-probs are from the trainer's, over completion tokens: the mean
    |log pi_old - log pi_sampler| and the largest pi_old / pi_sampler; with the correction on, the share
    of tokens whose weight the cap cut."""
    tokens, keep = mask.sum(), mask.bool()
    diff = (old - sampler).float()
    record.mean("sampler/logp_diff", (diff.abs() * mask).sum(), tokens)
    record.max("sampler/ratio_max", torch.where(keep, diff, -torch.inf).amax().exp())
    if weight is not None:
        record.mean("sampler/capped_frac", ((diff > math.log(cap)) & keep).sum(), tokens)


def advantages(roll: Rollout, algo, dist: Dist) -> torch.Tensor:
    """The advantages of the real groups ([n*G]) by algo.advantage (advantages.py); padding groups get zero and
    stay out of the statistics."""
    real = real_rows(roll).view(-1, roll.group_size)[:, 0].bool().cpu()  # [n]
    assert roll.rewards is not None, "advantages follow the scores"
    out = torch.zeros_like(roll.rewards, dtype=torch.float32)
    out[real] = ADVANTAGES[algo.advantage](roll.rewards[real], algo, dist.all_sum).float()
    return out.flatten().to(roll.tokens.device)


def grpo_step(
    policies: Policies,
    optimizer,
    scored,
    settings: StepSettings,
    *,
    precision: Precision | None = None,
    dist: Dist = SINGLE,
):
    """Whiten the scored rollout's rewards within groups and run mu updates (docs/math.md, "The
    algorithm"): (metrics row, rollout). `scored` is a source.ScoredRollout: what the sampling policy
    drew, with its rewards and answers.

    When the weights that sampled are not the policy's (a behaviour policy, or pushed weights older than
    it), the rollout carries their log-probabilities, the denominator of every ratio. On-policy they
    come from pi_theta_old, computed once per batch when mu > 1.
    """
    precision = precision or Precision("fp32")
    policy, roll, metrics = policies.policy, scored.rollout, scored.metrics
    device = next(policy.parameters()).device
    algo, temp = settings.algo, settings.sampling.temperature
    # Each phase is also a named profiler range (scripts/bench.py --profile groups the costs by them).
    t0 = clock(device)
    # once: every pass runs these micro-batches
    batch = StepBatch.for_model(roll, settings, policy, dist)
    with record_function(PHASES[1]):  # only the log-probabilities this config needs: none when beta = 0 and mu = 1
        roll.old_logp = roll.behaviour_logp
        if roll.old_logp is None and algo.num_iterations > 1:
            roll.old_logp = score_tokens(policy, batch, temp, precision)
        if policies.reference is not None:
            with policies.reference() as reference:
                roll.ref_logp = score_tokens(reference, batch, temp, precision)
        roll.advantages = advantages(roll, algo, dist)
    t_score = clock(device)

    skipped, grad_norm = 0, 0.0
    with record_function(PHASES[2]):
        for i in range(algo.num_iterations):  # entropy from the first pass (the sampled policy), the rest from the last
            last = i == algo.num_iterations - 1
            failed, grad_norm = optimise(
                policy,
                optimizer,
                roll,
                settings,
                precision,
                record=metrics if last else None,
                with_entropy=i == 0,
                dist=dist,
                batch=batch,
            )
            skipped += failed
    t_end = clock(device)

    record_rollout(metrics, roll, batch)
    record_costs(metrics, scored, (t_score - t0, t_end - t_score), device)
    row = metrics.reduce(dist)  # the one collective (and host read) of the step's metrics
    row["reward_std"] = math.sqrt(max(row.pop("reward_sq") - row["reward_mean"] ** 2, 0.0))
    row["completion_tokens"], row["prompt_tokens"] = int(row["completion_tokens"]), int(row["prompt_tokens"])
    if "forward_tokens" in row:
        row["forward_tokens"] = int(row["forward_tokens"])
    tokens_per_s = row["completion_tokens"] / max(row["seconds"], 1e-9)
    row.update(grad_norm=grad_norm, skipped=float(skipped), tokens_per_s=tokens_per_s)
    return row, roll


def record_rollout(metrics: StepMetrics, roll: Rollout, batch: StepBatch) -> None:
    """What the step's rollout was: completion lengths, padding a padded batch would have had, tokens."""
    weights = real_rows(roll)
    lengths = roll.sampled_tokens().to(weights.device).double() * weights.double()
    metrics.mean("completion_len", lengths.sum(), weights.sum())
    real = weights.bool()
    metrics.min("completion_len_min", torch.where(real, lengths, lengths.amax()).amin())  # no host sync
    metrics.max("completion_len_max", lengths.amax())  # padding rows' lengths are already 0
    # The share of a padded [rows, prompt + completion] batch that is padding: what packing leaves out.
    padded = roll.rows * (int(roll.prompt_lengths.max()) + roll.completion_len)
    metrics.mean("padding_frac", padded - roll.tokens.numel(), padded)
    metrics.sum("completion_tokens", lengths.sum())
    metrics.sum("prompt_tokens", (roll.prompt_lengths.to(weights.device).double() * weights.double()).sum())
    if any(p is not None and p.tree is not None for p in batch.packed):  # shared prompts: each computed once
        metrics.sum("forward_tokens", sum(p.real_tokens for p in batch.packed))
    metrics.max("row_tokens_max", max(roll.lengths.tolist(), default=0))  # what the memory plan counts (memory.py)
    metrics.max("micro_batch_positions", max((mb.positions for mb in batch.parts), default=0))
    metrics.mean("truncated_frac", (roll.truncated.double() * weights.double()).sum(), weights.sum())


def record_costs(metrics: StepMetrics, scored, seconds: tuple[float, float], device) -> None:
    """The step's phases in seconds (the slowest rank's: the step waits for it) and its memory."""
    score_s, update_s = seconds
    metrics.max("gen_s", scored.gen_s)
    metrics.max("score_s", scored.score_s + score_s)
    metrics.max("update_s", update_s)
    metrics.max("seconds", scored.gen_s + scored.score_s + score_s + update_s)
    metrics.max("peak_memory_gib", peak_bytes(device) / GIB)  # the largest rank's (memory.py)
    metrics.max("memory_gib", current_bytes(device) / GIB)  # in use at the step's end (health.py: memory_growth)
