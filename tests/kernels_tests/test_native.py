"""The C++ path of cuBLAS plans (kernels/_native.py, kernels/_native.cpp), built for real with torch's
cpp_extension and run on CPU tensors: the same at::mm call a GPU signature gets. Skipped, with the reason,
where this machine has no C++ compiler or ninja (the Python path then serves every call, as tested
everywhere else)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sysconfig
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

import kernels
from kernels import _modes, _native, _plans

REPO = Path(__file__).resolve().parents[2]

def _cannot_build() -> str | None:
    """Why this machine cannot build the extension, or None."""
    from torch.utils.cpp_extension import is_ninja_available

    if shutil.which("c++") is None:
        return "no C++ compiler (c++)"
    if not is_ninja_available():
        return "no ninja"
    if not (Path(sysconfig.get_paths()["include"]) / "Python.h").exists():
        return "no Python headers (Python.h)"
    return None


pytestmark = pytest.mark.skipif(_cannot_build() is not None,
                                reason=f"{_cannot_build()}: the C++ path cannot be built here (scripts/setup.sh installs "
                                       "what it needs as root; the Python path serves every call)")


@pytest.fixture
def native(tmp_path_factory: pytest.TempPathFactory) -> Iterator[_native._Native]:
    """The extension built (or loaded from torch's build cache) and empty; afterwards, the process back
    to no extension, so that the other tests run the Python path they test."""
    kernels.clear_cache()
    state = _native.start(block=True)
    assert state == "ready", f"the extension did not build: {state}"
    yield _native.NATIVE
    kernels.clear_cache()
    with _native._LOCK:
        _native.NATIVE.module, _native.NATIVE.state, _native.NATIVE.try_mm = None, "idle", None
        _native.NATIVE.try_addmm = _native.NATIVE.try_gated = None
        _native.NATIVE.try_moe = _native.NATIVE.try_moe_gated = None
        _native.NATIVE.pending_addmm.clear()
        _native.NATIVE.pending_epilogue.clear()
        _native.NATIVE.pending_moe.clear()
        _native.NATIVE.suspended = 0
        _native.NATIVE.decided.clear()


def _cublas_signature(a: torch.Tensor, b: torch.Tensor) -> None:
    """What kernels.matmul's first call of a cuBLAS signature leaves: a plan of torch.mm in both modes."""
    _plans.put(_plans.signature(a, b), _plans.ModePlans(_plans._CUBLAS, _plans._CUBLAS))


def test_a_cublas_signature_is_served_by_at_mm_and_nothing_else_is(native) -> None:
    a, b = torch.randn(8, 16), torch.randn(12, 16).t()  # b as nn.Linear keeps it
    assert native.try_mm(a, b) is None, "nothing is served before a plan is put"
    _cublas_signature(a, b)
    assert _native.served() == 1
    c = native.try_mm(a, b)
    torch.testing.assert_close(c, a @ b)
    other = torch.randn(8, 16), torch.randn(16, 12)  # same shapes, other strides: another signature
    assert native.try_mm(*other) is None
    assert native.try_mm(a, b.double()) is None, "b of another dtype is not the signature"
    assert native.try_mm(a, torch.nn.Parameter(b)) is not None, "nn.Parameter is served like a tensor"

    class Sub(torch.Tensor):
        pass

    assert native.try_mm(a.as_subclass(Sub), b) is None, "a subclass keeps its overrides: Python path"
    with torch.overrides.TorchFunctionMode():
        assert native.try_mm(a, b) is None, "a torch function mode sees torch.mm on the Python path"
    assert kernels.matmul(a, b).data_ptr() != 0  # the public call, served here


def test_gradients_and_grad_mode_are_at_mm_s(native) -> None:
    a, b = torch.randn(4, 8, requires_grad=True), torch.randn(6, 8, requires_grad=True)
    _cublas_signature(a, b.t())
    out = native.try_mm(a, b.t())
    assert out.grad_fn is not None
    out.sum().backward()
    torch.testing.assert_close(a.grad, torch.ones(4, 6) @ b.detach())
    with torch.no_grad():
        assert native.try_mm(a, b.t()).grad_fn is None


def test_clear_cache_record_mode_and_pins_decide_what_is_served(native, tmp_path) -> None:
    a, b = torch.randn(8, 16), torch.randn(16, 12)
    _cublas_signature(a, b)
    kernels.clear_cache()
    assert _native.served() == 0 and native.try_mm(a, b) is None
    _cublas_signature(a, b)
    with kernels.recording(f"sqlite:///{tmp_path / 'rec.db'}"):
        assert native.try_mm is None, "record mode counts every call in Python"
    assert native.try_mm is not None
    _cublas_signature(a, b)  # (recording's start and end clear the plans: put it again)
    assert native.try_mm(a, b) is not None
    tiled = kernels.Config.make(BLOCK_M=16, BLOCK_N=16, BLOCK_K=16)
    with _plans.pinned(tiled, a, b):
        assert native.try_mm(a, b) is None, "a pinned Triton plan must run"
    assert native.try_mm(a, b) is not None, "the signature's own cuBLAS plan is back"
    kernels.clear_cache()
    with _plans.pinned(kernels.BASELINE, a, b):
        assert native.try_mm(a, b) is not None, "a pinned cuBLAS plan runs as dispatch will run it: from C++"
    assert native.try_mm(a, b) is None, "and goes with the pin"
    _native.suspend()
    assert native.try_mm is None
    _native.resume()


def test_a_signature_on_cublas_in_eager_mode_alone_is_served_where_the_call_is_eager(native, monkeypatch) -> None:
    """Its graph plan is a Triton kernel: the C++ path serves the call only where kernels.matmul would run
    the eager plan (the thread's forced mode, KERNELS_MODE, then the capture check for CUDA tensors)."""

    a, b = torch.randn(8, 16), torch.randn(16, 12)
    _plans.put(_plans.signature(a, b), _plans.ModePlans(_plans._CUBLAS, object()))  # graph mode differs
    assert _native.served() == 1
    torch.testing.assert_close(native.try_mm(a, b), a @ b)  # auto, on the CPU: eager
    with kernels.dispatch_mode(kernels.GRAPH):
        assert native.try_mm(a, b) is None, "forced graph mode: the Python path runs the graph plan"
        with kernels.dispatch_mode(kernels.EAGER):
            assert native.try_mm(a, b) is not None
        with kernels.dispatch_mode("auto"):
            assert native.try_mm(a, b) is not None
    monkeypatch.setattr(_modes, "ENV_MODE", kernels.GRAPH)  # as KERNELS_MODE=graph at import
    assert native.try_mm(a, b) is None
    with kernels.dispatch_mode(kernels.EAGER):
        assert native.try_mm(a, b) is not None, "the thread's forced mode wins over the environment"
    monkeypatch.setattr(_modes, "ENV_MODE", None)
    _plans.put(_plans.signature(a, b), _plans.ModePlans(object(), _plans._CUBLAS))  # Triton eager plan
    assert native.try_mm(a, b) is None and _native.served() == 0, "an eager Triton plan must run"


def test_kernels_native_0_turns_it_off(monkeypatch) -> None:
    monkeypatch.setenv("KERNELS_NATIVE", "0")
    fresh = _native._Native()
    monkeypatch.setattr(_native, "NATIVE", fresh)
    assert _native.start(block=True) == "off" and fresh.try_mm is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_while_the_stream_captures_an_eager_only_signature_is_left_to_the_python_path(native, monkeypatch) -> None:
    a = torch.randn(8, 16, device="cuda", dtype=torch.float16)
    b = torch.randn(16, 12, device="cuda", dtype=torch.float16)
    _plans.put(_plans.signature(a, b), _plans.ModePlans(_plans._CUBLAS, object()))
    asked: list[int] = []
    real_raw_stream = _modes._raw_stream
    monkeypatch.setattr(_modes, "_raw_stream", lambda device: asked.append(device) or real_raw_stream(device))
    assert native.try_mm(a, b) is not None, "eager, on the default stream: served"
    assert asked == [], "the default stream's capture check is answered in C++, not by _modes._capturing"
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # another stream, not capturing: the Python check answers, eager
        assert native.try_mm(a, b) is not None
    assert asked, "on another stream _modes._capturing was asked"
    torch.cuda.synchronize()
    with monkeypatch.context() as patched:  # a stand-in for the capture check is asked even on the default stream
        patched.setattr(_modes, "capturing", lambda: True)
        assert native.try_mm(a, b) is None, "the stand-in says capturing: the graph plan's"
    torch.cuda.synchronize()
    graph, seen = torch.cuda.CUDAGraph(), []
    with torch.cuda.graph(graph):
        seen.append(native.try_mm(a, b))
        a.mul(2)  # something to capture
    assert seen == [None], "capturing: the graph plan's, in Python"


def _lt_cases(dtype: torch.dtype) -> list[tuple[str, torch.Tensor, torch.Tensor, bool]]:
    """(name, a, b, aligned): the layouts the cublasLt plans take, and two that are odd."""
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=dtype)

    misaligned = randn(33 * 64 + 1)[1:].view(33, 64)  # 2 bytes past an allocation: a 2-byte-aligned operand
    return [
        ("nt (nn.Linear's w.t())", randn(33, 64), randn(40, 64).t(), True),
        ("nn", randn(33, 64), randn(64, 40), True),
        ("tn (a column-major)", randn(64, 33).t(), randn(64, 40), True),
        ("a with rows 80 apart", randn(33, 80)[:, :64], randn(40, 64).t(), True),
        ("one row", randn(1, 64), randn(40, 64).t(), True),
        ("one column", randn(33, 64), randn(1, 64).t(), True),
        ("K = 1", randn(33, 1), randn(1, 40), True),
        ("b column-major with columns 72 apart", randn(33, 64), randn(40, 72)[:, :64].t(), True),
        ("a column-major, one row", randn(64, 1).t(), randn(40, 64).t(), True),
        ("thin and deep (split-K, the workspace)", randn(8, 8192), randn(256, 8192).t(), True),
        ("misaligned a", misaligned, randn(40, 64).t(), False),
    ]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_cublas_signature_on_the_gpu_runs_a_kept_cublaslt_plan_with_torch_s_result(native, dtype) -> None:
    for name, a, b, aligned in _lt_cases(dtype):
        _cublas_signature(a, b)
        before, plans = _native.lt_served(), native.module.lt_plans()
        for _ in range(2):
            out = native.try_mm(a, b)
            assert out is not None, name
            torch.testing.assert_close(out, torch.mm(a, b), atol=2e-2, rtol=2e-2, msg=name)
            assert out.shape == (a.shape[0], b.shape[1]) and out.is_contiguous() and out.dtype == dtype
        if aligned:
            assert _native.lt_served() == before + 2, f"{name}: both calls ran the kept cublasLt plan"
            assert native.module.lt_plans() <= plans + 1, f"{name}: at most one plan, made on the first call"
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_what_at_mm_does_more_than_a_gemm_stays_at_mm_s(native) -> None:
    """A gradient to record, another stream, fp32: at::mm serves them, not the cublasLt plan."""
    a = torch.randn(16, 32, device="cuda", dtype=torch.float16, requires_grad=True)
    b = torch.randn(24, 32, device="cuda", dtype=torch.float16).t()
    _cublas_signature(a, b)
    before = _native.lt_served()
    out = native.try_mm(a, b)
    assert out is not None and out.grad_fn is not None, "autograd recorded the product"
    out.float().sum().backward()
    torch.testing.assert_close(a.grad, torch.ones(16, 24, device="cuda", dtype=torch.float16) @ b.t(), atol=1e-2, rtol=1e-2)
    with torch.cuda.stream(torch.cuda.Stream()):
        assert native.try_mm(a.detach(), b) is not None
    torch.cuda.synchronize()
    a32, b32 = torch.randn(16, 32, device="cuda"), torch.randn(32, 24, device="cuda")
    _cublas_signature(a32, b32)
    assert native.try_mm(a32, b32) is not None
    assert _native.lt_served() == before, "none of these went through cublasLt"
    with torch.no_grad():  # no gradient to record: the plan's
        assert native.try_mm(a, b) is not None
    assert _native.lt_served() == before + 1


def _at_mm_serves(native, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    before = _native.lt_served()
    out = native.try_mm(a, b)
    assert out is not None and _native.lt_served() == before, "at::mm served it, not the cublasLt plan"
    return out


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_what_the_dispatcher_does_around_at_mm_keeps_a_call_on_at_mm(native) -> None:
    """Forward-mode AD, a dispatch mode, autocast, deterministic mode and a profiler all see or change aten::mm:
    those calls stay on at::mm, and get what torch.mm gives."""
    import torch.autograd.forward_ad as fwAD
    from torch.utils._python_dispatch import TorchDispatchMode

    a = torch.randn(16, 32, device="cuda", dtype=torch.float16)
    b = torch.randn(24, 32, device="cuda", dtype=torch.float16).t()
    _cublas_signature(a, b)
    tangent = torch.randn_like(a)
    with fwAD.dual_level():
        out = _at_mm_serves(native, fwAD.make_dual(a, tangent), b)
        torch.testing.assert_close(fwAD.unpack_dual(out).tangent, tangent @ b, atol=1e-2, rtol=1e-2)

    class Seen(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.ops: list[str] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    with Seen() as seen:
        _at_mm_serves(native, a, b)
    assert "aten.mm.default" in seen.ops
    bf16_a, bf16_b = a.bfloat16(), b.bfloat16()
    _cublas_signature(bf16_a, bf16_b)
    with torch.autocast("cuda", dtype=torch.float16):
        assert _at_mm_serves(native, bf16_a, bf16_b).dtype == torch.float16, "autocast cast it, as torch.mm"
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True, warn_only=True)
    try:
        _at_mm_serves(native, a, b)
    finally:
        torch.use_deterministic_algorithms(previous)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profile:
        _at_mm_serves(native, a, b)
    assert any(event.name == "aten::mm" for event in profile.events())
    before = _native.lt_served()
    native.try_mm(a, b)
    assert _native.lt_served() == before + 1, "none of those left a mark: the plan serves again"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_with_nothing_tuned_gpu_calls_run_the_cublaslt_plan_once_the_cpp_path_is_ready(native, tmp_path) -> None:
    """A GPU with no table: torch.mm from the first call while the C++ path builds; once it is ready, each
    signature's first call puts its cuBLAS plan and the calls after it run the kept cublasLt plan."""
    kernels.use_database(f"sqlite:///{tmp_path / 'none.db'}", use_shipped=False)
    try:
        a = torch.randn(8, 64, device="cuda", dtype=torch.float16)
        b = torch.randn(32, 64, device="cuda", dtype=torch.float16).t()
        kernels.matmul(a, b)
        assert _plans.FAST.cublas_everywhere is True, "nothing tuned for any GPU here"
        assert _plans.get(_plans.signature(a, b)) is not None, "the C++ path is ready: the call put a plan"
        before = _native.lt_served()
        out = kernels.matmul(a, b)
        assert _native.lt_served() == before + 1
        torch.testing.assert_close(out, torch.mm(a, b), atol=2e-2, rtol=2e-2)
        cpu_a, cpu_b = a.cpu().float(), b.cpu().float()
        kernels.matmul(cpu_a, cpu_b)
        assert _plans.get(_plans.signature(cpu_a, cpu_b)) is None, "CPU operands: torch.mm at once, no plan"
    finally:
        kernels.use_database(None)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_kernels_native_lt_0_keeps_every_cublas_call_on_at_mm() -> None:
    import subprocess
    import sys

    script = (
        "import torch, kernels\n"
        "from kernels import _native, _plans\n"
        "assert _native.start(block=True) == 'ready'\n"
        "a = torch.randn(8, 64, device='cuda', dtype=torch.float16); b = torch.randn(32, 64, device='cuda', dtype=torch.float16).t()\n"
        "_plans.put(_plans.signature(a, b), _plans.ModePlans(_plans._CUBLAS, _plans._CUBLAS))\n"
        "assert _native.NATIVE.try_mm(a, b) is not None\n"
        "print(_native.lt_served())\n")
    root = Path(__file__).resolve().parents[2]
    for setting, expected in (("0", "0"), ("1", "1")):
        env = dict(os.environ, KERNELS_NATIVE_LT=setting, PYTHONPATH=os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")]))
        result = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
        assert result.returncode == 0, result.stderr[-2000:]
        assert result.stdout.strip().splitlines()[-1] == expected, (setting, result.stdout)


def test_a_matmul_bias_signature_on_addmm_is_served_by_at_addmm_while_the_dispatcher_stands(native) -> None:
    """kernels.matmul_bias's signatures that dispatch sends to torch.addmm in both modes are served from
    C++, until the dispatcher's answers change (a pin, a clear): then Python decides and puts them again."""
    from kernels import BASELINE, epilogue

    a, b, bias = torch.randn(8, 16), torch.randn(12, 16).t(), torch.randn(12)
    assert native.try_addmm(a, b, bias) is None, "nothing is served before matmul_bias learns a signature"
    with epilogue.pinning(kernels.MATMUL_BIAS, [BASELINE], a, b) as (install,):
        install()
        first = kernels.matmul_bias(a, b, bias)  # learnt: addmm in both modes, put in C++
        assert native.module.addmm_size() == 1
        served = native.try_addmm(a, b, bias)
        torch.testing.assert_close(served, torch.addmm(bias, a, b))
        torch.testing.assert_close(first, served)
        assert native.try_addmm(a, b.double(), bias) is None, "b of another dtype is not the signature"
        assert native.try_addmm(torch.randn(8, 16), torch.randn(16, 12), bias) is None, "other strides"
        with torch.overrides.TorchFunctionMode():
            assert native.try_addmm(a, b, bias) is None, "a torch function mode sees addmm on the Python path"
        with pytest.raises(RuntimeError):  # a bias addmm refuses: the Python path raises torch's error
            kernels.matmul_bias(a, b, torch.randn(5))
        install()  # a new answer (the same config again) bumps the dispatcher's count
        assert native.try_addmm(a, b, bias) is None, "stale until matmul_bias's Python path puts it again"
        kernels.matmul_bias(a, b, bias)
        assert native.try_addmm(a, b, bias) is not None
    assert native.try_addmm(a, b, bias) is None, "the pins are gone: dispatch decides again"
    x, w = torch.randn(8, 16, requires_grad=True), torch.randn(12, 16, requires_grad=True)
    with epilogue.pinning(kernels.MATMUL_BIAS, [BASELINE], x, w.t()) as (install,):
        install()
        kernels.matmul_bias(x, w.t(), bias)
        out = native.try_addmm(x, w.t(), bias)
        out.sum().backward()  # at::addmm, as torch.addmm: autograd records it
        torch.testing.assert_close(x.grad, torch.ones(8, 12) @ w.detach())


@pytest.mark.skipif(not torch.cuda.is_available() and not kernels._INTERPRETED,
                    reason="a Triton graph plan runs CPU tensors only under TRITON_INTERPRET=1")
def test_a_matmul_bias_signature_on_addmm_in_eager_calls_alone_is_served_where_the_call_is_eager(native) -> None:
    """An eager record cuBLAS won beside a graph record a kernel won: eager calls are at::addmm's from C++ (in
    Python they paid the ready call's key and the mode check before torch.addmm), graph calls the Python
    path's Triton plan. The capture check is faked by forcing the mode (on the CPU, where there is no GPU;
    on a GPU, the same calls)."""
    from kernels import BASELINE, epilogue

    tiles = kernels.Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=4, num_warps=2, num_stages=2)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    a, b = torch.randn(8, 16, device=device), torch.randn(12, 16, device=device).t()
    bias = torch.randn(12, device=device)
    with epilogue.pinning(kernels.MATMUL_BIAS, [BASELINE], a, b, graph=tiles) as (install,):
        install()
        kernels.matmul_bias(a, b, bias)  # learnt: addmm in eager calls alone
        assert native.module.addmm_size() == 1
        torch.testing.assert_close(native.try_addmm(a, b, bias), torch.addmm(bias, a, b))
        with _modes.dispatch_mode(kernels.GRAPH):
            assert native.try_addmm(a, b, bias) is None, "a graph call: the Python path's Triton plan"
            torch.testing.assert_close(kernels.matmul_bias(a, b, bias), torch.addmm(bias, a, b), atol=1e-2, rtol=1e-2)
        with _modes.dispatch_mode(kernels.EAGER):
            assert native.try_addmm(a, b, bias) is not None
    assert native.try_addmm(a, b, bias) is None, "the pins are gone: dispatch decides again"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_a_matmul_bias_signature_on_addmm_runs_a_kept_cublaslt_plan_with_the_bias_in_its_epilogue(native, dtype) -> None:
    from kernels import BASELINE, epilogue

    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=dtype)

    a, b, bias = randn(33, 64), randn(40, 64).t(), randn(40)
    with epilogue.pinning(kernels.MATMUL_BIAS, [BASELINE], a, b) as (install,):
        install()
        kernels.matmul_bias(a, b, bias)  # learnt: addmm in both modes, put in C++
        before = _native.lt_served()
        for bias_now in (bias, randn(40)):  # the bias's address is set per call
            out = native.try_addmm(a, b, bias_now)
            torch.testing.assert_close(out, torch.addmm(bias_now, a, b), atol=2e-2, rtol=2e-2)
        assert _native.lt_served() == before + 2, "both calls ran the kept plan, bias in the epilogue"
        misaligned = randn(41)[1:]  # a row of N all the same, 2 bytes off the epilogue's 16: at::addmm's
        torch.testing.assert_close(native.try_addmm(a, b, misaligned), torch.addmm(misaligned, a, b),
                                   atol=2e-2, rtol=2e-2)
        assert _native.lt_served() == before + 2, "a bias the epilogue does not take stays on at::addmm"
        for not_a_row in (randn(1, 40), randn(40).float()):  # matmul_bias refuses these: C++ leaves them to it
            assert native.try_addmm(a, b, not_a_row) is None
    torch.cuda.synchronize()


def _cuda_kernels(call) -> list[str]:
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    return sorted(event.key for event in prof.key_averages() if event.device_type.name == "CUDA")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
@pytest.mark.parametrize("rows", [8, 32, 128])
def test_a_matmul_bias_signature_on_addmm_runs_one_kernel_as_torch_addmm_does(native, rows: int) -> None:
    """Qwen2.5-72B's stacked q/k/v: at 8 and 32 rows cublasLt's heuristic gave our kept plan a split-K kernel and
    its reduction, where torch.addmm runs one kernel (0.92-0.95x torch.addmm on the H100). A plan that wants
    workspace is refused: at::addmm serves the signature, with torch's kernel; elsewhere the kept plan runs, one
    kernel, though not always torch's tile (128 rows on an H200, 2026-11-28: 80x128 where torch ran 160x64)."""
    from kernels import BASELINE, epilogue

    a = torch.randn(rows, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(10240, 8192, device="cuda", dtype=torch.bfloat16).t()
    bias = torch.randn(10240, device="cuda", dtype=torch.bfloat16)
    with epilogue.pinning(kernels.MATMUL_BIAS, [BASELINE], a, b) as (install,):
        install()
        kernels.matmul_bias(a, b, bias)  # learnt: addmm in both modes, put in C++
        ours, torchs = _cuda_kernels(lambda: native.try_addmm(a, b, bias)), _cuda_kernels(lambda: torch.addmm(bias, a, b))
        if rows < 128:  # the refused split-K plan: at::addmm ran, torch's own kernels (split-K on an H200 too)
            assert ours == torchs, (ours, torchs)
        else:
            assert len(ours) == len(torchs) == 1, (ours, torchs)
        torch.testing.assert_close(native.try_addmm(a, b, bias), torch.addmm(bias, a, b), atol=0.5, rtol=2e-2)
    torch.cuda.synchronize()


def test_addmm_signatures_learnt_before_the_build_are_served_once_it_is_ready(native) -> None:
    """A process's first layers run before the extension is built (a daemon thread): what matmul_bias
    learnt meanwhile waits, and is put when the build is done. The real build runs here (from the cache)."""
    from kernels import BASELINE, epilogue

    with _native._LOCK:
        _native.NATIVE.module, _native.NATIVE.state, _native.NATIVE.try_addmm = None, "building", None
        _native.NATIVE.decided.clear()
    a, b, bias = torch.randn(8, 16), torch.randn(12, 16).t(), torch.randn(12)
    with epilogue.pinning(kernels.MATMUL_BIAS, [BASELINE], a, b) as (install,):
        install()
        kernels.matmul_bias(a, b, bias)
        assert len(_native.NATIVE.pending_addmm) == 1
        _native._build()
        assert _native.NATIVE.state == "ready" and not _native.NATIVE.pending_addmm
        torch.testing.assert_close(_native.NATIVE.try_addmm(a, b, bias), torch.addmm(bias, a, b))


def test_kernels_matmul_bias_returns_what_the_cpp_path_serves_without_resolving(native, monkeypatch) -> None:
    """The public call itself takes the C++ path for a learnt addmm signature: nothing of the Python path
    runs (no resolve), and what try_addmm returned is the result."""
    from kernels import BASELINE, epilogue

    a, b, bias = torch.randn(8, 16), torch.randn(12, 16).t(), torch.randn(12)
    with epilogue.pinning(kernels.MATMUL_BIAS, [BASELINE], a, b) as (install,):
        install()
        kernels.matmul_bias(a, b, bias)  # learnt
        served: list[torch.Tensor] = []
        real = native.try_addmm
        monkeypatch.setattr(native, "try_addmm", lambda *args: (served.append(real(*args)), served[-1])[1])
        monkeypatch.setattr(epilogue, "_resolve", lambda *args: pytest.fail("the Python path resolved"))
        out = kernels.matmul_bias(a, b, bias)
        assert len(served) == 1 and out is served[0]
        torch.testing.assert_close(out, torch.addmm(bias, a, b))


def test_when_matmul_bias_forgets_its_signatures_the_cpp_path_forgets_them_too(native) -> None:
    from kernels import BASELINE, epilogue

    a, b, bias = torch.randn(8, 16), torch.randn(12, 16).t(), torch.randn(12)
    with epilogue.pinning(kernels.MATMUL_BIAS, [BASELINE], a, b) as (install,):
        install()
        kernels.matmul_bias(a, b, bias)
        assert native.module.addmm_size() == 1
        _native.forget_addmm()  # as epilogue does when _PATHS is full and cleared
        assert native.module.addmm_size() == 0 and native.try_addmm(a, b, bias) is None


def test_a_build_lock_left_by_an_exited_process_is_removed_once_stale(tmp_path, monkeypatch) -> None:
    """torch's build waits without a limit while its lock file is there; a process that exited during its
    build (a daemon thread) left one, and every later process hung. A lock older than STALE_LOCK_S goes;
    a younger one is waited for, until it is gone or stale."""
    import time

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    lock = tmp_path / "some_extension" / "lock"
    lock.parent.mkdir()
    _native._clear_stale_lock("some_extension")  # no lock: returns at once
    lock.write_text("")
    old = time.time() - _native.STALE_LOCK_S - 5
    os.utime(lock, (old, old))
    _native._clear_stale_lock("some_extension")
    assert not lock.exists(), "a lock older than STALE_LOCK_S is removed"
    lock.write_text("")
    started = time.monotonic()
    _native._clear_stale_lock("some_extension", stale_s=0.5)
    waited = time.monotonic() - started
    assert not lock.exists() and 0.3 <= waited < 5, f"a fresh lock is waited for until stale ({waited:.2f} s)"
    lock.write_text("")  # another process took a fresh lock between our look and our move: it is put back
    assert _native._remove_unless_renewed(str(lock), stale_s=60) is False
    assert lock.exists() and [p.name for p in lock.parent.iterdir()] == ["lock"], "nothing left aside"
    lock.write_text("")
    (lock.parent / "build.ninja").write_text("")  # a live build writes its directory: not stale
    os.utime(lock, (old, old))
    started = time.monotonic()
    _native._clear_stale_lock("some_extension", stale_s=0.5)
    assert time.monotonic() - started >= 0.3 and not lock.exists(), "judged by the directory's newest file"


_MARKED_BUILDER = """
import pathlib, sys, time
from kernels import _native
with _native._builder_mark("some_extension"):
    (pathlib.Path(sys.argv[1]) / "lock").write_text("")
    print("building", flush=True)
    time.sleep(600)
"""


def _start_builder(directory: Path) -> subprocess.Popen:
    """A real process that marks the build directory as ``_build`` does, takes the lock, and builds (sleeps)."""
    import sys

    child = subprocess.Popen([sys.executable, "-c", _MARKED_BUILDER, str(directory)], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))})
    assert child.stdout.readline().strip() == "building"
    return child


def test_a_lock_whose_marked_builder_was_killed_goes_at_once_and_a_live_ones_is_waited_for(tmp_path, monkeypatch) -> None:
    """A builder killed mid-build (SIGKILL: no cleanup) leaves its lock and its mark; the next process sees the
    mark's process gone and removes the lock at once, where it used to wait STALE_LOCK_S (180 s: the first
    problem of a GPU call's quick tune, after a pytest run that ended during its build, H100, 2026-11-26).
    A live builder's lock, or one with a process still working in the directory, is judged by age as before."""
    import signal
    import time

    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))
    directory = tmp_path / "some_extension"
    directory.mkdir()
    lock = directory / "lock"
    builder = _start_builder(directory)
    try:
        started = time.monotonic()
        _native._clear_stale_lock("some_extension", stale_s=1.0)  # alive: waited for until the age rule
        assert time.monotonic() - started >= 0.8
    finally:
        builder.kill()
        builder.wait()
    builder = _start_builder(directory)
    builder.send_signal(signal.SIGKILL)
    builder.wait()
    assert lock.exists() and [p.name for p in directory.iterdir() if p.name.startswith("builder.")]
    worker = subprocess.Popen(["sleep", "30"], cwd=directory)  # a compiler the killed build left running
    try:
        started = time.monotonic()
        _native._clear_stale_lock("some_extension", stale_s=1.0)
        assert time.monotonic() - started >= 0.8, "a process working in the directory: judged by age"
    finally:
        worker.kill()
        worker.wait()
    lock.write_text("")
    started = time.monotonic()
    _native._clear_stale_lock("some_extension")  # STALE_LOCK_S (180 s) by age; the marks say at once
    assert time.monotonic() - started < 10 and not lock.exists()
    assert not [p.name for p in directory.iterdir() if p.name.startswith("builder.")], "dead marks forgotten"


# ---- Triton kernels launched from C++ ---------------------------------------------------------------

def _triton_config(variant: str, split: int) -> kernels.Config:
    return kernels.Config.make(VARIANT=variant, BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=4,
                               SPLIT_K=split, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False,
                               num_warps=4, num_stages=3)


def _operands(layout: str) -> tuple[torch.Tensor, torch.Tensor]:
    a = torch.randn(100, 512, device="cuda", dtype=torch.float16)
    b = torch.randn(512, 200, device="cuda", dtype=torch.float16)
    if layout == "nt":
        b = torch.randn(200, 512, device="cuda", dtype=torch.float16).t()
    return a, b


def _put_plans(a: torch.Tensor, b: torch.Tensor, eager: kernels.Config, graph: kernels.Config) -> None:
    """What kernels.matmul's first call of a signature leaves, with these configs per mode."""
    _plans.put(_plans.signature(a, b), _plans.plans_for({kernels.EAGER: eager, kernels.GRAPH: graph}, a, b))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
@pytest.mark.parametrize("variant,split", [("tiled", 1), ("splitk", 4)])
@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_a_triton_plan_is_launched_from_cpp_after_its_first_call(native, monkeypatch, variant: str, split: int,
                                                                 layout: str) -> None:
    monkeypatch.setattr(_plans.FAST, "pins", 1)  # plans are consulted even on a GPU with no table
    a, b = _operands(layout)
    config = _triton_config(variant, split)
    _put_plans(a, b, config, config)
    before = _native.launches()
    first = kernels.matmul(a, b)  # compiles; the plan hands its launch to C++ afterwards
    assert _native.launches() == before
    outputs = []
    for _ in range(3):
        a.normal_()
        b.normal_()
        c = kernels.matmul(a, b)
        torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=5e-2, rtol=5e-2)
        outputs.append(c)
    assert _native.launches() == before + 3, "every call after the first was launched from C++"
    assert len({c.data_ptr() for c in outputs}) == 3 and first.shape == (100, 200), "a fresh C per call"
    kernels.clear_cache()
    kernels.matmul(a, b)
    assert _native.launches() == before + 3, "clear_cache: nothing served until a plan is put again"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_a_call_that_wants_a_gradient_is_not_launched_from_cpp(native, monkeypatch) -> None:
    """A handed-over Triton launch records no autograd graph: with an operand that requires grad (grad mode
    on) the Python path takes the call, through the operator with a backward (whose body, with grad mode
    off, may launch from C++ again)."""
    monkeypatch.setattr(_plans.FAST, "pins", 1)
    a, b = _operands("nn")
    config = _triton_config("tiled", 1)
    _put_plans(a, b, config, config)
    kernels.matmul(a, b)  # the first call hands the launch over
    before = _native.launches()
    kernels.matmul(a, b)
    assert _native.launches() == before + 1, "served from C++ without a gradient wanted"
    leaf = a.clone().requires_grad_()
    c = kernels.matmul(leaf, b)
    assert c.grad_fn is not None, "C++ served a call that wants a gradient, and recorded none"
    c.float().sum().backward()
    torch.testing.assert_close(leaf.grad.float(), b.float().sum(1).expand_as(a), atol=5e-2, rtol=5e-2)
    served = _native.launches()
    with torch.no_grad():
        kernels.matmul(leaf, b)
    assert _native.launches() == served + 1, "under no_grad the launch is C++'s again"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_an_eager_only_triton_plan_leaves_graph_calls_other_streams_and_odd_operands_to_python(native,
                                                                                            monkeypatch) -> None:
    monkeypatch.setattr(_plans.FAST, "pins", 1)
    a, b = _operands("nn")
    _put_plans(a, b, _triton_config("tiled", 1), kernels.BASELINE)
    kernels.matmul(a, b)
    count = _native.launches()
    kernels.matmul(a, b)
    assert _native.launches() == count + 1, "eager, on the default stream: launched from C++"
    with _modes.dispatch_mode(kernels.GRAPH):
        torch.testing.assert_close(kernels.matmul(a, b), torch.mm(a, b))
    assert _native.launches() == count + 1, "forced graph mode runs the graph plan (cuBLAS), in Python"
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        c = kernels.matmul(a, b)
    torch.cuda.current_stream().wait_stream(side)
    torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=5e-2, rtol=5e-2)
    assert _native.launches() == count + 1, "another stream: the Python path"
    storage = torch.empty(100 * 512 + 8, device="cuda", dtype=torch.float16)
    shifted = storage[4:4 + 100 * 512].view(100, 512).copy_(a)  # 8 bytes off a 16-byte boundary
    torch.testing.assert_close(kernels.matmul(shifted, b).float(), a.float() @ b.float(), atol=5e-2, rtol=5e-2)
    assert _native.launches() == count + 1, "a misaligned operand: the Python path"
    graph, out = torch.cuda.CUDAGraph(), []
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.graph(graph):
        out.append(kernels.matmul(a, b))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out[0], torch.mm(a, b))
    assert _native.launches() == count + 1, "capturing: the graph plan, in Python"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_a_pinned_triton_plan_is_timed_as_the_user_s_call_runs_it(native) -> None:
    """The tuner pins each config in turn (kernels/_plans.py pinning): a pinned Triton plan is launched from
    C++ after its first call, as dispatch's own plan will be, and a new pin takes the C++ plan away."""
    a, b = _operands("nt")
    tiled, split = _triton_config("tiled", 1), _triton_config("splitk", 2)
    with _plans.pinning([tiled, split], a, b) as (install_tiled, install_split):
        for turn, install in enumerate((install_tiled, install_split, install_tiled, install_split)):
            install()
            count = _native.launches()
            kernels.matmul(a, b)
            assert (_native.launches() == count + 1) == (turn >= 2), \
                "a plan's first call takes the Python path; once handed over, a pin serves it from C++ at once"
            count = _native.launches()
            torch.testing.assert_close(kernels.matmul(a, b).float(), a.float() @ b.float(), atol=5e-2, rtol=5e-2)
            assert _native.launches() == count + 1
    count = _native.launches()
    kernels.matmul(a, b)
    assert _native.launches() == count, "the pins are gone"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
@pytest.mark.parametrize("split", [1, 2])
def test_a_repack_plan_launches_its_copy_and_its_kernel_from_cpp(native, monkeypatch, split: int) -> None:
    """Rows of 60 fp16 values are not 16-byte aligned: repack copies A and B into a padded buffer, then runs
    the kernel on it. From C++ the two launches run on a buffer of the plan's own, under one lock, so that
    threads calling at once never hand each other's copies to the kernel."""
    import threading

    monkeypatch.setattr(_plans.FAST, "pins", 1)
    config = _triton_config("repack", split).replace(BLOCK_K=32)
    a = torch.randn(96, 60, device="cuda", dtype=torch.float16)
    b = torch.randn(60, 80, device="cuda", dtype=torch.float16)
    _put_plans(a, b, config, config)
    kernels.matmul(a, b)  # compiles both kernels; the plan hands them to C++ afterwards
    count = _native.launches()
    for _ in range(2):
        a.normal_()
        b.normal_()
        torch.testing.assert_close(kernels.matmul(a, b).float(), a.float() @ b.float(), atol=5e-2, rtol=5e-2)
    assert _native.launches() == count + 2
    pairs = [(torch.randn(96, 60, device="cuda", dtype=torch.float16),
              torch.randn(60, 80, device="cuda", dtype=torch.float16)) for _ in range(4)]
    wrong: list[int] = []

    def hammer(index: int) -> None:
        x, w = pairs[index]
        expected = x.float() @ w.float()
        for _ in range(50):
            if not torch.allclose(kernels.matmul(x, w).float(), expected, atol=5e-2, rtol=5e-2):
                wrong.append(index)

    threads = [threading.Thread(target=hammer, args=(i,)) for i in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert wrong == [], "a call got another thread's operands"
    # (a thread's first call may find no CUDA context current on that thread yet: the Python path takes it)
    assert _native.launches() >= count + 2 + 196


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_a_handed_over_plan_leaves_hooked_switched_off_and_storage_less_calls_to_python(native, monkeypatch) -> None:
    """A launch hook installed after the hand-over sees every launch; KERNELS_DIRECT_LAUNCH's switch is obeyed;
    tensors without storage (torch.vmap's) match the signature by shape but are left to Python, which must
    not crash the process."""
    from triton import knobs

    from kernels import _launch

    monkeypatch.setattr(_plans.FAST, "pins", 1)
    a, b = _operands("nn")
    _put_plans(a, b, _triton_config("tiled", 1), _triton_config("tiled", 1))
    kernels.matmul(a, b)
    count = _native.launches()
    kernels.matmul(a, b)
    assert _native.launches() == count + 1, "handed over"
    seen: list[object] = []
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        kernels.matmul(a, b)
        kernels.matmul(a, b)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    torch.cuda.synchronize()
    assert len(seen) == 2 and _native.launches() == count + 1, "the hook saw both launches, made by Triton"
    monkeypatch.setattr(_launch, "ENABLED", False)
    kernels.matmul(a, b)
    assert _native.launches() == count + 1, "KERNELS_DIRECT_LAUNCH=0: Triton's own path"
    monkeypatch.setattr(_launch, "ENABLED", True)
    kernels.matmul(a, b)
    assert _native.launches() == count + 2, "and back"
    batch = torch.randn(3, *a.shape, device="cuda", dtype=a.dtype)
    try:
        out = torch.vmap(lambda x: kernels.matmul(x, b))(batch)
    except RuntimeError:
        pass  # the Python path's own answer to a batched operand; what matters is that the process lives
    else:
        torch.testing.assert_close(out.float(), batch.float() @ b.float(), atol=5e-2, rtol=5e-2)
    assert _native.launches() == count + 2


# The epilogue kernels' Triton plans (kernels/epilogue.py ``_hand_over``): kernels.matmul_bias's and
# kernels.gated_matmul's eager calls launched from C++, as matmul's are.
_EPILOGUE_TILES = kernels.Config.make(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=4, num_warps=4, num_stages=3)
_EPILOGUE_GEMV = kernels.Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, GEMV_BLOCK_N=4,
                                     GEMV_BLOCK_K=256, num_warps=4, num_stages=2)


def _gated_reference(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    product = a.float() @ b.float()
    n = b.shape[1] // 2
    return torch.nn.functional.silu(product[:, :n]) * product[:, n:]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
@pytest.mark.parametrize("rows,config", [(100, _EPILOGUE_TILES), (1, _EPILOGUE_GEMV)], ids=["tiles", "gemv"])
def test_a_triton_bias_plan_is_launched_from_cpp_after_its_first_call(native, dtype, rows: int,
                                                                      config: kernels.Config) -> None:
    """A signature addmm served before (a table refreshed since, a pin) is then the Triton plan's."""
    from kernels import BASELINE, epilogue

    def randn(*shape: int, kind: torch.dtype = dtype) -> torch.Tensor:
        return torch.randn(*shape, device="cuda", dtype=kind)

    a, b, bias = randn(rows, 512), randn(200, 512).t(), randn(200)
    with epilogue.pinning(kernels.MATMUL_BIAS, [BASELINE], a, b) as (install,):
        install()
        kernels.matmul_bias(a, b, bias)  # addmm in both modes: the signature is served by at::addmm from C++
        assert native.module.addmm_size() == 1
    with epilogue.pinning(kernels.MATMUL_BIAS, [config], a, b) as (install,):
        install()
        before = _native.launches()
        kernels.matmul_bias(a, b, bias)  # compiles; the ready call hands its launch to C++
        assert _native.launches() == before, "the first call takes the Python path"
        outputs = []
        for _ in range(3):
            a.normal_()
            bias_now = randn(200)  # the bias's address is the call's own
            c = kernels.matmul_bias(a, b, bias_now)
            torch.testing.assert_close(c.float(), torch.addmm(bias_now.float(), a.float(), b.float()),
                                       atol=5e-2, rtol=5e-2)
            outputs.append(c)
        assert _native.launches() == before + 3, "every call after the first was launched from C++"
        assert len({c.data_ptr() for c in outputs}) == 3, "a fresh C per call"
        assert native.module.addmm_size() == 0, "addmm's older answer for the signature is gone"
        count = _native.launches()
        for other in (randn(201)[1:], randn(400)[::2]):  # misaligned, strided
            c = kernels.matmul_bias(a, b, other)
            torch.testing.assert_close(c.float(), torch.addmm(other.float(), a.float(), b.float()), atol=5e-2, rtol=5e-2)
        assert _native.launches() == count, "a bias the kernel was not made for stays on the Python path"
        with pytest.raises(ValueError, match="bias has shape"):
            kernels.matmul_bias(a, b, randn(7))  # the Python path says what is wrong
        with pytest.raises(ValueError, match="pass bias.to"):
            kernels.matmul_bias(a, b, randn(200, kind=torch.float32))  # another dtype: the same on every path
        assert _native.launches() == count
        install()  # a new answer (the same config again) bumps the dispatcher's count
        kernels.matmul_bias(a, b, bias)
        assert _native.launches() == count, "stale: the Python path resolves again and hands the launch over"
        kernels.matmul_bias(a, b, bias)
        assert _native.launches() == count + 1
    kernels.matmul_bias(a, b, bias)
    assert _native.launches() == count + 1, "the pins are gone: dispatch decides again"
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
@pytest.mark.parametrize("rows,config", [(64, _EPILOGUE_TILES), (1, _EPILOGUE_GEMV)], ids=["tiles", "gemv"])
def test_a_triton_gated_plan_is_launched_from_cpp_after_its_first_call(native, rows: int, config: kernels.Config) -> None:
    from kernels import epilogue

    a = torch.randn(rows, 256, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2 * 96, 256, device="cuda", dtype=torch.bfloat16).t()  # [K, 2N]: gate columns, then up
    with epilogue.pinning(kernels.GATED_MATMUL, [config], a, b) as (install,):
        install()
        kernels.gated_matmul(a, b)
        count = _native.launches()
        for _ in range(2):
            a.normal_()
            c = kernels.gated_matmul(a, b)
            assert c.shape == (rows, 96)
            torch.testing.assert_close(c.float(), _gated_reference(a, b), atol=5e-2, rtol=5e-2)
        assert _native.launches() == count + 2, "launched from C++"
        storage = torch.empty(rows * 256 + 8, device="cuda", dtype=torch.bfloat16)
        shifted = storage[4:4 + rows * 256].view(rows, 256).copy_(a)  # 8 bytes off a 16-byte boundary
        torch.testing.assert_close(kernels.gated_matmul(shifted, b).float(), _gated_reference(a, b),
                                   atol=5e-2, rtol=5e-2)
        assert _native.launches() == count + 2, "a misaligned operand: the Python path"
    torch.cuda.synchronize()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_an_eager_only_triton_bias_plan_leaves_graph_calls_and_captures_to_python(native) -> None:
    from kernels import BASELINE, epilogue

    a = torch.randn(32, 512, device="cuda", dtype=torch.float16)
    b = torch.randn(128, 512, device="cuda", dtype=torch.float16).t()
    bias = torch.randn(128, device="cuda", dtype=torch.float16)
    expected = torch.addmm(bias.float(), a.float(), b.float())
    with epilogue.pinning(kernels.MATMUL_BIAS, [_EPILOGUE_TILES], a, b, graph=BASELINE) as (install,):
        install()
        kernels.matmul_bias(a, b, bias)
        count = _native.launches()
        kernels.matmul_bias(a, b, bias)
        assert _native.launches() == count + 1, "eager, on the default stream: launched from C++"
        with _modes.dispatch_mode(kernels.GRAPH):
            torch.testing.assert_close(kernels.matmul_bias(a, b, bias), torch.addmm(bias, a, b))
        assert _native.launches() == count + 1, "forced graph mode runs the graph plan (addmm), in Python"
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        graph, out = torch.cuda.CUDAGraph(), []
        with torch.cuda.graph(graph, stream=side):
            out.append(kernels.matmul_bias(a, b, bias))
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out[0].float(), expected, atol=5e-2, rtol=5e-2)
        assert _native.launches() == count + 1, "capturing: the graph plan, in Python"


def _moe_operands(device: str = "cpu", tokens: int = 8) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """bf16 tokens sorted by expert, K-major experts [E, K, N] (as transformers' ``down_proj.transpose(1, 2)``),
    int32 running end rows: what torch._grouped_mm takes."""
    x = torch.randn(tokens, 32, dtype=torch.bfloat16, device=device)
    w = torch.randn(4, 48, 32, dtype=torch.bfloat16, device=device).transpose(1, 2)
    offsets = torch.tensor([2, 2, 5, tokens], dtype=torch.int32, device=device)
    return x, w, offsets


def _moe_fields(x: torch.Tensor, w: torch.Tensor, offsets: torch.Tensor) -> tuple[int, ...]:
    return (*x.shape, *w.shape, *x.stride(), *w.stride(), offsets.shape[0], offsets.stride(0))


def test_a_moe_signature_whose_plan_is_torch_grouped_mm_is_served_from_cpp_while_the_dispatcher_stands(native) -> None:
    """On a GPU, kernels.moe_matmul hands an eager signature whose whole plan is torch._grouped_mm to the C++
    path (the GPU test below checks that hand-over). On the CPU its baseline is a loop, so this test hands the
    signature over as kernels/_grouped_dispatch.py does, and checks what the C++ path then serves: torch's own
    result, for that signature alone, in eager calls with no gradient wanted and nothing watching, while the
    dispatcher's answers stand."""
    from kernels import BASELINE, moe
    from kernels.dispatch import DISPATCHER

    x, w, offsets = _moe_operands()
    assert native.try_moe(x, w, offsets) is None, "nothing is served before a signature is handed over"
    with moe.pinning([BASELINE], x, w) as (install,):
        install()
        _native.remember_moe(_moe_fields(x, w, offsets), x.dtype, offsets.dtype, x.device, False,
                             DISPATCHER.changes, None)
        assert native.module.moe_size() == 1
        before = _native.moe_baseline_calls()
        served = kernels.moe_matmul(x, w, offsets)
        assert _native.moe_baseline_calls() == before + 1, "the public call took the C++ path"
        assert torch.equal(served, torch._grouped_mm(x, w, offs=offsets))
        assert torch.equal(kernels.ops.moe_matmul_call(x, w, offsets, True), served), "the experts' direct call too"
        assert _native.moe_baseline_calls() == before + 2
        assert native.try_moe_gated(x, w, offsets) is None, "moe_gated_matmul's plans are another set"
        assert native.try_moe(x, w, offsets.long()) is None, "int64 offsets: another signature (cast first)"
        assert native.try_moe(x, w.contiguous(), offsets) is None, "N-major experts: other strides"
        assert native.try_moe(x[:4], w, offsets) is None, "other rows"
        with _modes.dispatch_mode(kernels.GRAPH):
            assert native.try_moe(x, w, offsets) is None, "a graph call: the Python path's graph plan"
        with torch.overrides.TorchFunctionMode():
            assert native.try_moe(x, w, offsets) is None, "a torch function mode sees the call on the Python path"
        from torch.utils._python_dispatch import TorchDispatchMode

        class Watch(TorchDispatchMode):
            def __torch_dispatch__(self, func, types, args=(), kwargs=None):
                return func(*args, **(kwargs or {}))

        with Watch():
            assert native.try_moe(x, w, offsets) is None, "a dispatch mode (a FLOP counter) sees the Python path"
        leaf = x.clone().requires_grad_()
        assert native.try_moe(leaf, w, offsets) is None, "a wanted gradient: the operator with its backward"
        with torch.no_grad():
            assert native.try_moe(leaf, w, offsets) is not None
        install()  # a new answer (the same config again) bumps the dispatcher's count
        assert native.try_moe(x, w, offsets) is None, "stale until a first call hands the plan over again"
        assert native.module.moe_size() == 0, "and dropped"
    _native.remember_moe(_moe_fields(x, w, offsets), x.dtype, offsets.dtype, x.device, False, DISPATCHER.changes, None)
    kernels.clear_cache()
    assert native.try_moe(x, w, offsets) is None and native.module.moe_size() == 0, "clear_cache forgets them"


def test_moe_plans_handed_over_before_the_build_are_served_once_it_is_ready(native) -> None:
    """A hand-over that comes while the extension builds is kept and applied when it is ready (as ``_build``
    applies it); record mode, which counts every call in Python, suspends the C++ path."""
    from kernels.dispatch import DISPATCHER

    x, w, offsets = _moe_operands()
    module = native.module
    with _native._LOCK:
        native.module, native.state = None, "building"
    _native.remember_moe(_moe_fields(x, w, offsets), x.dtype, offsets.dtype, x.device, False, DISPATCHER.changes, None)
    assert len(native.pending_moe) == 1 and module.moe_size() == 0
    with _native._LOCK:
        for kind_key, value in native.pending_moe.items():
            _native._apply_moe(module, kind_key, value)
        native.pending_moe.clear()
        native.module, native.state = module, "ready"
        _native._publish()
    assert native.try_moe(x, w, offsets) is not None
    _native.suspend()  # what record mode does: it counts every call in Python
    assert native.try_moe is None and native.try_moe_gated is None
    _native.resume()
    assert native.try_moe is not None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
def test_a_moe_baseline_plan_on_the_gpu_is_handed_over_by_its_first_call(native) -> None:
    from kernels import BASELINE, moe

    x, w, offsets = _moe_operands("cuda")
    with moe.pinning([BASELINE], x, w) as (install,):
        install()
        first = kernels.moe_matmul(x, w, offsets)  # resolves, keeps its plan, hands it over
        before = _native.moe_baseline_calls()
        assert torch.equal(kernels.moe_matmul(x, w, offsets), first)
        assert _native.moe_baseline_calls() == before + 1, "served by torch._grouped_mm from C++"
        assert torch.equal(first, torch._grouped_mm(x, w, offs=offsets))
    torch.cuda.synchronize()


_MOE_TILES = kernels.Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, NUM_SM=132, num_warps=4, num_stages=2)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (this machine has none)")
@pytest.mark.parametrize("gated", [False, True], ids=["moe_matmul", "moe_gated_matmul"])
def test_a_moe_triton_plan_is_launched_from_cpp_after_its_first_call(native, gated: bool) -> None:
    """A tuned MoE signature's Triton launch is handed over by its first call: later calls, public and the
    experts' direct ones, launch from C++ with each call's offsets; a misaligned operand takes the Python path."""
    from kernels import moe, moe_gated

    x, w, offsets = _moe_operands("cuda", tokens=64)
    offsets = torch.tensor([10, 10, 40, 64], dtype=torch.int32, device="cuda")
    call = kernels.moe_gated_matmul if gated else kernels.moe_matmul
    direct = kernels.ops.moe_gated_matmul_call if gated else kernels.ops.moe_matmul_call
    pinning = moe_gated.pinning if gated else moe.pinning
    with pinning([_MOE_TILES], x, w) as (install,):
        install()
        call(x, w, offsets)  # compiles; the plan hands its launch to C++ afterwards
        count = _native.launches()
        for routed in ([16, 16, 30, 64], [0, 64, 64, 64]):
            ends = torch.tensor(routed, dtype=torch.int32, device="cuda")
            x.normal_()
            expect = moe_gated.launch(kernels.BASELINE, x, w, ends) if gated else torch._grouped_mm(x, w, offs=ends)
            torch.testing.assert_close(call(x, w, ends).float(), expect.float(), atol=5e-2, rtol=5e-2)
            torch.testing.assert_close(direct(x, w, ends, True).float(), expect.float(), atol=5e-2, rtol=5e-2)
        assert _native.launches() == count + 4, "every call after the first was launched from C++"
        storage = torch.empty(64 * 32 + 8, device="cuda", dtype=torch.bfloat16)
        shifted = storage[4:4 + 64 * 32].view(64, 32).copy_(x)  # 8 bytes off a 16-byte boundary
        torch.testing.assert_close(call(shifted, w, offsets).float(), call(x, w, offsets).float())
        assert _native.launches() == count + 5, "the misaligned call ran in Python; the aligned one from C++"
    torch.cuda.synchronize()
