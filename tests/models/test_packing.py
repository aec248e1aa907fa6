"""Packed batches (logprobs.py) and token-budget micro-batches (step.py): no pad token in a forward, and
the same log-probs, entropy, loss and gradients as the padded forward."""

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from grpo_cli.algo.objective import policy_loss
from grpo_cli.config import LoraConfig
from grpo_cli.generate import steps as steps_module
from grpo_cli.models.distributed import SINGLE, Dist
from grpo_cli.models.forward import StepBatch
from grpo_cli.models.logprobs import can_pack, enable_logprob_forward
from grpo_cli.models.packer import LAYOUTS, fill_bins, largest_micro_batch, pack
from grpo_cli.models.precision import Precision
from grpo_cli.samples.rollout import Rollout
from grpo_cli.samples.settings import StepSettings
from grpo_cli.update.step import optimise
from helpers import flat_inputs, generate, pack_rows, rollout_from_padded, token_logprobs, with_batch_sizes

PAD = 0
# Rows of a left-padded prompt + right-padded completion batch: (prompt tokens, completion tokens). The
# completion lengths include 1 and the cap T, the prompts 1 token and the widest.
SHAPES = [(5, 7), (3, 1), (1, 3), (4, 7), (5, 5), (2, 2), (1, 1), (3, 6)]
P, T = 5, 7


def llama(attn: str = "sdpa", seed: int = 0, **extra) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=61,
        hidden_size=48,
        intermediate_size=96,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        attn_implementation=attn,
        **extra,
    )
    model = LlamaForCausalLM(config)
    enable_logprob_forward(model)
    return model


def batch(seed: int = 1):
    """input_ids, attention_mask [B, P+T] and completion_mask [B, T] of SHAPES, pad 0 everywhere else."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 61, (len(SHAPES), P + T), generator=g)
    mask = torch.zeros_like(ids)
    for i, (p, c) in enumerate(SHAPES):
        mask[i, P - p : P + c] = 1
    return ids * mask, mask, mask[:, P:]


def alone(model, ids, mask):
    """The independent reference: each row by itself, no padding, no position ids, float64 log-softmax."""
    out = torch.zeros(ids.shape[0], T, dtype=torch.float64)
    for i in range(ids.shape[0]):
        row = ids[i][mask[i].bool()]
        logits = model(input_ids=row[None]).logits[0].double()
        c = int(mask[i, P:].sum())
        logp = torch.log_softmax(logits[-c - 1 : -1], -1).gather(-1, row[-c:, None]).squeeze(-1)
        out[i, :c] = logp
    return out


def test_a_packed_layout_holds_every_real_token_once_and_no_pad_between_rows():
    ids, mask, _ = batch()
    _, packed = pack_rows(ids, mask, T)
    lengths = [p + c for p, c in SHAPES]
    assert packed.input_ids.shape[1] == max(lengths)  # bins as long as the longest row
    assert packed.real_tokens == sum(lengths)
    assert packed.input_ids.numel() < ids.numel()  # fewer positions than the padded batch
    # Real tokens in bins, in row order, with positions from 0 per row.
    flat_ids, flat_pos = packed.input_ids.flatten(), packed.position_ids.flatten()
    seen = sorted(flat_ids[flat_ids != PAD].tolist())
    assert seen == sorted(ids[mask.bool()].tolist())
    # Each scored token sits right after its predicting state, and targets are the completion tokens.
    assert (flat_ids[packed.states + 1] == packed.targets).all()
    assert packed.targets.tolist() == ids[:, P:][mask[:, P:].bool()].tolist()
    # Within a row positions step by one; a restart begins every row (and filler).
    starts = (flat_pos == 0).sum().item()
    assert starts >= len(SHAPES)


@pytest.mark.parametrize("attn", ["sdpa", "eager"])
def test_packed_log_probs_and_entropy_equal_each_row_scored_alone_and_the_padded_forward(attn):
    model = llama(attn)
    ids, mask, cmask = batch()
    want = alone(model, ids, mask)
    with torch.no_grad():
        padded, padded_entropy = token_logprobs(model, ids, mask, T, with_entropy=True)
        packed, packed_entropy = token_logprobs(model, ids, mask, T, with_entropy=True, packing=True)
    m = cmask.bool()
    assert torch.allclose(packed[m].double(), want[m], atol=1e-5)
    assert torch.allclose(padded[m].double(), want[m], atol=1e-5)
    assert torch.allclose(packed_entropy[m], padded_entropy[m], atol=1e-5)
    assert (packed[~m] == 0).all()  # nothing is computed where a row has no token


def _loss_and_grads(model, ids, mask, cmask, packing: bool, params=None):
    model.zero_grad(set_to_none=True)
    g = torch.Generator().manual_seed(3)
    adv = torch.randn(ids.shape[0], generator=g)
    ref = -torch.rand(ids.shape[0], T, generator=g) * 3
    old = -torch.rand(ids.shape[0], T, generator=g) * 3
    logp, entropy = token_logprobs(model, ids, mask, T, entropy_grad=True, packing=packing)
    loss, _ = policy_loss(
        flat_inputs(
            logp,
            old,
            adv,
            cmask,
            clip_eps=0.2,
            beta=0.04,
            ref_logp=ref,
            kl_estimator="k3",
            entropy=entropy,
            entropy_coef=0.01,
        )
    )
    loss.backward()
    params = params or [p for p in model.parameters() if p.requires_grad]
    return loss.detach(), [p.grad.clone() for p in params]


def _assert_same(model, tol=1e-5):
    ids, mask, cmask = batch()
    loss_a, grads_a = _loss_and_grads(model, ids, mask, cmask, packing=False)
    loss_b, grads_b = _loss_and_grads(model, ids, mask, cmask, packing=True)
    assert abs(float(loss_a - loss_b)) <= tol
    assert len(grads_a) == len(grads_b) > 0
    for a, b in zip(grads_a, grads_b):
        assert torch.allclose(a, b, atol=tol, rtol=0), (a - b).abs().max()


def test_packed_and_padded_give_the_same_loss_and_gradients_in_fp32():
    _assert_same(llama())


def test_packed_and_padded_give_the_same_loss_and_gradients_under_lora():
    from grpo_cli.models.lora import add_adapter

    model = add_adapter(llama(), LoraConfig(r=4))
    for p in model.parameters():  # a non-zero adapter, so its gradients are not trivially alike
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    assert can_pack(model)
    _assert_same(model)


def test_bf16_mixed_packed_and_padded_agree_within_bf16_rounding():
    """bf16 compute rounds each matmul to 8 bits of mantissa, and packing changes the matmuls' shapes, so
    the two paths agree to bf16's precision, not bit for bit: log-probs within 0.03 nats here (the
    fp32 paths agree within 1e-5)."""
    model = llama()
    ids, mask, cmask = batch()
    with torch.no_grad(), Precision("bf16-mixed").autocast():
        padded, _ = token_logprobs(model, ids, mask, T)
        packed, _ = token_logprobs(model, ids, mask, T, packing=True)
    m = cmask.bool()
    want = alone(model, ids, mask)[m]
    assert (packed[m].double() - want).abs().max() < 0.03
    assert (packed[m] - padded[m]).abs().max() < 0.03


def test_a_model_that_transforms_its_logits_is_scored_padded():
    """Soft-capped logits (Gemma) go through the model's own forward: packing falls back, same numbers."""
    model = llama()
    model.config.final_logit_softcapping = 30.0  # read by our scorer only (Llama's forward ignores it)
    assert not can_pack(model)
    ids, mask, cmask = batch()
    with torch.no_grad():
        a, _ = token_logprobs(model, ids, mask, T)
        b, _ = token_logprobs(model, ids, mask, T, packing=True)
    assert torch.equal(a, b)


def _rollout(ids, mask, cmask) -> Rollout:
    B = ids.shape[0]
    return rollout_from_padded(
        [str(i) for i in range(B // 2)],
        2,
        ids,
        mask,
        cmask,
        torch.zeros(B, dtype=torch.bool),
        advantages=torch.randn(B, generator=torch.Generator().manual_seed(5)),
    )


def micro_batches(roll, settings, dist=SINGLE) -> list[torch.Tensor]:
    """The rows of each micro-batch the step forms in one bin each (so a budget counts real tokens)."""
    return [mb.rows for mb in StepBatch(roll, settings, dist, layout="one_bin").parts]


def _settings(**kw) -> StepSettings:
    from grpo_cli.config import TrainConfig

    cfg = TrainConfig()
    cfg.algo.beta = 0.0
    cfg.sampler.max_new_tokens = T
    settings = StepSettings.of(cfg)
    return StepSettings(**{**settings.__dict__, **kw})


def test_token_budget_micro_batches_respect_the_budget_and_cover_every_row_once():
    ids, mask, cmask = batch()
    roll = _rollout(ids, mask, cmask)
    lengths = mask.sum(1).tolist()  # 12, 4, 4, 11, 10, 4, 2, 9: 56 tokens
    parts = micro_batches(roll, _settings(max_tokens=20))
    assert sorted(i for p in parts for i in p.tolist()) == list(range(len(SHAPES)))
    assert len(parts) == 3  # ceil(56 / 20) = 3, and a spread into three fits
    assert all(sum(lengths[i] for i in p.tolist()) <= 20 for p in parts)
    # A row longer than the budget goes alone.
    parts = micro_batches(roll, _settings(max_tokens=11))
    assert all(len(p) == 1 or sum(lengths[i] for i in p.tolist()) <= 11 for p in parts)
    assert [p.tolist() for p in parts if 0 in p.tolist()] == [[0]]
    # Without a budget: micro_batch_size rows, in order.
    assert [p.tolist() for p in micro_batches(roll, _settings(micro_batch_size=3))] == [[0, 1, 2], [3, 4, 5], [6, 7]]


class _TwoRanks(Dist):
    """Rank 0 of two, whose other rank needs five micro-batches."""

    world_size = 2

    def all_max(self, value: float) -> float:
        return max(value, 5.0)


def test_every_rank_runs_the_same_number_of_token_budget_micro_batches():
    ids, mask, cmask = batch()
    parts = micro_batches(_rollout(ids, mask, cmask), _settings(max_tokens=20), _TwoRanks())
    assert len(parts) == 5 and all(len(p) >= 1 for p in parts)
    assert sorted(i for p in parts for i in p.tolist()) == list(range(len(SHAPES)))


@pytest.mark.parametrize("packing", [False, True])
def test_token_budget_micro_batches_give_the_whole_batch_s_loss_and_update(packing):
    """One optimiser step over micro-batches of at most 20 tokens equals the step over one micro-batch of
    every row: the same summed loss, gradient norm and new weights (global normalisers)."""
    ids, mask, cmask = batch()
    results = []
    for settings in (_settings(micro_batch_size=len(SHAPES), packing=False), _settings(max_tokens=20, packing=packing)):
        model = llama()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        from grpo_cli.samples.metrics import StepMetrics

        record = StepMetrics()
        _, norm = optimise(
            model, optimizer, _rollout(ids, mask, cmask), settings, Precision("fp32"), record=record, with_entropy=True
        )
        row = record.reduce(Dist())
        results.append((row["loss"], norm, [p.detach().clone() for p in model.parameters()]))
    (loss_a, norm_a, w_a), (loss_b, norm_b, w_b) = results
    assert abs(loss_a - loss_b) < 1e-6 and abs(norm_a - norm_b) < 1e-5 * max(1.0, norm_a)
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(w_a, w_b))


def test_finished_rows_leave_the_decode_batch_without_changing_a_sampled_token(tiny_model, monkeypatch):
    """Dropping finished rows (as soon as any has finished) samples exactly the tokens of decoding every
    row to the end; the forwards really do shrink."""
    model, tok = tiny_model
    prompts = ["3+4=", "12+30=", "7+7=", "50+25="]
    runs = {}
    for name, threshold in (("drop", 1.0), ("keep", -1.0)):
        monkeypatch.setattr(steps_module, "DROP_FINISHED_AT", threshold)
        torch.manual_seed(0)
        runs[name] = with_batch_sizes(
            model, lambda: generate(model, tok, prompts, 4, max_new_tokens=12, temperature=1.5)
        )
    (drop, drop_rows), (keep, keep_rows) = runs["drop"], runs["keep"]
    assert torch.equal(drop.tokens, keep.tokens) and torch.equal(drop.lengths, keep.lengths)  # rows end at their EOS
    assert drop.completions == keep.completions and len(set(drop.completions)) > 4
    assert len(set(keep_rows[1:])) == 1  # every row decoded to the end
    assert min(drop_rows[1:]) < keep_rows[1]  # rows left the batch
    assert sum(drop_rows[1:]) < sum(keep_rows[1:])


def test_the_packer_lays_a_hand_worked_micro_batch_into_bins_of_the_longest_row():
    # Rows of 12, 4, 4, 11 and 10 tokens in bins of 12 (the longest), first-fit decreasing: 12, 11 and 10 open
    # a bin each; neither 4 fits in 1 or 2 free tokens, so they share a fourth (8 <= 12): 4 x 12 positions.
    (mb,) = pack([12, 4, 4, 11, 10], layout="bins", batch_rows=5)
    assert mb.bins == ((0,), (3,), (4,), (1, 2)) and mb.capacity == 12 and mb.positions == 48
    (mb,) = pack([12, 4, 4, 11, 10], layout="one_bin", batch_rows=5)
    assert mb.bins == ((0, 3, 4, 1, 2),) and mb.positions == 41
    (mb,) = pack([12, 4, 4, 11, 10], layout="padded", batch_rows=5, padded_length=14)
    assert mb.bins is None and mb.positions == 5 * 14


def test_bins_grow_past_the_longest_row_where_filler_costs_more_than_the_longer_attention():
    """packer.fill_bins with pair_cost p, by hand (a bin of c positions costs c * (1 + p * c)):
    - rows 553, 100, 85 (a shared unit and two rows), p = 1 / (6 * 576): bins of 553 hold [553] and [100, 85],
      1,106 positions costing 1,106 * 1.16 = 1,283; one bin of 738 costs 738 * 1.21 = 896: one bin;
    - rows 100, 100, 10, p = 0.05: bins of 100 hold three rows in 300 positions, 300 * 6 = 1,800; bins of 125
      (a quarter longer) hold [100, 10] and [100], 250 * 7.25 = 1,812; from 157 no layout can cost less than
      the 210 tokens' 210 * (1 + 0.05 * 157) = 1,858: kept;
    - no pair cost, or rows shorter than GROW_FROM (64): bins of the longest row, as always."""
    assert fill_bins([553, 100, 85], pair_cost=1 / (6 * 576)) == (((0, 1, 2),), 738)
    assert fill_bins([100, 100, 10], pair_cost=0.05) == (((0,), (1,), (2,)), 100)
    assert fill_bins([553, 100, 85]) == (((0,), (1, 2)), 553)
    assert fill_bins([60, 10, 10, 20], pair_cost=1e-4) == (((0,), (3, 1, 2)), 60)
    (mb,) = pack([553, 100, 85], layout="bins", batch_rows=3, pair_cost=1 / (6 * 576))
    assert mb.bins == ((0, 1, 2),) and mb.positions == 738


@pytest.mark.parametrize("layout", LAYOUTS)
def test_no_micro_batch_computes_more_positions_than_the_memory_planner_counts(layout):
    """The planner counts `largest_micro_batch` (memory.py); the step's packer must never exceed it, pads
    and filler included, and must hold every row exactly once."""
    g = torch.Generator().manual_seed(0)
    for trial in range(200):
        rows, longest = int(torch.randint(1, 40, (1,), generator=g)), int(torch.randint(1, 60, (1,), generator=g))
        lengths = torch.randint(1, longest + 1, (rows,), generator=g).tolist()
        padded = max(lengths) + int(torch.randint(0, 5, (1,), generator=g))  # a padded row: longest prompt + completion
        budget = int(torch.randint(0, 4 * longest, (1,), generator=g))
        batch_rows = int(torch.randint(1, 9, (1,), generator=g))
        parts = pack(lengths, layout=layout, token_budget=budget, batch_rows=batch_rows, padded_length=padded)
        assert sorted(i for mb in parts for i in mb.rows.tolist()) == list(range(rows))
        bound = largest_micro_batch(padded, token_budget=budget, batch_rows=batch_rows)
        assert max(mb.positions for mb in parts) <= bound, (trial, layout)
        if layout != "padded":  # every bin holds its rows within its capacity
            assert all(sum(lengths[mb.rows[i]] for i in b) <= mb.capacity for mb in parts for b in mb.bins)
