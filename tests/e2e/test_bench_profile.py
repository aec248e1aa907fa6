"""`scripts/bench.py --profile`: every operator of a step is billed to the phase it ran in.

The phases are named profiler ranges that `grpo_step` opens (generation, scoring, update); the
benchmark bills each operator's self time to the range it started in (by time: on CUDA the backward
runs on the autograd engine's own thread, outside the update's range in the call tree). Checked on a
hand-built trace, on made-up events from another thread, and on a real step of the built-in model,
where the update (and only the update) runs backward and the optimizer.
"""

import importlib.util
import sys
from pathlib import Path
from types import SimpleNamespace

import torch
from torch.profiler import record_function

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "bench.py"


def load_bench():
    spec = importlib.util.spec_from_file_location("bench_under_test", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_operators_are_billed_to_the_phase_range_above_them_and_nowhere_else():
    bench = load_bench()
    a = torch.randn(64, 64)
    with torch.profiler.profile() as prof:
        for _ in range(2):  # two "steps": the costs are per step
            torch.mm(a, a)  # outside any phase: billed nowhere
            with record_function("grpo/generation"):
                torch.mm(a, a)
            with record_function("grpo/update"):
                with record_function("inner"):  # a range below a phase is not a phase: its ops stay the phase's
                    torch.sigmoid(a)
                torch.mm(a, a)
    events = prof.events()
    costs = bench.phase_costs(events, steps=2, top=50)
    assert set(costs) == {"generation", "scoring", "update"}
    billed = {phase: {op for op, _ in ops} for phase, ops in costs.items()}
    assert "aten::mm" in billed["generation"] and "aten::sigmoid" not in billed["generation"]
    assert {"aten::mm", "aten::sigmoid", "inner"} <= billed["update"]
    assert costs["scoring"] == []
    # Independently: what a phase holds is its ranges' total time less their own, halved for two steps.
    for phase in ("generation", "update"):
        ranges = [e for e in events if e.name == f"grpo/{phase}"]
        assert len(ranges) == 2
        want = sum(e.cpu_time_total - e.self_cpu_time_total for e in ranges) / 1e3 / 2
        assert abs(sum(ms for _, ms in costs[phase]) - want) < 1e-6 * max(want, 1.0)


def test_an_operator_of_another_thread_is_billed_by_when_it_ran():
    bench = load_bench()

    def event(name, start, end, self_us=0.0):
        return SimpleNamespace(
            name=name, time_range=SimpleNamespace(start=start, end=end), self_cpu_time_total=self_us, cpu_parent=None
        )

    events = [
        event("grpo/generation", 0, 100),
        event("grpo/update", 200, 500),
        event("aten::mm", 10, 20, 4000.0),  # in generation
        event("MmBackward0", 300, 310, 6000.0),
        event("aten::mm", 320, 330, 2000.0),  # backward thread, in update
        event("aten::add", 150, 160, 9000.0),
    ]  # between phases: nowhere
    costs = bench.phase_costs(events, steps=1, top=5)
    assert costs == {
        "generation": [("aten::mm", 4.0)],
        "scoring": [],
        "update": [("MmBackward0", 6.0), ("aten::mm", 2.0)],
    }


def test_a_real_step_bills_backward_and_adamw_to_the_update_only():
    bench = load_bench()
    shape = bench.Shape(prompts=4, group_size=4, max_new_tokens=4, micro_batch=8)
    opts = dict(
        device="cpu",
        precision="fp32",
        lora=0,
        generator="hf",
        beta=0.04,
        warmup=0,
        repeats=1,
        threads=1,
        seed=0,
        profile=200,
    )
    result = bench.bench_model("tiny", shape, opts)
    names = {phase: {op for op, _ in ops} for phase, ops in result["profile"].items()}
    assert "aten::mm" in names["generation"] and "aten::mm" in names["scoring"] and "aten::mm" in names["update"]
    assert any(op.endswith("Backward0") for op in names["update"])
    assert "aten::_fused_adamw_" in names["update"]
    for phase in ("generation", "scoring"):
        assert not any("Backward" in op or "adamw" in op for op in names[phase]), names[phase]
