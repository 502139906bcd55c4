"""Bench: the correctness gate before timing (kernels/_check.py), its verdicts, and relative_error's edge cases."""

from __future__ import annotations

import dataclasses
import math

import pytest
import torch

import kernels
from kernels import BASELINE, CPU, Config, Problem
from kernels.gemm import MATMUL
from tuner.bench import Bench, relative_error

PROBLEM = Problem("matmul", "fp16", "nn", ((16, 32, 64),))
GOOD = Config.from_dict(dict(VARIANT="tiled", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, SPLIT_K=1,
                             NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=2))


class FakeTimer:
    """A test double for bench.gpu_timer: CUDA events cannot time anything on a CPU, and wall-clock
    times under the interpreter are noise. It runs the candidate once, counts calls, returns a fixed time."""

    def __init__(self, ms: float = 1.5) -> None:
        self.ms = ms
        self.calls = 0

    def __call__(self, fn) -> float:
        self.calls += 1
        fn()
        return self.ms


def _torch_spec(run) -> kernels.KernelSpec:
    """The dense GEMM spec with ``run`` swapped in (runs on CPU tensors on any machine)."""
    return dataclasses.replace(MATMUL, run=run)


def _bench(spec, timer=None) -> Bench:
    # CPU inputs keep these tests off Triton: only Bench's own logic is under test.
    return Bench(spec, PROBLEM, CPU, timer=timer or FakeTimer(), seed=0)


# -------------------------------------------------------------------------------------- relative_error

def test_relative_error_of_exact_result_is_zero() -> None:
    ref = torch.randn(4, 5, generator=torch.Generator().manual_seed(0))
    assert relative_error(ref.clone(), ref) == 0.0
    assert relative_error(torch.zeros(0, 5), torch.zeros(0, 5)) == 0.0


def test_relative_error_is_l2_over_all_outputs() -> None:
    ref = torch.ones(2, 2)
    assert relative_error(ref * 1.1, ref) == pytest.approx(0.1)
    assert relative_error([ref, ref * 1.1], [ref, ref]) == pytest.approx(math.sqrt(0.04 / 8))


def test_relative_error_with_nan_is_nan_and_fails_any_tolerance() -> None:
    out = torch.ones(3, 3)
    out[1, 2] = math.nan
    error = relative_error(out, torch.ones(3, 3))
    assert math.isnan(error)


def test_relative_error_of_mismatched_shapes_or_counts_is_infinite() -> None:
    assert relative_error(torch.ones(3, 4), torch.ones(4, 3)) == math.inf
    assert relative_error([torch.ones(2, 2)], [torch.ones(2, 2), torch.ones(2, 2)]) == math.inf


def test_relative_error_against_zero_reference() -> None:
    assert relative_error(torch.ones(2, 2), torch.zeros(2, 2)) == math.inf
    assert relative_error(torch.zeros(2, 2), torch.zeros(2, 2)) == 0.0


# -------------------------------------------------------------------------------------------- measure

def test_invalid_config_is_reported_without_running() -> None:
    ran = []
    timer = FakeTimer()
    bench = _bench(_torch_spec(lambda config, inputs: ran.append(config)), timer)
    too_big = GOOD.replace(BLOCK_M=256)
    measurement = bench.measure(too_big)
    assert measurement.status == "invalid" and "BLOCK_M=256" in measurement.reason
    assert not measurement.ok and measurement.time_ms is None
    assert ran == [] and timer.calls == 0
    outside = bench.measure(GOOD.replace(BLOCK_M=17))
    assert outside.status == "invalid" and "BLOCK_M=17" in outside.reason


def test_correct_config_is_checked_then_timed() -> None:
    timer = FakeTimer(ms=2.25)
    measurement = _bench(_torch_spec(lambda config, inputs: MATMUL.baseline(inputs)), timer).measure(GOOD)
    assert measurement.ok and measurement.time_ms == 2.25 and measurement.eager_ms == 2.25
    assert measurement.rel_error is not None and measurement.rel_error <= 1.0
    assert timer.calls == 2  # graph, then eager: with no eager timer given, the test's timer stands in


def test_real_kernel_passes_the_gate(torch_device) -> None:
    device = kernels.current_device(torch_device)
    measurement = Bench(MATMUL, PROBLEM, device, timer=FakeTimer()).measure(GOOD)
    assert measurement.status == "ok", measurement.reason
    assert measurement.rel_error <= 1.0


@pytest.mark.parametrize("run, expected_error", [
    (lambda config, inputs: torch.zeros(16, 32, dtype=torch.float16), None),
    (lambda config, inputs: MATMUL.baseline(inputs) * 1.01, None),
    (lambda config, inputs: torch.full((16, 32), math.nan, dtype=torch.float16), "is nan"),
    (lambda config, inputs: torch.zeros(32, 16, dtype=torch.float16), "has shape (32, 16)"),
], ids=["zeros", "off-by-1%", "nan", "transposed-shape"])
def test_wrong_result_is_caught_before_timing(run, expected_error: str | None) -> None:
    timer = FakeTimer()
    measurement = _bench(_torch_spec(run), timer).measure(GOOD)
    assert measurement.status == "wrong_result"
    assert measurement.reason.startswith("wrong result: ")
    if expected_error is None:
        assert measurement.rel_error > 1.0 and "its bound" in measurement.reason
    else:
        assert measurement.rel_error == math.inf and expected_error in measurement.reason
    assert timer.calls == 0


def test_exception_in_run_is_an_error_with_its_reason() -> None:
    def run(config, inputs):
        raise RuntimeError("launch failed: grid too large\nsecond line")

    measurement = _bench(_torch_spec(run)).measure(GOOD)
    assert measurement.status == "error"
    assert measurement.reason == "RuntimeError: launch failed: grid too large"


@pytest.mark.interpreter
def test_a_gpu_fault_in_run_ends_the_measurement_with_device_fault() -> None:
    # A fault breaks the process's CUDA context: the search cannot go on in it, so measure raises rather than
    # calling it one candidate's error. The error is PyTorch's text for one (a real fault needs a GPU).
    from tuner.errors import DeviceFault

    def run(config, inputs):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    with pytest.raises(DeviceFault, match="illegal memory access"):
        _bench(_torch_spec(run)).measure(GOOD)


class CompilationError(Exception):
    """Named like triton's, which bench classifies by name (triton's own needs a real compile to raise)."""


@pytest.mark.parametrize("exc", [CompilationError("bad ir"), RuntimeError("out of resource: shared memory")])
def test_compile_failures_are_classified_as_compile_error(exc) -> None:
    def run(config, inputs):
        raise exc

    assert _bench(_torch_spec(run)).measure(GOOD).status == "compile_error"


def test_exception_in_timed_run_is_an_error() -> None:
    calls = []

    def run(config, inputs):
        calls.append(config)
        if len(calls) > 1:  # right when checked, broken when timed
            raise ValueError("flaky")
        return MATMUL.baseline(inputs)

    measurement = _bench(_torch_spec(run)).measure(GOOD)
    assert measurement.status == "error" and "ValueError: flaky" in measurement.reason


def test_each_check_uses_fresh_inputs() -> None:
    seen = []

    def run(config, inputs):
        seen.append(inputs[0].clone())
        return MATMUL.baseline(inputs)

    bench = _bench(_torch_spec(run))
    bench.measure(GOOD)
    bench.measure(GOOD)
    assert len(seen) == 6  # check, graph timing and eager timing, twice
    fresh = [seen[i] for i in (0, 1, 3, 4)]
    assert all(not torch.equal(fresh[0], other) for other in fresh[1:])
    # The eager timing cycles through input sets made once per problem, shared by the candidates.
    assert torch.equal(seen[2], seen[5]) and not torch.equal(seen[2], seen[0])


def test_check_poisons_the_output_it_returned() -> None:
    outputs = []

    def run(config, inputs):
        outputs.append(MATMUL.baseline(inputs))
        return outputs[-1]

    assert _bench(_torch_spec(run)).check(GOOD).ok
    assert torch.isnan(outputs[0]).all(), "a later candidate must not pass on this one's result"


def test_baseline_config_is_measured_with_torch() -> None:
    ran = []
    bench = _bench(_torch_spec(lambda config, inputs: ran.append(config)))
    measurement = bench.measure(BASELINE)
    assert measurement.ok and ran == []
    assert bench.baseline_ms() == 1.5


def test_the_eager_timing_of_a_fused_epilogue_runs_its_public_call(monkeypatch: pytest.MonkeyPatch,
                                                                    torch_device) -> None:
    """tuner/timing.py public_call: kernels.matmul_bias itself, its config forced, as matmul's plans are."""
    from kernels import epilogue
    from tuner import timing

    spec = kernels.get_kernel("matmul_bias")
    problem = kernels.Problem("matmul_bias", "fp32", "nn", ((16, 32, 64),))
    # On the device the kernel launches on: CPU tensors on a machine with a GPU get no interpreter.
    inputs = spec.make_inputs(problem, torch_device, 0)
    config = spec.default_config(problem, kernels.current_device(torch_device)).replace(num_stages=3)
    public = kernels.matmul_bias
    called: list[str] = []
    monkeypatch.setattr(kernels, "matmul_bias", lambda *args: (called.append("public"), public(*args))[1])
    with timing.public_call(spec, config, inputs) as call:
        out = call(inputs)
    # On a GPU the kernel's fp32 dot runs in TF32 (kernels/gemm.py _dot_precision): about 1e-3 off
    # (test_epilogue measured 6.9e-4 relative L2 on the H100), a few times that in the worst element.
    tolerance = 1e-4 if torch_device.type == "cpu" else 1e-2
    assert called == ["public"] and torch.allclose(out, spec.reference(inputs), rtol=tolerance, atol=tolerance)
    key = epilogue._key(spec, inputs[0], inputs[1], kernels.EAGER)
    assert epilogue.DISPATCHER.cached(key) != config, "the pin is gone once the timing is over"


def test_the_eager_timing_of_moe_matmul_runs_its_public_call_with_each_config(monkeypatch: pytest.MonkeyPatch,
                                                                            torch_device) -> None:
    """tuner/timing.py public_calls: kernels.moe_matmul itself, each side's config pinned in turn."""
    from kernels import moe
    from tuner import timing

    spec = kernels.get_kernel("moe_matmul")
    problem = kernels.Problem("moe_matmul", "fp16", "nt", ((24, 32, 32), (8, 32, 32)))
    # On the device the kernel launches on: without the interpreter, moe_matmul sends CPU tensors to torch.
    inputs = spec.make_inputs(problem, torch_device, 0)
    first = spec.default_config(problem, kernels.current_device(torch_device))
    second = first.replace(num_stages=first.num_stages + 1)
    ran: list[Config] = []
    run_checked = moe.run_checked
    monkeypatch.setattr(moe, "run_checked", lambda config, *args: (ran.append(config), run_checked(config, *args))[1])
    with timing.public_calls(spec, [first, second], inputs) as sides:
        for call, install in sides:
            install()
            out = call(inputs)
            assert torch.allclose(out.float(), spec.reference(inputs), rtol=1e-2, atol=1e-2)
    assert ran == [first, second]
    key = moe.dispatch_key(inputs[0], inputs[1], kernels.EAGER)
    assert moe.DISPATCHER.cached(key) is None, "the pins are gone once the timing is over"
