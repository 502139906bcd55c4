"""Could a cuBLAS call cost less host time through cublasLt with a plan made once per signature?

cuBLAS's own cublasGemmEx is 82% of torch.matmul's host time on the H100 box (cublas_floor_probe.py,
2026-11-25), and one launch of torch's fill kernel costs 5 us there. cublasLt splits what GemmEx does per call
(descriptors, the algorithm's heuristic) from the launch; made once and kept, only cublasLtMatmul is left.
Rows per problem (row-major A; B contiguous, or ``w.t()`` for layout nt), in C++ loops (no Python per call)
and as one C call from Python:
- torch.matmul; torch.matmul with ``torch.backends.cuda.preferred_blas_library("cublaslt")``;
- ``at::mm``; ``cublasGemmEx`` on torch's handle;
- cublasLt with descriptors and the heuristic made on every call (what a library without a cache pays);
- cublasLt with a plan made once (descriptors, algorithm, workspace), output from ``at::empty`` each call.
A GPU-bound problem checks that the plan's algorithm runs as fast on the GPU as at::mm's.

    PYTHONPATH=. python3 scripts/probes/cublaslt_host_probe.py [--rounds 11]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import triton
from torch.utils.cpp_extension import load_inline

sys.path.insert(0, os.path.dirname(__file__))
from cublas_floor_probe import (PER_CALL_US, cublas_library, cuda_include_dirs, interleaved,  # noqa: E402
                                print_against_torch, python_us)

_SOURCE = r"""
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAStream.h>
#include <cublas_v2.h>
#include <cublasLt.h>
#include <chrono>
#include <memory>

#define CHECK_LT(x) TORCH_CHECK((x) == CUBLAS_STATUS_SUCCESS, #x " failed")
""" + PER_CALL_US + r"""
static cudaDataType_t dtype_of(const at::Tensor& t) {
  return t.scalar_type() == at::kHalf ? CUDA_R_16F : CUDA_R_16BF;
}

// Row-major c[M,N] = a[M,K] b[K,N] is column-major c^T[N,M] = b^T a^T. b is contiguous [K,N] (column-major
// [N,K], ld N, no transpose) or w.t() of a contiguous w[N,K] (column-major [K,N], ld K, transposed).
struct Shape {
  int64_t m, n, k;
  bool b_transposed;
};
static Shape shape_of(const at::Tensor& a, const at::Tensor& b) {
  TORCH_CHECK(a.is_contiguous(), "a must be contiguous");
  const bool bt = !b.is_contiguous();
  TORCH_CHECK(!bt || b.t().is_contiguous(), "b must be contiguous or w.t()");
  return {a.size(0), b.size(1), a.size(1), bt};
}

at::Tensor gemmex(const at::Tensor& a, const at::Tensor& b) {
  const Shape s = shape_of(a, b);
  at::Tensor c = at::empty({s.m, s.n}, a.options());
  const float alpha = 1.0f, beta = 0.0f;
  cublasHandle_t handle = at::cuda::getCurrentCUDABlasHandle();
  const auto t = dtype_of(a);
  TORCH_CHECK(cublasGemmEx(handle, s.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, s.n, s.m, s.k, &alpha,
                           b.const_data_ptr(), t, s.b_transposed ? s.k : s.n, a.const_data_ptr(), t, s.k, &beta,
                           c.mutable_data_ptr(), t, s.n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT_TENSOR_OP)
              == CUBLAS_STATUS_SUCCESS);
  return c;
}

struct LtPlan {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
  cublasLtMatmulAlgo_t algo;
  at::Tensor workspace;
  size_t workspace_bytes = 0;
  ~LtPlan() {
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

static const size_t kWorkspace = 32 << 20;

static std::unique_ptr<LtPlan> make_plan(const at::Tensor& a, const at::Tensor& b, const at::Tensor& workspace) {
  const Shape s = shape_of(a, b);
  auto plan = std::make_unique<LtPlan>();
  const auto t = dtype_of(a);
  CHECK_LT(cublasLtMatmulDescCreate(&plan->op, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  cublasOperation_t ta = s.b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, tb = CUBLAS_OP_N;
  CHECK_LT(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)));
  CHECK_LT(cublasLtMatmulDescSetAttribute(plan->op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)));
  // "A" of the column-major product is b^T, "B" is a^T.
  if (s.b_transposed) {
    CHECK_LT(cublasLtMatrixLayoutCreate(&plan->la, t, s.k, s.n, s.k));
  } else {
    CHECK_LT(cublasLtMatrixLayoutCreate(&plan->la, t, s.n, s.k, s.n));
  }
  CHECK_LT(cublasLtMatrixLayoutCreate(&plan->lb, t, s.k, s.m, s.k));
  CHECK_LT(cublasLtMatrixLayoutCreate(&plan->lc, t, s.n, s.m, s.n));
  cublasLtMatmulPreference_t pref;
  CHECK_LT(cublasLtMatmulPreferenceCreate(&pref));
  size_t bytes = workspace.numel();
  CHECK_LT(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &bytes, sizeof(bytes)));
  cublasLtMatmulHeuristicResult_t result;
  int returned = 0;
  auto lt = (cublasLtHandle_t)at::cuda::getCurrentCUDABlasLtHandle();
  CHECK_LT(cublasLtMatmulAlgoGetHeuristic(lt, plan->op, plan->la, plan->lb, plan->lc, plan->lc, pref, 1, &result,
                                          &returned));
  cublasLtMatmulPreferenceDestroy(pref);
  TORCH_CHECK(returned > 0, "no cublasLt algorithm");
  plan->algo = result.algo;
  plan->workspace = workspace;
  plan->workspace_bytes = result.workspaceSize;
  return plan;
}

static at::Tensor run_plan(const LtPlan& plan, const at::Tensor& a, const at::Tensor& b) {
  at::Tensor c = at::empty({a.size(0), b.size(1)}, a.options());
  const float alpha = 1.0f, beta = 0.0f;
  auto lt = (cublasLtHandle_t)at::cuda::getCurrentCUDABlasLtHandle();
  CHECK_LT(cublasLtMatmul(lt, plan.op, &alpha, b.const_data_ptr(), plan.la, a.const_data_ptr(), plan.lb, &beta,
                          c.mutable_data_ptr(), plan.lc, c.mutable_data_ptr(), plan.lc, &plan.algo,
                          plan.workspace.mutable_data_ptr(), plan.workspace_bytes,
                          at::cuda::getCurrentCUDAStream()));
  return c;
}

static std::unique_ptr<LtPlan> g_plan;

void plan(const at::Tensor& a, const at::Tensor& b) {
  g_plan = make_plan(a, b, at::empty({(int64_t)kWorkspace}, a.options().dtype(at::kByte)));
}
at::Tensor lt_cached(const at::Tensor& a, const at::Tensor& b) { return run_plan(*g_plan, a, b); }
at::Tensor lt_fresh(const at::Tensor& a, const at::Tensor& b) {
  auto fresh = make_plan(a, b, g_plan->workspace);
  return run_plan(*fresh, a, b);
}
at::Tensor mm(const at::Tensor& a, const at::Tensor& b) { return at::mm(a, b); }

double loop_mm(at::Tensor a, at::Tensor b, int64_t calls) { return per_call_us(calls, [&] { at::mm(a, b); }); }
double loop_gemmex(at::Tensor a, at::Tensor b, int64_t calls) { return per_call_us(calls, [&] { gemmex(a, b); }); }
double loop_lt_cached(at::Tensor a, at::Tensor b, int64_t calls) {
  return per_call_us(calls, [&] { run_plan(*g_plan, a, b); });
}
double loop_lt_fresh(at::Tensor a, at::Tensor b, int64_t calls) {
  return per_call_us(calls, [&] { lt_fresh(a, b); });
}

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("plan", &plan);
  m.def("lt_cached", &lt_cached);
  m.def("lt_fresh", &lt_fresh);
  m.def("gemmex", &gemmex);
  m.def("mm", &mm);
  m.def("loop_mm", &loop_mm);
  m.def("loop_gemmex", &loop_gemmex);
  m.def("loop_lt_cached", &loop_lt_cached);
  m.def("loop_lt_fresh", &loop_lt_fresh);
}
"""

PROBLEMS = (("fp16", 64, 64, 64, "nn"), ("bf16", 8, 3072, 2048, "nt"), ("bf16", 32, 576, 2048, "nt"),
            ("fp16", 128, 2816, 2048, "nt"), ("bf16", 2048, 2048, 2048, "nt"), ("bf16", 4096, 4096, 4096, "nt"))


def build():
    includes, library = cuda_include_dirs(), cublas_library()
    if not includes or not library:
        raise SystemExit(f"cuBLAS headers or library not found (headers {includes}, library {library})")
    lt_library = library.replace("libcublas.so", "libcublasLt.so")
    torch_lib = os.path.join(os.path.dirname(torch.__file__), "lib")
    return load_inline(name="cublaslt_host_probe", cpp_sources=[_SOURCE], extra_cflags=["-O2"],
                       extra_include_paths=includes,
                       extra_ldflags=[f"-L{torch_lib}", "-ltorch_cuda", "-lc10_cuda", library, lt_library],
                       verbose=False)


def lt_matmul(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        return torch.matmul(a, b)
    finally:
        torch.backends.cuda.preferred_blas_library("cublas")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=11)
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
          f"{time.strftime('%Y-%m-%d')}, {args.rounds} rounds", flush=True)
    started = time.monotonic()
    native = build()
    print(f"# built in {time.monotonic() - started:.1f} s", flush=True)
    for dtype_name, m, n, k, layout in PROBLEMS:
        dtype = torch.float16 if dtype_name == "fp16" else torch.bfloat16
        a = torch.randn(m, k, device="cuda", dtype=dtype)
        b = torch.randn(n, k, device="cuda", dtype=dtype).t() if layout == "nt" else torch.randn(
            k, n, device="cuda", dtype=dtype)
        native.plan(a, b)
        reference = torch.mm(a, b).float()
        scale = reference.abs().max().item()
        for name, fn in (("gemmex", native.gemmex), ("lt_cached", native.lt_cached), ("lt_fresh", native.lt_fresh)):
            error = (fn(a, b).float() - reference).abs().max().item() / scale
            assert error < 1e-2, (name, error)
        calls = 300 if m * n * k < 1 << 30 else 30
        rows = {
            "python torch.matmul": lambda: python_us(lambda: torch.matmul(a, b), calls),
            "python torch.matmul (cublaslt)": lambda: python_us(lambda: lt_matmul(a, b), calls),
            "python at::mm (one C call)": lambda: python_us(lambda: native.mm(a, b), calls),
            "python Lt plan (one C call)": lambda: python_us(lambda: native.lt_cached(a, b), calls),
            "c++ at::mm": lambda: native.loop_mm(a, b, calls),
            "c++ cublasGemmEx": lambda: native.loop_gemmex(a, b, calls),
            "c++ Lt, plan each call": lambda: native.loop_lt_fresh(a, b, calls),
            "c++ Lt, plan kept": lambda: native.loop_lt_cached(a, b, calls),
        }
        print_against_torch(interleaved(rows, args.rounds), title=f"{dtype_name} {m}x{n}x{k} {layout}: ", indent="  ")


if __name__ == "__main__":
    main()
