"""scripts/bench_dispatch.py's summary of stored against measured speed-ups, by kind of record: the rows are
what its GPU run writes (no GPU here: the rows are made up, the summary is the script's own code)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _script():
    spec = importlib.util.spec_from_file_location("bench_dispatch_script", ROOT / "scripts" / "bench_dispatch.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _row(torch_ms: float, config: str, measured: float, stored: float | None) -> dict:
    side = dict(cublas_ms=torch_ms, ours_ms=torch_ms / measured, speedup=measured, config=config, source="shipped")
    if stored is not None:
        side["stored_speedup"] = stored
    return {"problem": "fp16:nt:1x2048x2048", "eager": side, "graph": dict(side)}


def test_drift_by_kind_splits_host_bound_from_gpu_bound_and_cublas_from_triton() -> None:
    script = _script()
    cublas, tiled = "VARIANT: cublas, num_warps: 4, num_stages: 3", "GROUP_SIZE_M: 8, VARIANT: tiled, BLOCK_M: 16"
    rows = [_row(0.012, cublas, 1.00, 1.00), _row(0.012, cublas, 0.95, 1.00),  # host-bound cuBLAS: one off
            _row(0.020, tiled, 1.00, 1.20), _row(0.200, tiled, 1.10, 1.11),  # host-bound Triton off; GPU-bound holds
            _row(0.500, cublas, 1.00, 1.00), _row(0.012, cublas, 1.00, None)]  # no stored figure: not counted
    assert script.drift_by_kind(rows, "eager") == {
        "gpu-bound cublas": {"count": 1, "within_3pct": 1}, "gpu-bound triton": {"count": 1, "within_3pct": 1},
        "host-bound cublas": {"count": 2, "within_3pct": 1}, "host-bound triton": {"count": 1, "within_3pct": 0}}
    assert set(script.drift_by_kind(rows, "graph")) == {"gpu-bound cublas", "gpu-bound triton"}, "no host in a graph"


def test_median_pass_keeps_each_modes_middle_pass_with_every_reading_beside_it() -> None:
    """--passes N: per mode, the pass of median speed-up (lower middle of an even count) with its own times."""
    script = _script()
    cublas = "VARIANT: cublas, num_warps: 4, num_stages: 3"
    passes = [_row(0.015, cublas, 1.00, None), _row(0.012, cublas, 1.10, None), _row(0.020, cublas, 0.90, None)]
    passes[2]["graph"] = dict(passes[2]["graph"], speedup=1.5)
    row = script.median_pass(passes, ["eager", "graph"])
    assert row["eager"]["speedup"] == 1.00 and row["eager"]["cublas_ms"] == 0.015, "the first pass: the median"
    assert row["eager"]["passes"] == [1.00, 1.10, 0.90]
    assert row["graph"]["speedup"] == 1.10 and row["graph"]["passes"] == [1.00, 1.10, 1.5]
    assert script.median_pass(passes[1:], ["eager"])["eager"]["speedup"] == 0.90, "the lower middle of two"


def test_by_part_reports_the_tuned_and_held_out_parts_each_on_its_own() -> None:
    """--corpus all: each part's geomean, count under 0.97x and worst, from the corpus's own split."""
    script = _script()
    parts = script.corpus_parts("matmul", qkv=True)
    tuned = [key for key, part in parts.items() if part == "tuned"][:2]
    held = [key for key, part in parts.items() if part == "held_out"][:2]
    assert len(parts) == 56 and len(tuned) == len(held) == 2
    rows = []
    for key, measured in zip(tuned + held + ["fp16:nt:1x4096x4096"], (1.21, 1.00, 0.95, 1.00, 0.5)):
        row = _row(0.02, "VARIANT: cublas", measured, None)
        row["problem"] = key
        rows.append(row)
    got = script.by_part(rows, "graph", parts)
    assert got["tuned"]["problems"] == 2 and abs(got["tuned"]["geomean"] - 1.21 ** 0.5) < 1e-9
    assert got["tuned"]["under_097"] == 0
    assert got["held_out"] == dict(problems=2, geomean=0.95 ** 0.5, under_097=1, worst=(held[0], 0.95))


def test_the_matmul_bias_corpus_parts_and_calls_are_the_biased_qkv_against_torch_addmm() -> None:
    """--kernel matmul_bias: the parts come from the biased q/k/v corpus, and torch's side is torch.addmm."""
    import torch

    script = _script()
    parts = script.corpus_parts("matmul_bias", qkv=False)
    assert len(parts) == 28 and set(parts.values()) == {"tuned", "held_out"}
    ours, theirs = script.CALLS["matmul_bias"]
    a, b, bias = torch.randn(3, 4), torch.randn(4, 5), torch.randn(5)
    torch.testing.assert_close(theirs(a, b, bias), a @ b + bias)



def test_the_gated_call_is_a_torch_mlps_gate_and_up_linears_and_its_parts_the_gated_mlps() -> None:
    """--kernel gated_matmul: torch's side is what a torch model runs (two Linears whose weights are the halves
    of the stacked B, silu, the product), equal to the kernel's reference; the parts are the corpus's gated MLPs."""
    import torch

    import kernels

    script = _script()
    parts = script.corpus_parts("gated_matmul", qkv=False)
    assert parts and set(parts.values()) == {"tuned", "held_out"}
    spec = kernels.get_kernel("gated_matmul")
    inputs = spec.make_inputs(kernels.Problem.from_key("gated_matmul", "fp16:nt:3x8x16"), "cpu", 0)
    inputs = tuple(x.float() for x in inputs)
    ours, theirs = script.CALLS["gated_matmul"]
    assert ours is kernels.gated_matmul
    torch.testing.assert_close(theirs(*inputs), spec.reference(inputs))
