"""The fused MoE gate/up product (``moe_gated_matmul``): correctness at the edges, its check, dispatch, record mode.

Runs under Triton's interpreter on a CPU (fp16: the interpreter's bf16 dot is wrong, GPU.md) or compiled on a
GPU, where bf16 runs too. Dispatch tests read a real SQLite file.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
import torch

import kernels
from db import Store
from kernels import moe, moe_gated
from kernels._check import check_config
from kernels._device import interpreter_enabled
from kernels._record_mode import RECORDER
from kernels._spec import BASELINE, Config, DeviceInfo, Problem
from kernels.moe_gated import MOE_GATED_MATMUL, moe_gated_matmul_with

from test_dispatch import make_record  # tests/kernels_tests is on sys.path (rootdir-relative imports)

DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_enabled() else "cpu"
ON_GPU = DEVICE == "cuda"
# Relative L2 error of the output against the float32 reference: fp16 measures ~3e-4 under the interpreter;
# bf16 keeps 8 bits where fp16 keeps 11.
TOLERANCE = {"fp16": 1e-2, "bf16": 3e-2}
DTYPES = ["fp16", "bf16"] if ON_GPU else ["fp16"]  # the interpreter's bf16 tl.dot is wrong (GPU.md)

# Skewed, with empty experts first, in the middle and last, and a one-row expert; N=24 and K=40 no tile multiples.
SKEWED = (0, 17, 1, 0, 22, 0)
TILES = (
    Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, NUM_SM=4, num_warps=2, num_stages=2),  # programs loop
    Config.make(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, NUM_SM=16, num_warps=4, num_stages=3),  # programs idle
)


def _problem(rows=SKEWED, n: int = 24, k: int = 40, layout: str = "nt", dtype: str = "fp16") -> Problem:
    return Problem("moe_gated_matmul", dtype, layout, tuple((m, n, k) for m in rows))


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float().cpu() - ref.float().cpu()).norm() / ref.float().cpu().norm().clamp_min(1e-6))


def _unfused(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
    """What the fused kernel replaces, in float32 torch: the experts' gate/up product, then chunk, silu, multiply."""
    out = torch.zeros((x.shape[0], w.shape[2] // 2))
    start = 0
    for e, end in enumerate(offsets.tolist()):
        gate, up = (x[start:end].float().cpu() @ w[e].float().cpu()).chunk(2, dim=-1)
        out[start:end] = torch.nn.functional.silu(gate) * up
        start = end
    return out


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("layout", ["nn", "nt"])
@pytest.mark.parametrize("config", TILES, ids=str)
def test_fused_product_matches_torch_with_empty_and_single_row_experts(dtype: str, layout: str,
                                                                        config: Config) -> None:
    x, w, offsets, _ = MOE_GATED_MATMUL.make_inputs(_problem(layout=layout, dtype=dtype), DEVICE, 0)
    offsets = torch.tensor(SKEWED, device=DEVICE).cumsum(0).to(torch.int32)
    out = moe_gated_matmul_with(config, x, w, offsets)
    assert out.shape == (40, 24) and out.dtype == x.dtype
    assert _error(out, _unfused(x, w, offsets)) <= TOLERANCE[dtype]
    assert _error(MOE_GATED_MATMUL.baseline((x, w, offsets)), _unfused(x, w, offsets)) <= TOLERANCE[dtype]


def test_gate_columns_come_first_as_transformers_stacks_gate_up_proj() -> None:
    """w = gate_up_proj.transpose(1, 2) of an experts module [E, 2N, K]: rows 0..N the gate, as
    ``_default_apply_gate``'s ``chunk(2)`` reads them; a model whose up rows were zero gives zero."""
    x, w, offsets, _ = MOE_GATED_MATMUL.make_inputs(_problem(rows=(6, 6)), DEVICE, 1)
    w_up_zero = w.clone()
    w_up_zero[:, :, 24:] = 0
    assert float(moe_gated_matmul_with(TILES[0], x, w_up_zero, offsets).abs().max()) == 0.0
    w_gate_zero = w.clone()
    w_gate_zero[:, :, :24] = 0  # silu(0) = 0 as well: zero, whatever up is
    assert float(moe_gated_matmul_with(TILES[0], x, w_gate_zero, offsets).abs().max()) == 0.0
    assert float(moe_gated_matmul_with(TILES[0], x, w, offsets).abs().max()) > 0.0


def test_offsets_at_the_end_of_their_buffer_and_past_it_are_read_in_place_and_clamped() -> None:
    x, w, _, _ = MOE_GATED_MATMUL.make_inputs(_problem(rows=(8, 8, 8)), DEVICE, 2)
    buffer = torch.tensor([99, 3, 3, 1000], dtype=torch.int32, device=DEVICE)  # expert 2 claims rows past T
    out = moe_gated_matmul_with(TILES[1], x, w, buffer[1:])
    clamped = torch.tensor([3, 3, 24], dtype=torch.int32)
    assert _error(out, _unfused(x, w, clamped)) <= TOLERANCE["fp16"]


def test_the_check_passes_a_valid_config_in_the_hard_split_and_rejects_swapped_gate_and_up() -> None:
    """The search's check (kernels/_check.py) on its check inputs: empty first expert, one-row expert, offsets at
    the end of their buffer, loud edges. The swap mutant lives in tests/tuner_tests/mutants.py too."""
    problem = _problem(rows=(5, 5, 5, 5, 5), n=32, k=64)
    spec = MOE_GATED_MATMUL
    assert check_config(spec, problem, TILES[0], torch.device(DEVICE), 0).ok
    inputs = spec.inputs_for_check(problem, DEVICE, 0)
    x, w, offsets = inputs[:3]
    assert offsets.storage_offset() == 1 and int(offsets[-1]) == x.shape[0]
    swapped = torch.cat([w[:, :, 32:], w[:, :, :32]], dim=2)
    from kernels._check import check_outputs, margin_for

    verdict = check_outputs(moe_gated.run_checked(TILES[0], x, swapped, offsets), spec.reference(inputs), "fp16",
                            64, margin=margin_for("moe_gated_matmul", "fp16"))
    assert not verdict.ok


def test_operands_that_are_no_gated_weight_are_refused_with_the_fix() -> None:
    x = torch.zeros((4, 8), dtype=torch.float16, device=DEVICE)
    offsets = torch.tensor([4], dtype=torch.int32, device=DEVICE)
    with pytest.raises(ValueError, match="2N"):
        kernels.moe_gated_matmul(x, torch.zeros((1, 8, 7), dtype=torch.float16, device=DEVICE), offsets)
    with pytest.raises(ValueError, match="shares one N and one K"):
        MOE_GATED_MATMUL.check_problem(Problem.from_key("moe_gated_matmul", "fp16:nt:4x8x8+4x16x8"))


def test_the_space_keeps_two_accumulators_and_two_weight_tiles_in_bounds() -> None:
    """Tiles moe_matmul's space allows, which the gated tile's second accumulator or weight tile would overflow."""
    problem = _problem(rows=(4096,) * 8, n=1536, k=4096)
    single = Problem("moe_matmul", "fp16", "nt", problem.shapes)
    h100 = DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232448)
    square = Config.make(BLOCK_M=256, BLOCK_N=256, BLOCK_K=64, NUM_SM=132, num_warps=8, num_stages=2)
    deep = Config.make(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, NUM_SM=132, num_warps=8, num_stages=4)
    for config in (square, deep):
        assert moe.SPACE.violation(config, single, h100) is None
    assert "accumulators" in moe_gated.SPACE.violation(square, problem, h100)
    assert "shared memory" in moe_gated.SPACE.violation(deep, problem, h100)
    assert moe_gated.SPACE.violation(MOE_GATED_MATMUL.default_config(problem, h100), problem, h100) is None


# --------------------------------------------------------------------------------------------- dispatch

@pytest.fixture
def db_dispatch(db_url: str):
    kernels.use_database(db_url, use_shipped=False)
    yield db_url
    kernels.use_database(None)


def test_kernels_moe_gated_matmul_runs_the_config_stored_for_its_tokens_experts_n_and_k(db_dispatch,
                                                                                       monkeypatch) -> None:
    device = kernels.current_device(torch.device(DEVICE))
    with Store(db_dispatch) as store:  # tuned on the skewed split; the call below has another
        store.put(make_record(device, _problem().key, TILES[1], kernel="moe_gated_matmul"))
    launched: list[Config] = []
    real = moe_gated.run_checked
    monkeypatch.setattr(moe_gated, "run_checked", lambda config, *args: launched.append(config) or real(config, *args))
    x, w, _, _ = MOE_GATED_MATMUL.make_inputs(_problem(), DEVICE, 3)
    offsets = torch.tensor([5, 5, 20, 30, 30, 40], dtype=torch.int32, device=DEVICE)
    out = kernels.moe_gated_matmul(x, w, offsets)
    assert launched == [TILES[1]]
    assert _error(out, _unfused(x, w, offsets)) <= TOLERANCE["fp16"]
    assert kernels.explain("moe_gated_matmul", moe_gated.balanced_problem("fp16", "nt", 40, 6, 24, 40),
                           device).source == f"nearest:{_problem().key}"


def test_a_pinned_baseline_runs_grouped_mm_or_the_loop_then_torch_gating() -> None:
    x, w, _, _ = MOE_GATED_MATMUL.make_inputs(_problem(), DEVICE, 4)
    offsets = torch.tensor(SKEWED, device=DEVICE).cumsum(0).to(torch.int32)
    with moe_gated.pinning([BASELINE], x, w) as (install,):
        install()
        out = kernels.moe_gated_matmul(x, w, offsets)
    assert _error(out, _unfused(x, w, offsets)) <= TOLERANCE["fp16"]


def test_a_call_that_wants_gradients_takes_the_unfused_operators_and_gets_torch_gradients() -> None:
    x, w, _, _ = MOE_GATED_MATMUL.make_inputs(_problem(rows=(5, 0, 7)), DEVICE, 5)
    offsets = torch.tensor([5, 5, 12], dtype=torch.int32, device=DEVICE)
    leaves = [x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()]
    out = kernels.moe_gated_matmul(*leaves, offsets)
    dy = torch.randn(out.shape, generator=torch.Generator().manual_seed(0)).to(out)
    got = torch.autograd.grad(out, leaves, dy)
    want_leaves = [t.detach().float().cpu().requires_grad_() for t in (x, w)]
    want_out = torch.cat([_gated_rows(want_leaves, e, s, t) for e, (s, t) in enumerate([(0, 5), (5, 5), (5, 12)])])
    want = torch.autograd.grad(want_out, want_leaves, dy.float().cpu())
    for g, r in zip(got, want):
        assert _error(g, r) <= 2e-2


def _gated_rows(leaves: list[torch.Tensor], e: int, start: int, end: int) -> torch.Tensor:
    gate, up = (leaves[0][start:end] @ leaves[1][e]).chunk(2, dim=-1)
    return torch.nn.functional.silu(gate) * up


def test_the_operator_zeroes_unrouted_rows_and_traces_whole_under_torch_compile() -> None:
    x, w, _, _ = MOE_GATED_MATMUL.make_inputs(_problem(rows=(5, 7)), DEVICE, 6)
    offsets = torch.tensor([5, 9], dtype=torch.int32, device=DEVICE)  # rows 9..11 unrouted
    want = _unfused(x, w, offsets)
    eager = kernels.ops.moe_gated_matmul(x, w, offsets)
    assert float(eager[9:].abs().max()) == 0.0 and _error(eager, want) <= TOLERANCE["fp16"]
    compiled = torch.compile(kernels.moe_gated_matmul, fullgraph=True, backend="aot_eager")
    assert _error(compiled(x, w, offsets), want) <= TOLERANCE["fp16"]


@pytest.fixture
def recorder_off():
    if RECORDER.on:
        pytest.skip("TUNER_RECORD=1 records this whole process; this test starts and stops the recorder")
    yield
    while RECORDER.on:
        RECORDER.stop()


@pytest.mark.usefixtures("recorder_off")
def test_record_mode_counts_each_call_of_the_fused_kernel(tmp_path: Path, own_database: None) -> None:
    x, w, offsets, _ = MOE_GATED_MATMUL.make_inputs(_problem(rows=(3, 5)), DEVICE, 7)
    path = tmp_path / "recorded.db"
    with kernels.recording(f"sqlite:///{path}"):
        for _ in range(3):
            kernels.moe_gated_matmul(x, w, offsets)
    with sqlite3.connect(path) as connection:
        rows = connection.execute("select kernel, problem_key, calls from tuner_recorded").fetchall()
    assert rows == [("moe_gated_matmul", "fp16:nt:4x24x40+4x24x40", 3)]  # the balanced split dispatch keys by
