"""Probe: can a kernel beat cuBLAS on a few rows of A (M = 8 to 32) against a K-major weight?

At M = 1 the `gemv` variant (thin column blocks, long K runs, no tensor cores) beat cuBLAS by 1.02-1.41x
under the tuner's graph timer (docs/BENCHMARKS.md, twentieth session). At M = 8 and 32, cuBLAS takes
as long as at M = 1 (the weight's bytes bound both), yet it won 33 of the 58 M = 8 graph records and 42
of the 58 M = 32 ones, and the tiled winners are 1.02-1.13x. Two designs, timed here beside cuBLAS and
the shipped table (``kernels.matmul``):

- ``rows``: gemv with every row of A in one program: each B element loaded is multiplied by all M rows
  (ROWS x GEMV_BLOCK_N x GEMV_BLOCK_K fp32 partial sums, summed at the end), on CUDA cores;
- ``swap``: C^T = W @ A^T on tensor cores: the weight's rows fill the MMA's M side (64-128, where Hopper's
  warp-group MMA runs) and the few rows of A its N side (16-32), each program over all of K.

Timers as in gemv_probe.py: ``graph`` (one call per replay, L2 flushed) and ``stream`` (rotating operands).

    python3 scripts/probes/small_m_probe.py [--json FILE] [--m 8,32]
"""

from __future__ import annotations

import argparse
import functools
import itertools

import torch
import triton
import triton.language as tl

from tuner import timing

from gemv_probe import baseline_sides, best_per_kind, operands, report, time_sides  # noqa: E402  (run from scripts/probes or with it on sys.path)


@triton.jit
def _rows(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
          ROWS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_m = tl.arange(0, ROWS)
    offs_n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_bn = offs_n % N
    rows = offs_m % M  # rows past M wrap back in range; their sums are never stored
    acc = tl.zeros((ROWS, BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        a = tl.load(a_ptr + rows[:, None] * stride_am + kk[None, :] * stride_ak, mask=kk[None, :] < K, other=0.0)
        b = tl.load(b_ptr + kk[None, :] * stride_bk + offs_bn[:, None] * stride_bn, mask=kk[None, :] < K, other=0.0)
        acc += a.to(tl.float32)[:, None, :] * b.to(tl.float32)[None, :, :]
    c = tl.sum(acc, axis=2)
    tl.store(c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :] * stride_cn, c.to(c_ptr.dtype.element_ty),
             mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


@triton.jit
def _swap(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
          BLOCK_W: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    offs_w = tl.program_id(0) * BLOCK_W + tl.arange(0, BLOCK_W)
    offs_t = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
    offs_bw = offs_w % N
    offs_at = offs_t % M
    acc = tl.zeros((BLOCK_W, BLOCK_T), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + tl.arange(0, BLOCK_K)
        w = tl.load(b_ptr + offs_bw[:, None] * stride_bn + kk[None, :] * stride_bk, mask=kk[None, :] < K, other=0.0)
        x = tl.load(a_ptr + offs_at[None, :] * stride_am + kk[:, None] * stride_ak, mask=kk[:, None] < K, other=0.0)
        acc = tl.dot(w, x, acc)
    tl.store(c_ptr + offs_t[None, :] * stride_cm + offs_w[:, None] * stride_cn, acc.to(c_ptr.dtype.element_ty),
             mask=(offs_t[None, :] < M) & (offs_w[:, None] < N))


def rows_call(a, b, c, bn: int, bk: int, warps: int):
    m, n, k = a.shape[0], b.shape[1], b.shape[0]
    grid = (triton.cdiv(n, bn),)
    return lambda: _rows[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                               ROWS=triton.next_power_of_2(m), BLOCK_N=bn, BLOCK_K=bk, num_warps=warps, num_stages=1)


def swap_call(a, b, c, bw: int, bt: int, bk: int, warps: int, stages: int):
    m, n, k = a.shape[0], b.shape[1], b.shape[0]
    grid = (triton.cdiv(n, bw), triton.cdiv(m, bt))
    return lambda: _swap[grid](a, b, c, m, n, k, *a.stride(), *b.stride(), *c.stride(),
                               BLOCK_W=bw, BLOCK_T=bt, BLOCK_K=bk, num_warps=warps, num_stages=stages)


def grids(m: int, k: int) -> list[tuple[str, tuple]]:
    rows = triton.next_power_of_2(m)
    out = [("rows", (bn, bk, w)) for bn, bk, w in itertools.product((1, 2, 4), (256, 512, 1024, 2048), (4, 8))
           if rows * bn * bk // (32 * w) <= 128 and bk <= max(256, triton.next_power_of_2(k))]
    out += [("swap", (bw, bt, bk, w, s)) for bw, bt, bk, w, s in
            itertools.product((64, 128), (16, 32), (64, 128, 256), (4,), (3, 4, 6))
            if bt >= min(32, triton.next_power_of_2(max(m, 16))) and (bw * bk + bk * bt) * 2 * s <= 200_000]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json")
    parser.add_argument("--m", default="8,32")
    args = parser.parse_args()
    torch.manual_seed(0)
    weights_nk = [(8192, 8192), (28672, 8192), (8192, 28672), (1024, 8192), (3584, 3584), (2048, 2048),
                  (576, 2048), (14336, 3584), (5120, 5120)]
    shapes = [("bf16", m, n, k) for m in map(int, args.m.split(",")) for n, k in weights_nk]
    l2 = timing.l2_bytes()
    results = []
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}")
    for dtype_name, m, n, k in shapes:
        problem, sets, weights, xs, outs, ref = operands(dtype_name, m, n, k, l2)

        def call(kind, knobs, i):
            maker = rows_call if kind == "rows" else swap_call
            return maker(xs[i], weights[i].t(), outs[i], *knobs)

        best = best_per_kind(grids(m, k), call, outs[0], ref)
        sides = baseline_sides(xs, weights) + [(f"{kind} {knobs}", functools.partial(call, kind, knobs))
                                               for kind, (ms, knobs) in sorted(best.items())]
        results.append(time_sides(problem.key, sides, sets))
        weights = xs = outs = []
        torch.cuda.empty_cache()
    report(results, args.json)

if __name__ == "__main__":
    main()
