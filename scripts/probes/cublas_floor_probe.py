"""How low can a cuBLAS call's host time go? Loops timed in C++ (no Python per call) against Python's.

Rows, per call of a 64x64x64 fp16 product (the GPU finishes each before the host issues the next):
- Python: ``torch.matmul`` and ``torch.mm``; our C++ path's ``try_mm`` where a signature is served;
- C++ loops: ``at::mm`` (the dispatcher, autograd and torch's addmm checks), ``at::mm_out`` into one
  output, ``at::empty`` alone (the allocator), ``zero_`` of a small tensor (one launch of torch's own
  kernel), and, where the cuBLAS headers are on this machine, ``cublasGemmEx`` on torch's handle
  (nothing of torch but the handle and the allocator);
- one C call from Python of ``at::mm`` and of that ``cublasGemmEx`` call (what a C entry point costs).

What it answers: how much of a host-bound call the dispatcher and torch's checks cost above cuBLAS's own
call, that is, how much faster than torch.matmul a C++ path could serve a cuBLAS signature.

    PYTHONPATH=. python3 scripts/probes/cublas_floor_probe.py [--rounds 15] [--size 64]
"""

from __future__ import annotations

import argparse
import glob
import os
import statistics
import sys
import time

import torch
import triton
from torch.utils.cpp_extension import load_inline

# A C++ loop's host time per call (needs <chrono>); cublaslt_host_probe.py compiles it too.
PER_CALL_US = r"""
template <typename F>
double per_call_us(int64_t calls, F&& f) {
  const auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < calls; ++i) f();
  torch::cuda::synchronize();
  return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / calls;
}
"""

_SOURCE = r"""
#include <torch/extension.h>
#include <chrono>
#ifdef WITH_CUBLAS
#include <ATen/cuda/CUDAContext.h>
#include <cublas_v2.h>
#endif
""" + PER_CALL_US + r"""
at::Tensor mm(const at::Tensor& a, const at::Tensor& b) { return at::mm(a, b); }
double loop_mm(at::Tensor a, at::Tensor b, int64_t calls) {
  return per_call_us(calls, [&] { at::mm(a, b); });
}
double loop_mm_out(at::Tensor a, at::Tensor b, int64_t calls) {
  at::Tensor c = at::mm(a, b);
  return per_call_us(calls, [&] { at::mm_out(c, a, b); });
}
double loop_empty(at::Tensor a, int64_t calls) {
  return per_call_us(calls, [&] { at::empty({a.size(0), a.size(1)}, a.options()); });
}
double loop_zero(at::Tensor a, int64_t calls) {
  return per_call_us(calls, [&] { a.zero_(); });
}
bool has_cublas() {
#ifdef WITH_CUBLAS
  return true;
#else
  return false;
#endif
}
#ifdef WITH_CUBLAS
// Row-major a [M, K] and b [K, N], both contiguous: column-major c^T = b^T a^T.
at::Tensor gemmex_mm(const at::Tensor& a, const at::Tensor& b) {
  const int m = a.size(0), k = a.size(1), n = b.size(1);
  at::Tensor c = at::empty({m, n}, a.options());
  const float alpha = 1.0f, beta = 0.0f;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  TORCH_CHECK(cublasGemmEx(handle, CUBLAS_OP_N, CUBLAS_OP_N, n, m, k, &alpha, b.const_data_ptr(), CUDA_R_16F, n,
                           a.const_data_ptr(), CUDA_R_16F, k, &beta, c.mutable_data_ptr(), CUDA_R_16F, n,
                           CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP) == CUBLAS_STATUS_SUCCESS);
  return c;
}
double loop_gemmex(at::Tensor a, at::Tensor b, int64_t calls) {
  return per_call_us(calls, [&] { gemmex_mm(a, b); });
}
#endif

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mm", &mm);
  m.def("loop_mm", &loop_mm);
  m.def("loop_mm_out", &loop_mm_out);
  m.def("loop_empty", &loop_empty);
  m.def("loop_zero", &loop_zero);
  m.def("has_cublas", &has_cublas);
#ifdef WITH_CUBLAS
  m.def("gemmex_mm", &gemmex_mm);
  m.def("loop_gemmex", &loop_gemmex);
#endif
}
"""


def cuda_include_dirs() -> list[str]:
    """Folders holding cublas_v2.h and cuda_runtime_api.h: the toolkit's, or the pip wheels' (nvidia/*)."""
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"] + [p for p in sys.path if p]
    found: list[str] = []
    for header in ("cublas_v2.h", "cuda_runtime_api.h"):
        for root in roots:
            hits = glob.glob(os.path.join(root, "include", header)) + glob.glob(
                os.path.join(root, "nvidia", "**", "include", header), recursive=True)
            if hits:
                found.append(os.path.dirname(hits[0]))
                break
    return found if len(found) == 2 else []


def cublas_library() -> str | None:
    roots = [os.environ.get("CUDA_HOME", ""), "/usr/local/cuda"] + [p for p in sys.path if p]
    for root in roots:
        hits = sorted(glob.glob(os.path.join(root, "lib64", "libcublas.so*")) + glob.glob(
            os.path.join(root, "nvidia", "**", "lib", "libcublas.so*"), recursive=True))
        if hits:
            return hits[0]
    return None


def build():
    """The probe's extension: with the cuBLAS rows where this machine can build them, else without."""
    includes, library = cuda_include_dirs(), cublas_library()
    print(f"# cuBLAS headers: {includes or 'not found'}; library: {library}", flush=True)
    if includes and library:
        torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
        try:
            return load_inline(name="cublas_floor_probe_blas", cpp_sources=[_SOURCE],
                               extra_cflags=["-O2", "-DWITH_CUBLAS"], extra_include_paths=includes,
                               extra_ldflags=[f"-L{torch_lib}", "-ltorch_cuda", "-lc10_cuda", library],
                               verbose=False)
        except Exception as error:  # a probe: the at::mm rows stand without these
            print(f"# build with cuBLAS failed: {str(error)[-2000:]}", flush=True)
    return load_inline(name="cublas_floor_probe", cpp_sources=[_SOURCE], extra_cflags=["-O2"], verbose=False)


def python_us(call, calls: int) -> float:
    started = time.perf_counter()
    for _ in range(calls):
        call()
    torch.cuda.synchronize()
    return (time.perf_counter() - started) * 1e6 / calls


def interleaved(rows: dict, rounds: int) -> dict[str, list[float]]:
    """Each row's samples over ``rounds`` rounds after a warm-up, the rows' order reversed every other round."""
    for timed in rows.values():
        timed()
    samples: dict[str, list[float]] = {name: [] for name in rows}
    items = list(rows.items())
    for round_ in range(rounds):
        for name, timed in items if round_ % 2 == 0 else items[::-1]:
            samples[name].append(timed())
    return samples


def print_against_torch(samples: dict[str, list[float]], title: str = "", indent: str = "") -> None:
    """Median, least and median ratio to the row "python torch.matmul" of the same round, per row."""
    base = samples["python torch.matmul"]
    print(f"{title}{'row':32} {'us/call':>8} {'min':>7} {'vs torch.matmul':>16}")
    for name, values in samples.items():
        ratio = statistics.median(v / t for v, t in zip(values, base))
        print(f"{indent}{name:32} {statistics.median(values):8.2f} {min(values):7.2f} {ratio:15.3f}x", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--calls", type=int, default=300)
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d')}, {args.size}^3 fp16, {args.calls} calls x {args.rounds} rounds", flush=True)
    started = time.monotonic()
    native = build()
    print(f"# built in {time.monotonic() - started:.1f} s", flush=True)
    a = torch.randn(args.size, args.size, device="cuda", dtype=torch.float16)
    b = torch.randn(args.size, args.size, device="cuda", dtype=torch.float16)
    n = args.calls
    rows = {
        "python torch.matmul": lambda: python_us(lambda: torch.matmul(a, b), n),
        "python torch.mm": lambda: python_us(lambda: torch.mm(a, b), n),
        "python at::mm (one C call)": lambda: python_us(lambda: native.mm(a, b), n),
        "c++ at::mm": lambda: native.loop_mm(a, b, n),
        "c++ at::mm_out": lambda: native.loop_mm_out(a, b, n),
        "c++ at::empty": lambda: native.loop_empty(a, n),
        "c++ zero_ (one launch)": lambda: native.loop_zero(a, n),
    }
    if native.has_cublas():
        reference = torch.mm(a, b)
        error = (native.gemmex_mm(a, b).float() - reference.float()).abs().max().item()
        print(f"# gemmex_mm max abs error vs torch.mm: {error:.3g}", flush=True)
        rows["python gemmex_mm (one C call)"] = lambda: python_us(lambda: native.gemmex_mm(a, b), n)
        rows["c++ cublasGemmEx"] = lambda: native.loop_gemmex(a, b, n)
    print_against_torch(interleaved(rows, args.rounds))


if __name__ == "__main__":
    main()
