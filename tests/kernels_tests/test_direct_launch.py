"""The direct launch path (kernels/_launch.py): after a kernel's first launch, calls go straight to the
compiled kernel's launcher, with the runtime arguments and then the constexprs in parameter order.

The CPU tests replace what cannot run here, the CUDA launcher of a compiled kernel and the CUDA device and
stream queries, by recording stand-ins: they check which path a call takes and what it passes. The GPU
tests run the real path and check the results of the direct calls against a float32 reference.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import _launch, gemm, grouped, moe
from kernels._launch import DirectLaunch


class _Compiled:
    """Stands in for triton's CompiledKernel: records what its launcher was called with."""

    function = "function-handle"
    packed_metadata = "metadata"

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def run(self, *args) -> None:
        self.launches.append(args)


class _Kernel:
    """Stands in for a @triton.jit function with parameters (x, n, BLOCK, FLAG)."""

    arg_names = ["x", "n", "BLOCK", "FLAG"]

    def __init__(self, compiled: object) -> None:
        self.compiled = compiled
        self.jit_calls: list[tuple] = []

    def __getitem__(self, grid):
        def launch(*args, **kwargs):
            self.jit_calls.append((grid, args, kwargs))
            return self.compiled
        return launch


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> dict:
    device = {"current": 0}
    monkeypatch.setattr(torch.cuda, "current_device", lambda: device["current"])
    monkeypatch.setattr(_launch, "_current_device", lambda: device["current"])
    monkeypatch.setattr(_launch, "_raw_stream", lambda index: 1000 + index)
    return device


def test_first_call_takes_triton_path_then_the_launcher_directly(fake_cuda: dict) -> None:
    compiled = _Compiled()
    kernel = _Kernel(compiled)
    launch = DirectLaunch(kernel, (7,), dict(BLOCK=64, FLAG=True, num_warps=4, num_stages=3))
    launch("x0", 5)
    assert kernel.jit_calls == [((7, 1, 1), ("x0", 5), dict(BLOCK=64, FLAG=True, num_warps=4, num_stages=3))]
    assert compiled.launches == []
    launch("x1", 5)
    launch("x2", 5)
    assert len(kernel.jit_calls) == 1
    assert launch.direct_calls == 2
    # grid, stream, function, metadata, no launch metadata or hooks, runtime args, constexprs by parameter order
    assert compiled.launches[0] == (7, 1, 1, 1000, "function-handle", "metadata", None, None, None, "x1", 5, 64, True)


class _PlainRun:
    """Stands in for triton 3.6's CudaLauncher of a kernel with no scratch and no launch attributes."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def launch(self, *args) -> None:
        pass


class _Metadata:
    num_warps, num_ctas, shared = 4, 1, 24576


class _Source:
    """Stands in for the ASTSource: the specialized signature, with the 1 Triton made a constexpr."""

    signature = {"a": "*fp16", "b": "*fp16", "c": "*fp16", "work": "*fp32", "m": "i32", "k": "i64",
                 "one": "constexpr", "BLOCK": "constexpr"}


class _CompiledForNative(_Compiled):
    """A compiled kernel as the C++ launch path reads it (function handle, metadata, signature)."""

    function = 0x5000
    metadata = _Metadata()
    src = _Source()

    def __init__(self) -> None:
        super().__init__()
        self.run = _PlainRun()


class _KernelWithWork(_Kernel):
    arg_names = ["a", "b", "c", "work", "m", "k", "one", "BLOCK"]


def test_a_native_launch_takes_the_parameters_triton_s_launcher_passes(fake_cuda: dict) -> None:
    """The C++ path (kernels/_native.cpp) launches what Triton's launcher would: every non-constexpr
    parameter in order, A, B and C per call, a fixed tensor's address kept alive, integers as typed."""
    compiled = _CompiledForNative()
    launch = DirectLaunch(_KernelWithWork(compiled), (6, 2), dict(BLOCK=64))
    a, b, c, work = (torch.empty(8) for _ in range(4))
    assert launch.native_launch((a, b, c, work, 100, 2**33, 1), _launch.OPERANDS) is None, "nothing adopted yet"
    launch(a, b, c, work, 100, 2**33, 1)
    native = launch.native_launch((a, b, c, work, 100, 2**33, 1), _launch.OPERANDS)
    assert native is not None
    assert (native.function, native.grid, native.threads, native.shared) == (0x5000, (6, 2, 1), 128, 24576)
    assert native.codes == [0, 1, 2, _launch.SLOT_FIXED_64, _launch.SLOT_FIXED_32, _launch.SLOT_FIXED_64]
    assert native.values == [0, 0, 0, work.data_ptr(), 100, 2**33]
    assert native.keep == [work] and native.device == 0


def test_native_launches_are_allowed_only_where_triton_s_own_path_would_be_skipped(monkeypatch) -> None:
    """kernels/_native.cpp asks this before every launch: a profiler's hook must see every launch."""
    assert _launch.native_allowed() == (_launch.ENABLED and not _launch._hooks_installed())
    monkeypatch.setattr(_launch, "ENABLED", False)
    assert not _launch.native_allowed()
    monkeypatch.setattr(_launch, "ENABLED", True)
    monkeypatch.setattr(_launch, "_hooks_installed", lambda: True)
    assert not _launch.native_allowed()


@pytest.mark.parametrize("change", ["global_scratch_size", "profile_scratch_size", "launch_cooperative_grid",
                                    "launch_pdl", "num_ctas", "float", "per_call_int", "other_triton"])
def test_a_kernel_the_cpp_launch_cannot_make_exactly_is_refused(fake_cuda: dict, monkeypatch, change: str) -> None:
    compiled = _CompiledForNative()
    if change == "num_ctas":
        compiled.metadata = type("Clustered", (_Metadata,), {"num_ctas": 2})()
    elif change in ("float", "per_call_int"):
        pass
    else:
        setattr(compiled.run, change, 1)
    if change == "other_triton":  # its launcher may pass other hidden parameters
        monkeypatch.setattr(_launch, "_NATIVE_ABI", False)
    launch = DirectLaunch(_KernelWithWork(compiled), (6,), dict(BLOCK=64))
    args = (torch.empty(8), torch.empty(8), torch.empty(8), torch.empty(8), 100, 7, 1)
    if change == "float":  # an integer value, so that only the parameter's type refuses it
        compiled.src = type("FloatSource", (), {"signature": {**_Source.signature, "k": "fp32"}})()
    launch(*args)
    per_call = {0: _launch.SLOT_A, 1: _launch.SLOT_B, 4: _launch.SLOT_C} if change == "per_call_int" else _launch.OPERANDS
    assert launch.native_launch(args, per_call) is None


class _DescriptorRun:
    """Stands in for triton 3.6's CudaLauncher of a kernel with tensor descriptors: its ``launch`` is a
    Python wrapper (as ``wrap_handle_tensordesc``) closing over the C launcher and each descriptor's
    metadata. The C launcher is a recording stand-in: no CUDA launcher runs on the CPU."""

    global_scratch_size = profile_scratch_size = 0
    launch_cooperative_grid = launch_pdl = False

    def __init__(self, metas: list) -> None:
        self.c_calls: list[tuple] = []

        def launcher(*args) -> None:
            self.c_calls.append(args)

        def wrapper(*args) -> None:  # encodes descriptors, then calls the C launcher (triton's names)
            return launcher(*args, tuple(tensordesc_meta))

        tensordesc_meta = metas
        self.launch = wrapper
        self.c_launcher = launcher


def test_a_descriptor_wrapper_is_looked_through_to_its_c_launcher(fake_cuda: dict) -> None:
    compiled = _Compiled()
    compiled.run = _DescriptorRun([{"swizzle": 3}, {"swizzle": 1}])
    launch = DirectLaunch(_Kernel(compiled), (7,), dict(BLOCK=64, FLAG=True))
    assert launch.descriptor_launcher() is None  # nothing adopted yet
    launch(torch.zeros(4), 5)
    raw, metas = launch.descriptor_launcher()
    assert raw is compiled.run.c_launcher and metas == [{"swizzle": 3}, {"swizzle": 1}]
    launch.launch_raw(raw, "map", 4, 1, 5)
    assert compiled.run.c_calls == [(7, 1, 1, 1000, "function-handle", False, False, None, None, "metadata",
                                     None, None, None, "map", 4, 1, 5, 64, True)]
    assert launch.direct_calls == 1


def test_a_launcher_without_descriptor_metadata_is_not_looked_through(fake_cuda: dict) -> None:
    """No lowering to CUtensorMaps (metadata None): the wrapper's own expansion must stay."""
    compiled = _Compiled()
    compiled.run = _DescriptorRun([None])
    launch = DirectLaunch(_Kernel(compiled), (7,), dict(BLOCK=64, FLAG=True))
    launch(torch.zeros(4), 5)
    assert launch.descriptor_launcher() is None
    plain = DirectLaunch(_Kernel(_Compiled()), (7,), dict(BLOCK=64, FLAG=True))
    plain(torch.zeros(4), 5)
    assert plain.descriptor_launcher() is None


def test_another_current_device_or_a_launch_hook_takes_triton_path(fake_cuda: dict,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _Compiled()
    kernel = _Kernel(compiled)
    launch = DirectLaunch(kernel, (2, 3), dict(BLOCK=16, FLAG=False))
    launch("x", 1)
    fake_cuda["current"] = 1
    launch("x", 1)
    assert (len(kernel.jit_calls), launch.direct_calls) == (2, 0)
    fake_cuda["current"] = 0
    hooks = _launch._knobs.runtime.launch_enter_hook
    monkeypatch.setattr(hooks, "calls", [lambda metadata: None])  # a profiler listening
    launch("x", 1)
    assert (len(kernel.jit_calls), launch.direct_calls) == (3, 0)
    monkeypatch.setattr(hooks, "calls", [])
    launch("x", 1)
    assert (len(kernel.jit_calls), launch.direct_calls) == (3, 1)


def test_switched_off_or_missing_constexprs_keep_triton_path(fake_cuda: dict,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _Compiled()
    kernel = _Kernel(compiled)
    partial = DirectLaunch(kernel, (1,), dict(BLOCK=16))  # FLAG left to its default: order unknown
    partial("x", 1)
    partial("x", 1)
    assert (len(kernel.jit_calls), partial.direct_calls) == (2, 0)
    monkeypatch.setattr(_launch, "ENABLED", False)
    full = DirectLaunch(kernel, (1,), dict(BLOCK=16, FLAG=True))
    full("x", 1)
    full("x", 1)
    assert (len(kernel.jit_calls), full.direct_calls) == (4, 0)


def test_interpreter_launches_stay_on_triton_path() -> None:
    """Under the interpreter a launch returns no compiled kernel, so there is nothing to adopt."""
    if not kernels.interpreter_enabled():
        pytest.skip("runs the kernel under the interpreter")
    spec = kernels.get_kernel("grouped_matmul")
    problem = kernels.Problem("grouped_matmul", "fp16", "nn", ((5, 8, 16), (3, 8, 16)))
    config = spec.default_config(problem, kernels.current_device())
    As, Bs = spec.make_inputs(problem, "cpu", 0)
    for _ in range(2):
        outs = kernels.grouped_matmul_with(config, As, Bs)
    launch = grouped.prepare(config, grouped.signature(As, Bs), As[0].device)
    assert launch.kernel.direct_calls == 0
    assert torch.allclose(outs[0].float(), As[0].float() @ Bs[0].float(), atol=1e-2, rtol=1e-2)


def test_clear_cache_forgets_ready_launches() -> None:
    if not kernels.interpreter_enabled():
        pytest.skip("runs the kernels under the interpreter")
    a, b = torch.randn(8, 16, dtype=torch.float16), torch.randn(16, 8, dtype=torch.float16)
    kernels.matmul_with(kernels.Config.make(VARIANT="tiled", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1,
                                            SPLIT_K=1, NUM_SM=4, FLATTEN=False, EPILOGUE_SUBTILE=False,
                                            num_warps=4, num_stages=2), a, b)
    spec = kernels.get_kernel("moe_matmul")
    problem = kernels.Problem("moe_matmul", "fp16", "nn", ((5, 8, 16), (3, 8, 16)))
    kernels.moe_matmul_with(spec.default_config(problem, kernels.current_device()),
                            *spec.make_inputs(problem, "cpu", 0)[:3])
    assert len(gemm.LAUNCHES) and len(moe.LAUNCHES)
    kernels.clear_cache()
    assert len(gemm.LAUNCHES) == len(moe.LAUNCHES) == len(grouped.TABLES) == 0


# ---------------------------------------------------------------------------------------------- GPU

def _refill(*tensors: torch.Tensor) -> None:
    for t in tensors:
        t.copy_(torch.randn(t.shape, device=t.device).to(t.dtype) * 0.3)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_grouped_direct_calls_compute_the_new_operands(dtype: torch.dtype) -> None:
    spec = kernels.get_kernel("grouped_matmul")
    problem = kernels.Problem("grouped_matmul", grouped._DTYPE_NAMES[dtype], "nn",
                              ((128, 256, 512), (0, 256, 512), (200, 64, 96)))
    config = spec.default_config(problem, kernels.current_device())
    As, Bs = spec.make_inputs(problem, "cuda", 0)
    kernels.grouped_matmul_with(config, As, Bs)
    launch = grouped.prepare(config, grouped.signature(As, Bs), As[0].device)
    for _ in range(2):  # same tensors, new contents: the signature matches, the launch is direct
        _refill(*As, *Bs)
        outs = kernels.grouped_matmul_with(config, As, Bs)
        for a, b, c in zip(As, Bs, outs):
            torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=2e-2, rtol=2e-2)
    assert launch.kernel.direct_calls == 2


@pytest.mark.gpu
def test_moe_direct_calls_compute_the_new_operands() -> None:
    spec = kernels.get_kernel("moe_matmul")
    problem = kernels.Problem("moe_matmul", "bf16", "nt", ((100, 256, 512), (0, 256, 512), (300, 256, 512)))
    config = spec.default_config(problem, kernels.current_device())
    inputs = spec.make_inputs(problem, "cuda", 0)
    x, w, offsets = inputs[:3]
    moe.LAUNCHES.clear()
    kernels.moe_matmul_with(config, x, w, offsets)
    (launch,) = [entry for entry in moe.LAUNCHES._entries.values()]
    for _ in range(2):
        _refill(x, w)
        out = kernels.moe_matmul_with(config, x, w, offsets)
        torch.testing.assert_close(out.float(), spec.reference(inputs), atol=5e-2, rtol=5e-2)
    assert launch.direct_calls == 2


@pytest.mark.gpu
@pytest.mark.parametrize("variant,split", [("tiled", 1), ("splitk", 4)])
@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_dense_direct_calls_compute_the_new_operands(variant: str, split: int, layout: str) -> None:
    config = kernels.Config.make(VARIANT=variant, BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=4,
                                 SPLIT_K=split, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False,
                                 num_warps=4, num_stages=3)
    a = torch.empty(100, 512, device="cuda", dtype=torch.float16)
    b = torch.empty(512, 200, device="cuda", dtype=torch.float16)
    if layout == "nt":
        b = torch.empty(200, 512, device="cuda", dtype=torch.float16).t()
    _refill(a, b)
    c = kernels.matmul_with(config, a, b)
    launch = gemm.LAUNCHES.get(gemm._launch_key(config, a, b, c))
    for _ in range(2):
        _refill(a, b)
        c = kernels.matmul_with(config, a, b)
        torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=2e-2, rtol=2e-2)
    assert launch is not None and launch.direct_calls == 2


@pytest.mark.gpu
def test_a_launch_hook_sees_every_launch() -> None:
    """A profiler's hook must not miss the launches the shortcut would take."""
    from triton import knobs

    spec = kernels.get_kernel("grouped_matmul")
    problem = kernels.Problem("grouped_matmul", "fp16", "nn", ((64, 64, 64), (64, 64, 64)))
    config = spec.default_config(problem, kernels.current_device())
    As, Bs = spec.make_inputs(problem, "cuda", 0)
    kernels.grouped_matmul_with(config, As, Bs)
    seen: list[object] = []
    hook = seen.append
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        kernels.grouped_matmul_with(config, As, Bs)
        kernels.grouped_matmul_with(config, As, Bs)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    torch.cuda.synchronize()
    assert len(seen) == 2


@pytest.mark.gpu
@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_tma_calls_on_ever_new_addresses_keep_their_tensor_maps_right(layout: str) -> None:
    """TMA launches past triton's descriptor wrapper, with CUtensorMaps kept per address: fresh operands
    at more addresses than are kept (the cache empties and refills) still compute their own product."""
    config = kernels.Config.make(VARIANT="tma", BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=8, SPLIT_K=1,
                                 NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=3)
    w = torch.randn(256, 512, device="cuda", dtype=torch.float16)
    b = w.t() if layout == "nt" else torch.randn(512, 256, device="cuda", dtype=torch.float16)
    keep = []  # live tensors, so that addresses do not repeat
    for step in range(gemm._TENSORMAPS_PER_OPERAND + 6):
        a = torch.randn(192, 512, device="cuda", dtype=torch.float16)
        c = kernels.matmul_with(config, a, b)
        keep.append((a, c))
        if step in (0, 1, gemm._TENSORMAPS_PER_OPERAND + 5):
            torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=5e-2, rtol=2e-2)
    launch = gemm.LAUNCHES.get(gemm._launch_key(config, a, b, c))
    assert launch is not None and launch._raw is not None, "triton 3.6 offers its C launcher: it must be used"
    assert launch.launch.direct_calls == gemm._TENSORMAPS_PER_OPERAND + 5
    for a, c in keep[-3:]:
        torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=5e-2, rtol=2e-2)


@pytest.mark.gpu
def test_tma_calls_that_repeat_or_alternate_addresses_compute_their_own_operands() -> None:
    """The last call's arguments are reused where A, B and C sit at the same addresses: new data at those
    addresses, and a call at another address in between, still give each call its own product."""
    config = kernels.Config.make(VARIANT="tma", BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=8, SPLIT_K=1,
                                 NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=3)
    b = torch.randn(256, 512, device="cuda", dtype=torch.float16).t()
    inputs = [torch.randn(192, 512, device="cuda", dtype=torch.float16) for _ in range(2)]
    outputs = [torch.empty(192, 256, device="cuda", dtype=torch.float16) for _ in range(2)]
    # The first call compiles (unless an earlier test of this process did) and launches through Triton; the
    # launch adopts Triton's C launcher on its next call. Under pytest-xdist the earlier test may have run in
    # another process (H200, 2026-11-29, torch 2.11.0+cu130, triton 3.6.0, `pytest -n 8 tests/kernels_tests`: this
    # test alone in its worker failed here with one call).
    for _ in range(2):
        kernels.matmul_with(config, inputs[0], b, out=outputs[0])
    launch = gemm.LAUNCHES.get(gemm._launch_key(config, inputs[0], b, outputs[0]))
    assert launch is not None and launch._raw is not None, "triton 3.6 offers its C launcher: it must be used"
    before = launch.launch.direct_calls  # the launch is shared with earlier tests of the same layout
    for which in (0, 0, 1, 0, 1, 1):
        a, c = inputs[which], outputs[which]
        a.normal_()  # new data, same address
        kernels.matmul_with(config, a, b, out=c)
        torch.testing.assert_close(c.float(), a.float() @ b.float(), atol=5e-2, rtol=2e-2)
    assert launch.launch.direct_calls == before + 6, "every call took the raw launch"


@pytest.mark.gpu
@pytest.mark.parametrize("gated", [False, True])
def test_epilogue_direct_calls_compute_the_new_operands(gated: bool) -> None:
    from kernels.epilogue import gated_matmul_with, matmul_bias_with

    config = kernels.Config.make(BLOCK_M=32, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=4, num_warps=4, num_stages=3)
    a = torch.empty(100, 512, device="cuda", dtype=torch.float16)
    b = torch.empty(512, 2 * 96 if gated else 96, device="cuda", dtype=torch.float16)
    bias = torch.randn(96, device="cuda", dtype=torch.float16)

    def run() -> torch.Tensor:
        return gated_matmul_with(config, a, b) if gated else matmul_bias_with(config, a, b, bias)

    def expected() -> torch.Tensor:
        c = a.float() @ b.float()
        return torch.nn.functional.silu(c[:, :96]) * c[:, 96:] if gated else c + bias.float()

    _refill(a, b)
    run()
    for _ in range(2):
        _refill(a, b)
        torch.testing.assert_close(run().float(), expected(), atol=3e-2, rtol=2e-2)
    launches = [launch for key, launch in gemm.LAUNCHES._entries.items()
                if key[:3] == ("epilogue", config, gated) and key[6:9] == (100, 96, 512)]
    assert len(launches) == 1 and launches[0].direct_calls == 2
