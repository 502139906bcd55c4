"""kernels.patch swaps a module only where dispatch runs one of our kernels for its problem (kernels/_evidence.py).

A real SQLite database per test holds what the tuner would have stored for this device: a module whose
problems all went to the baseline (cuBLAS) keeps torch's forward, one with a tuned Triton winner is patched.
On a GPU with no table at all dispatch answers cuBLAS for every dense problem (the untuned rule); on the CPU
machine the interpreter's nearest-record rule answers from these records, so both cases are written here.
"""

from __future__ import annotations

import copy
import logging
import pickle

import pytest
import torch
from _helpers import DEVICE, LlamaMLP, relative_error
from test_dispatch import TILED, make_record
from test_nn import _MetaFeedForward, _Phi3MLP

import kernels
from db import Store
from kernels._evidence import PROBE_ROWS, Evidence
from kernels._record_mode import RECORDER
from kernels._spec import BASELINE, Problem
from kernels.epilogue import GATED_MATMUL
from kernels.gemm import MATMUL

pytestmark = pytest.mark.usefixtures("own_database")

HIDDEN, FFN = 16, 24
# fp32: exact rounding on the CPU; a GPU's Triton and cuBLAS GEMMs take TF32 (about 1e-3 relative error)
TOLERANCE = 1e-4 if torch.device(DEVICE).type == "cpu" else 5e-3


def _gated_triton() -> object:
    """A valid Triton config of the gated kernel (the dense GEMM's TILED is not one of its space)."""
    problem = Problem("gated_matmul", "fp32", "nt", ((16, FFN, HIDDEN),))
    return GATED_MATMUL.default_config(problem, kernels.current_device(torch.device(DEVICE)))


def _store(db_url: str, *records: tuple[str, str, object]) -> None:
    """(kernel, problem key, config) records for this process's device, in both modes (on a GPU a mode with
    no record of its own would take a neighbour's answer), then dispatch reads that database."""
    device = kernels.current_device(torch.device(DEVICE))
    with Store(db_url) as store:
        for kernel, key, config in records:
            for mode in ("eager", "graph"):
                store.put(make_record(device, key, config, kernel=kernel, mode=mode), on_conflict="replace")
    kernels.use_database(db_url, use_shipped=False)


@pytest.fixture(autouse=True)
def fresh_tables():
    yield
    kernels.use_database(None)


def _model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(LlamaMLP(HIDDEN, FFN), torch.nn.Linear(HIDDEN, 8, bias=False)).to(DEVICE)


@pytest.mark.skipif(RECORDER.on, reason="TUNER_RECORD=1 patches every module whatever the evidence")
def test_modules_whose_every_problem_dispatches_to_cublas_keep_torchs_forward(db_url: str, caplog) -> None:
    _store(db_url, ("gated_matmul", f"fp32:nt:16x{FFN}x{HIDDEN}", BASELINE),
           ("matmul", f"fp32:nt:16x{HIDDEN}x{FFN}", BASELINE), ("matmul", f"fp32:nt:16x8x{HIDDEN}", BASELINE))
    model = _model()
    x = torch.randn(5, HIDDEN, device=DEVICE)
    with torch.no_grad():
        want = model(x)
        with caplog.at_level(logging.INFO, logger="kernels.nn"):
            kernels.patch(model)
        got = model(x)
    assert not isinstance(model[0], kernels.nn.FusedMLP)
    assert [type(m) for m in model.modules() if isinstance(m, torch.nn.Linear)] == [torch.nn.Linear] * 4
    assert "4 nn.Linear left on torch's path" in caplog.text
    assert torch.equal(got, want)


@pytest.mark.skipif(RECORDER.on, reason="TUNER_RECORD=1 patches every module whatever the evidence")
def test_a_triton_winner_at_one_row_count_is_evidence_for_its_module_alone(db_url: str) -> None:
    """The MLP's gated product won on Triton at 16 rows (and went to cuBLAS at 4096): the MLP is fused (its
    down projection has its own record, cuBLAS: it stays torch's), and the head, with cuBLAS everywhere,
    keeps torch's forward."""
    _store(db_url, ("gated_matmul", f"fp32:nt:16x{FFN}x{HIDDEN}", _gated_triton()),
           ("gated_matmul", f"fp32:nt:4096x{FFN}x{HIDDEN}", BASELINE),
           ("matmul", f"fp32:nt:16x{HIDDEN}x{FFN}", BASELINE), ("matmul", f"fp32:nt:16x8x{HIDDEN}", BASELINE))
    model = _model()
    x = torch.randn(5, HIDDEN, device=DEVICE)
    with torch.no_grad():
        want = model(x)
        kernels.patch(model)
        got = model(x)
    assert isinstance(model[0], kernels.nn.FusedMLP)
    assert type(model[0].down_proj) is torch.nn.Linear and type(model[1]) is torch.nn.Linear
    assert relative_error(got, want) < TOLERANCE


def test_evidence_asks_dispatch_once_per_shape_at_every_probed_row_count(db_url: str, monkeypatch) -> None:
    _store(db_url, ("matmul", f"fp32:nt:16x{HIDDEN}x{FFN}", BASELINE))
    asked = []
    choose = kernels.dispatch.DISPATCHER.choose
    monkeypatch.setattr(kernels.dispatch.DISPATCHER, "choose",
                        lambda spec, problem, *rest: asked.append(problem.shapes[0][0]) or choose(spec, problem, *rest))
    evidence = Evidence()
    weight = torch.empty(HIDDEN, FFN, device=DEVICE)
    for _ in range(3):  # a model's layers repeat their shapes
        assert evidence.runs_a_kernel(MATMUL, HIDDEN, FFN, weight) is RECORDER.on
    assert sorted(set(asked)) == ([] if RECORDER.on else sorted(PROBE_ROWS)) and len(asked) == len(set(asked)) * 2
    # float64: the kernels do not take it, torch runs such a layer anyway
    assert not evidence.runs_a_kernel(GATED_MATMUL, FFN, HIDDEN, weight.double()) or RECORDER.on


@pytest.mark.skipif(RECORDER.on, reason="TUNER_RECORD=1 takes our path on every call, to count it")
def test_a_patched_linear_runs_torchs_forward_at_row_counts_dispatch_gives_to_cublas(db_url: str,
                                                                                      monkeypatch) -> None:
    """Patched for its Triton winner at 16 rows; at 4096 rows its record says cuBLAS: torch's own linear runs
    there (less host time around the same GEMM), and ours at 16 rows. A new table is asked again."""
    _store(db_url, ("matmul", f"fp32:nt:16x8x{HIDDEN}", TILED), ("matmul", f"fp32:nt:4096x8x{HIDDEN}", BASELINE))
    linear = torch.nn.Linear(HIDDEN, 8, bias=False).to(DEVICE)
    kernels.patch(linear)
    assert type(linear) is kernels.nn.Linear
    torch_calls = []
    monkeypatch.setattr(kernels.nn, "_LINEAR", lambda *args: torch_calls.append(args[0].shape) or
                        torch.nn.functional.linear(*args))
    with torch.no_grad():
        for rows in (16, 4096, 16, 4096):
            x = torch.randn(rows, HIDDEN, device=DEVICE)
            assert relative_error(linear(x), x @ linear.weight.t()) < TOLERANCE
    assert torch_calls == [(4096, HIDDEN)] * 2
    _store(db_url, ("matmul", f"fp32:nt:4096x8x{HIDDEN}", TILED))  # tuned since: use_database forgets the routes
    with torch.no_grad():
        linear(torch.randn(4096, HIDDEN, device=DEVICE))
    assert len(torch_calls) == 2


@pytest.mark.skipif(RECORDER.on, reason="TUNER_RECORD=1 takes our path on every call, to count it")
@pytest.mark.parametrize("make", [LlamaMLP, _MetaFeedForward, _Phi3MLP], ids=["gate_proj-up_proj", "w1-w3",
                                                                               "gate_up_proj"])
def test_a_fused_mlp_runs_torchs_calls_where_its_gated_product_goes_to_cublas(db_url: str, monkeypatch,
                                                                              make) -> None:
    """At 4096 rows the gated product's record says cuBLAS: the MLP runs what its own forward runs, torch's
    F.linear for gate and up, SiLU, the product, then its down Linear, bit for bit vanilla's (gradients too),
    without calling the gate and up modules (their calls are host time); at 16 rows the fused kernel."""
    gate_width = 2 * FFN if make is _Phi3MLP else FFN
    _store(db_url, ("gated_matmul", f"fp32:nt:16x{FFN}x{HIDDEN}", _gated_triton()),
           ("gated_matmul", f"fp32:nt:4096x{FFN}x{HIDDEN}", BASELINE),
           # the gate (and up) Linear alone: Triton at 16 rows (so it is patched), cuBLAS at 4096
           ("matmul", f"fp32:nt:16x{gate_width}x{HIDDEN}", TILED),
           ("matmul", f"fp32:nt:4096x{gate_width}x{HIDDEN}", BASELINE))
    torch.manual_seed(0)
    mlp = make(HIDDEN, FFN).to(DEVICE)
    plain = make(HIDDEN, FFN).to(DEVICE)
    plain.load_state_dict(mlp.state_dict())
    kernels.patch(mlp)
    gate = next(iter(mlp.children()))
    assert isinstance(mlp, kernels.nn.FusedMLP) and type(gate) is kernels.nn.Linear
    linears = []
    monkeypatch.setattr(kernels.nn, "_LINEAR", lambda *args: linears.append((args[0].shape[0], args[1].shape)) or
                        torch.nn.functional.linear(*args))
    gate_calls = []
    hook = gate.register_forward_pre_hook(lambda module, args: gate_calls.append(args[0].shape[0]))
    x = torch.randn(4096, HIDDEN, device=DEVICE)
    with torch.no_grad():
        assert torch.equal(mlp(x), plain(x))  # a hooked gate: the module's own forward, the hook sees its call
        assert gate_calls == [4096] and (4096, gate.weight.shape) in linears  # its Linear's own torch path
        linears.clear()
        hook.remove()
        for rows in (16, 4096):
            x = torch.randn(rows, HIDDEN, device=DEVICE)
            got = mlp(x)
            if rows == 4096:
                assert torch.equal(got, plain(x))
            else:
                assert relative_error(got, plain(x)) < TOLERANCE
    gate_linears = [(4096, gate.weight.shape)] * (1 if make is _Phi3MLP else 2)  # gate and up, or gate_up
    assert [call for call in linears if call[1] == gate.weight.shape] == gate_linears
    assert gate_calls == [4096]  # no module call of the gate since
    mlp(x).square().sum().backward()  # with a gradient: the same calls, autograd through the Parameters
    plain(x).square().sum().backward()
    for (name, got), want in zip(mlp.named_parameters(), plain.parameters()):
        assert torch.equal(got.grad, want.grad), name


@pytest.mark.skipif(RECORDER.on, reason="TUNER_RECORD=1 takes our path on every call, to count it")
def test_a_fused_mlp_whose_gate_linear_takes_our_kernel_runs_its_own_forward_there(db_url: str, monkeypatch) -> None:
    """The gated product goes to cuBLAS at 4096 rows, but the gate and up problem has a Triton record there:
    their patched Linears run it (their own evidence), so the MLP runs its own forward, module by module."""
    _store(db_url, ("gated_matmul", f"fp32:nt:16x{FFN}x{HIDDEN}", _gated_triton()),
           ("gated_matmul", f"fp32:nt:4096x{FFN}x{HIDDEN}", BASELINE),
           ("matmul", f"fp32:nt:4096x{FFN}x{HIDDEN}", TILED))
    mlp = LlamaMLP(HIDDEN, FFN).to(DEVICE)
    plain = LlamaMLP(HIDDEN, FFN).to(DEVICE)
    plain.load_state_dict(mlp.state_dict())
    kernels.patch(mlp)
    assert isinstance(mlp, kernels.nn.FusedMLP) and type(mlp.gate_proj) is kernels.nn.Linear
    own = []
    monkeypatch.setattr(type(mlp), "_unfused", type("Spy", (LlamaMLP,), {
        "forward": lambda self, x: own.append(x.shape[0]) or LlamaMLP.forward(self, x)}))
    with torch.no_grad():
        for rows in (16, 4096):
            x = torch.randn(rows, HIDDEN, device=DEVICE)
            assert relative_error(mlp(x), plain(x)) < TOLERANCE
    assert own == [4096]


class _Attention(torch.nn.Module):
    """The projections of an attention module, called on one input (kernels.nn.SharedInput fuses them)."""

    def __init__(self) -> None:
        super().__init__()
        self.q_proj = torch.nn.Linear(HIDDEN, 16, bias=False)
        self.k_proj = torch.nn.Linear(HIDDEN, 8, bias=False)
        self.v_proj = torch.nn.Linear(HIDDEN, 8, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.q_proj(x), self.k_proj(x), self.v_proj(x)], dim=-1)


@pytest.mark.skipif(RECORDER.on, reason="TUNER_RECORD=1 takes our path on every call, to count it")
def test_query_key_value_projections_run_torchs_linears_where_their_stacked_gemm_goes_to_cublas(
        db_url: str, monkeypatch) -> None:
    _store(db_url, ("matmul", f"fp32:nt:16x32x{HIDDEN}", TILED), ("matmul", f"fp32:nt:4096x32x{HIDDEN}", BASELINE))
    attention = _Attention().to(DEVICE)
    plain = _Attention().to(DEVICE)
    plain.load_state_dict(attention.state_dict())
    kernels.patch(attention)
    assert type(attention.k_proj) is kernels.nn.SharedInputLinear
    torch_calls = []
    monkeypatch.setattr(kernels.nn, "_LINEAR", lambda *args: torch_calls.append(args[1].shape[0]) or
                        torch.nn.functional.linear(*args))
    with torch.no_grad():
        for rows in (16, 4096):
            x = torch.randn(rows, HIDDEN, device=DEVICE)
            assert relative_error(attention(x), plain(x)) < TOLERANCE
    assert torch_calls == [16, 8, 8]  # the 4096-row call's three projections, each its own torch linear


@pytest.mark.skipif(RECORDER.on, reason="TUNER_RECORD=1 patches every module whatever the evidence")
def test_query_key_value_projections_stay_torchs_with_no_triton_evidence_for_their_stacked_gemm(db_url: str) -> None:
    _store(db_url, ("matmul", f"fp32:nt:16x32x{HIDDEN}", BASELINE), ("matmul", f"fp32:nt:16x16x{HIDDEN}", BASELINE),
           ("matmul", f"fp32:nt:16x8x{HIDDEN}", BASELINE))
    attention = _Attention().to(DEVICE)
    kernels.patch(attention)
    assert [type(m) for m in attention.children()] == [torch.nn.Linear] * 3


@pytest.mark.skipif(RECORDER.on, reason="TUNER_RECORD=1 takes our path on every call, to count it")
def test_a_pickled_or_copied_patched_module_keeps_routing_as_the_original(db_url: str, monkeypatch) -> None:
    """A route is named by (kernel, N, K), not by a number of this process: a module loaded from a pickle (as
    torch.save writes it) or deep-copied gets this process's route back, and routes its calls as before."""
    _store(db_url, ("matmul", f"fp32:nt:16x8x{HIDDEN}", TILED), ("matmul", f"fp32:nt:4096x8x{HIDDEN}", BASELINE))
    linear = kernels.patch(torch.nn.Linear(HIDDEN, 8, bias=False).to(DEVICE))
    torch_calls = []
    monkeypatch.setattr(kernels.nn, "_LINEAR", lambda *args: torch_calls.append(args[0].shape[0]) or
                        torch.nn.functional.linear(*args))
    for other in (pickle.loads(pickle.dumps(linear)), copy.deepcopy(linear)):
        assert other.__dict__["_route"] is linear.__dict__["_route"]
        with torch.no_grad():
            for rows in (16, 4096):
                x = torch.randn(rows, HIDDEN, device=DEVICE)
                assert relative_error(other(x), x @ linear.weight.t()) < TOLERANCE
    assert torch_calls == [4096, 4096]


@pytest.mark.skipif(RECORDER.on, reason="TUNER_RECORD=1 keeps no route answers")
def test_route_answers_start_again_past_their_capacity(db_url: str, monkeypatch) -> None:
    """Prompts of ever-new lengths: the kept answers stay under their capacity, and are right after a restart."""
    _store(db_url, ("matmul", f"fp32:nt:16x8x{HIDDEN}", TILED), ("matmul", f"fp32:nt:4096x8x{HIDDEN}", BASELINE))
    monkeypatch.setattr(kernels._evidence._ROUTES, "capacity", 4)
    route = kernels._evidence.route_of(MATMUL, 8, HIDDEN)
    answers = [kernels._evidence.takes_ours(route, torch.empty(rows, HIDDEN, device=DEVICE))
               for rows in (16, 4096, 15, 17, 4095, 16, 4096)]
    assert len(kernels._evidence._ROUTES) <= 4
    assert answers[0] and answers[5] and not answers[1] and not answers[6]
