"""trainer.shared_prompts: a group's prompt computed once per micro-batch (packer.shared_inputs, a tree attention
mask). Its log-probs, loss and gradients equal the plain packed forward's, and each row's scored alone, in fp32."""

import pytest
import torch
from test_packing import llama

from grpo_cli.algo.objective import LossInputs, policy_loss
from grpo_cli.models.logprobs import LogProbRequest, packed_logprobs
from grpo_cli.models.packer import pack, packed_inputs, shared_inputs, tree_mask
from helpers import on_grid, scored_cells

# Groups: (prompt length, [completion lengths]); a lone row, a one-token prompt, completions of 1 token and the cap.
GROUPS = [(5, [7, 1, 3, 7]), (1, [2, 5]), (3, [6]), (4, [1, 1, 4])]
T = 7


def rollout(seed: int = 1):
    """Flat tokens, offsets, lengths and prompt lengths of GROUPS, each group's rows sharing its prompt."""
    g = torch.Generator().manual_seed(seed)
    rows, prompts = [], []
    for p, completions in GROUPS:
        prompt = torch.randint(1, 61, (p,), generator=g)
        for c in completions:
            rows.append(torch.cat([prompt, torch.randint(1, 61, (c,), generator=g)]))
            prompts.append(p)
    lengths = [len(r) for r in rows]
    offsets = [sum(lengths[:i]) for i in range(len(rows))]
    return torch.cat(rows), offsets, lengths, prompts


def alone(model, tokens, offsets, lengths, prompts):
    """Each row by itself, plain causal forward, float64 log-softmax: [B, T]."""
    out = torch.zeros(len(lengths), T, dtype=torch.float64)
    for i, (o, n, p) in enumerate(zip(offsets, lengths, prompts)):
        row = tokens[o : o + n]
        logits = model(input_ids=row[None]).logits[0].double()
        out[i, : n - p] = torch.log_softmax(logits[p - 1 : -1], -1).gather(-1, row[p:, None]).squeeze(-1)
    return out


def loss_and_grads(model, packed, offsets, prompts):
    """The loss on the packed micro-batch's flat tokens (each with its row), and the gradients: (log-probs on the
    rows' [B, T] grid, loss, gradients)."""
    model.zero_grad(set_to_none=True)
    B = len(offsets)
    g = torch.Generator().manual_seed(3)
    adv, ref, old = torch.randn(B, generator=g), -torch.rand(B, T, generator=g) * 3, -torch.rand(B, T, generator=g) * 3
    logp, entropy = packed_logprobs(model, packed, LogProbRequest(T, with_entropy=True, entropy_grad=True))
    row, col = scored_cells(packed, offsets, prompts)
    loss, _ = policy_loss(
        LossInputs(
            logp,
            old[row, col],
            adv[row],
            torch.ones_like(logp),
            row,
            num_segments=B,
            clip_eps=0.2,
            beta=0.04,
            ref_logp=ref[row, col],
            kl_estimator="k3",
            entropy=entropy,
            entropy_coef=0.01,
        )
    )
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters() if p.requires_grad]
    return on_grid(logp.detach(), row, col, (B, T)), loss.detach(), grads


def lora(attn: str):
    from grpo_cli.config import LoraConfig
    from grpo_cli.models.lora import add_adapter

    model = add_adapter(llama(attn), LoraConfig(r=4))
    for p in model.parameters():  # a non-zero adapter, so its gradients are not trivially alike
        if p.requires_grad:
            torch.nn.init.normal_(p, std=0.05)
    return model


@pytest.mark.parametrize(
    "attn, adapter, pair_cost",
    [("sdpa", False, 0.0), ("eager", False, 0.0), ("sdpa", True, 0.0), ("sdpa", False, 1e-3), ("eager", False, 1e-3)],
)
def test_shared_prompts_give_the_plain_forwards_log_probs_loss_and_gradients_in_fp32(
    attn, adapter, pair_cost, monkeypatch
):
    """With pair_cost, bins grow past the longest row or unit (packer.fill_bins; these rows are short, so the
    length it grows from is lowered)."""
    from grpo_cli.models import packer

    monkeypatch.setattr(packer, "GROW_FROM", 1)
    model = lora(attn) if adapter else llama(attn)
    tokens, offsets, lengths, prompts = rollout()
    (mb,) = pack(lengths, layout="bins", batch_rows=len(lengths), pair_cost=pair_cost)
    plain = packed_inputs(tokens, offsets, lengths, prompts, mb)
    shared = shared_inputs(tokens, offsets, lengths, prompts, mb, pair_cost=pair_cost)
    if pair_cost:  # bins longer than the longest row (12 tokens) and unit (5 + 18), with less filler
        assert plain.input_ids.shape[1] > max(lengths) and shared.input_ids.shape[1] > 23
        assert plain.input_ids.numel() < 7 * 12 and shared.input_ids.numel() < 3 * 23
    # each prompt once: 13 prompt tokens instead of 5*4 + 1*2 + 3 + 4*3 = 37
    assert shared.real_tokens == plain.real_tokens - (37 - 13) and shared.mask is not None
    scored = lambda p: sorted(zip(p.index.tolist(), p.targets.tolist()))  # in any order
    assert scored(shared) == scored(plain)
    logp_a, loss_a, grads_a = loss_and_grads(model, plain, offsets, prompts)
    logp_b, loss_b, grads_b = loss_and_grads(model, shared, offsets, prompts)
    reference = alone(model, tokens, offsets, lengths, prompts)
    with torch.no_grad():
        assert torch.allclose(logp_b.double(), reference, atol=1e-5, rtol=0)
    assert torch.allclose(logp_a, logp_b, atol=1e-5, rtol=0)
    assert abs(float(loss_a - loss_b)) <= 1e-5
    assert max((a - b).abs().max().item() for a, b in zip(grads_a, grads_b)) <= 1e-5
    assert any(a.abs().max() > 1e-3 for a in grads_a)  # the gradients compared are not all zero


def test_the_tree_mask_lets_a_completion_see_its_prompt_and_itself_only():
    """By hand: unit 0 = prompt (2 tokens), branch 1 (2 tokens), branch 2 (1 token); then a filler position."""
    unit = torch.tensor([[0, 0, 0, 0, 0, -6]])
    branch = torch.tensor([[0, 0, 1, 1, 2, 0]])
    expected = torch.tensor(
        [
            [1, 0, 0, 0, 0, 0],
            [1, 1, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0],
            [1, 1, 1, 1, 0, 0],
            [1, 1, 0, 0, 1, 0],
            [0, 0, 0, 0, 0, 1],
        ],
        dtype=torch.bool,
    )
    assert torch.equal(tree_mask(unit, branch)[0, 0], expected)


def test_a_run_with_shared_prompts_logs_the_plain_runs_rows_and_computes_fewer_tokens(tmp_path):
    """The default task, 3 steps, shared prompts on and off: the same samples and rewards (the weights stay within
    float rounding, so the sampling does not drift), losses within 1e-6; each prompt computed once (16 prompts a
    step here, G = 4), and the update's floor counts the tokens computed."""
    from grpo_cli.run.floors import floor_seconds
    from helpers import grpo, metric_rows

    common = [
        "trainer.steps=3",
        "trainer.prompts_per_step=16",
        "sampler.group_size=4",
        "trainer.eval_before_after=false",
        "trainer.progress=false",
        "trainer.threads=1",
    ]
    rows = {}
    for shared in ("true", "false"):
        assert grpo("train", f"output_dir={tmp_path / shared}", f"trainer.shared_prompts={shared}", *common) == 0
        rows[shared] = metric_rows(tmp_path / shared, timing=False)
    for a, b in zip(rows["true"], rows["false"]):
        assert a["reward_mean"] == b["reward_mean"] and a["completion_tokens"] == b["completion_tokens"]
        assert abs(a["loss"] - b["loss"]) <= 1e-6 and abs(a["kl"] - b["kl"]) <= 1e-6
        assert "forward_tokens" not in b
        prompt_once = a["prompt_tokens"] // 4  # every prompt of the default task is its group's alone
        assert a["forward_tokens"] == prompt_once + a["completion_tokens"]
        floors = [floor_seconds([r], 1000, 0, 1, 1, 1, 1)["update"] for r in (a, b)]
        assert floors[0] == 6000 * a["forward_tokens"] and floors[1] == 6000 * (
            b["prompt_tokens"] + b["completion_tokens"]
        )


def test_rows_share_their_prompt_while_it_saves_more_than_the_longer_units_attention_costs():
    """By hand, pair_cost 0.01, prompts of 10 tokens: a completion of 5 joins a unit of 15 (0.01 * (2 * 15 * 5 + 25)
    = 1.75 <= 10 + 0.01 * 15 ** 2); one of 100 joins neither a unit of 20 (0.01 * (4000 + 10000) = 140 > 10 + 121)
    nor one of 110 (320 > 131)."""
    from grpo_cli.models.packer import share_units

    prompts = [("a",), ("a",), ("a",), ("b",), ("a",)]
    lengths, prompt_lengths = [15, 15, 15, 110, 110], [10, 10, 10, 10, 10]
    rows = list(range(5))
    assert share_units(rows, lengths, prompt_lengths, prompts, pair_cost=0.01) == [[0, 1, 2], [3], [4]]
    assert share_units(rows, [15, 15, 110, 110, 110], prompt_lengths, [("a",)] * 5, pair_cost=0.01) == [
        [0, 1],
        [2],
        [3],
        [4],
    ]
    assert share_units(rows, [15, 15, 110, 110, 110], prompt_lengths, [("a",)] * 5) == [[0, 1, 2, 3, 4]]
    assert share_units([0, 1], [3, 3], [0, 0], [(), ()]) == [[0], [1]]  # no prompt token: nothing to share


def test_a_micro_batch_where_no_prompt_is_shared_is_laid_as_plain_bins():
    """Two rows of one 1-token prompt and 6-token completions, attention dear (pair_cost 1): together, 1 * (2 * 7 * 6
    + 36) = 120 > 1 + 49, so each is laid alone, as packed_inputs lays them, with no mask."""
    tokens = torch.tensor([5, 1, 2, 3, 4, 6, 7, 5, 8, 9, 10, 11, 12, 13])
    offsets, lengths, prompts = [0, 7], [7, 7], [1, 1]
    (mb,) = pack(lengths, layout="bins", batch_rows=2)
    plain = packed_inputs(tokens, offsets, lengths, prompts, mb)
    alone = shared_inputs(tokens, offsets, lengths, prompts, mb, pair_cost=1.0)
    assert (
        alone.mask is None and torch.equal(alone.input_ids, plain.input_ids) and torch.equal(alone.states, plain.states)
    )
    assert shared_inputs(tokens, offsets, lengths, prompts, mb).real_tokens == 13  # cheap attention: shared
