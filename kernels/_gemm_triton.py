"""The dense GEMM's Triton code: tile order, the tiled, split-K, one-row (gemv) and persistent TMA kernels.

The search space, constraints and launchers that use these live in ``gemm.py``.
"""

from __future__ import annotations

import triton
import triton.language as tl

# ----------------------------------------------------------------------------------------------

@triton.jit
def _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M: tl.constexpr):
    """Tile index → (pid_m, pid_n), walking GROUP_SIZE_M rows of tiles column by column (L2 reuse)."""
    num_pid_in_group = GROUP_SIZE_M * num_pid_n
    group_id = tile_id // num_pid_in_group
    first_pid_m = group_id * GROUP_SIZE_M
    group_size_m = min(num_pid_m - first_pid_m, GROUP_SIZE_M)
    pid_m = first_pid_m + ((tile_id % num_pid_in_group) % group_size_m)
    pid_n = (tile_id % num_pid_in_group) // group_size_m
    return pid_m, pid_n


@triton.jit
def _tile_offsets(pid_m, pid_n, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_64: tl.constexpr):
    """Row and column indices of one output tile; 64-bit where an index may pass 2**31."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if INDEX_64:
        offs_m = offs_m.to(tl.int64)
        offs_n = offs_n.to(tl.int64)
    return offs_m, offs_n


@triton.jit
def _aligned(size, ALIGN: tl.constexpr):
    """``size`` itself, known to the compiler as a multiple of ALIGN (the launcher checked it is)."""
    if ALIGN > 1:
        size = size // ALIGN * ALIGN
    return size


@triton.jit
def _scaled(offs, stride, ALIGN: tl.constexpr):
    """2-D offsets ``offs * stride``; with ALIGN > 1, known to be multiples of ALIGN.

    The launcher passes ALIGN > 1 only when the operand's non-unit stride is a multiple of it; a unit
    stride multiplies an arange that starts on a tile boundary, whose runs start on multiples of it too.
    """
    scaled = offs * stride
    if ALIGN > 1:
        scaled = tl.multiple_of(scaled, [ALIGN, ALIGN])
    return scaled


@triton.jit
def _tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
              pid_m, pid_n, k_begin, k_end,
              BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
              EVEN_K: tl.constexpr, INDEX_64: tl.constexpr, DOT_PRECISION: tl.constexpr,
              ALIGN: tl.constexpr, WRAP_ALIGNED: tl.constexpr):
    """fp32 accumulator of one output tile over the K blocks [k_begin, k_end)."""
    offs_m, offs_n = _tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N, INDEX_64)
    # Wrapping rows/columns past the edge back into range keeps every load in bounds without a mask
    # on M or N (the wrapped results are never stored), so loads stay wide.
    offs_am = offs_m % M
    offs_bn = offs_n % N
    if WRAP_ALIGNED:
        # Claiming a whole tile contiguous is only true up to the wrap; the 16-byte vectors stay
        # right when the wrap falls on a vector boundary, which the launcher checked (the wrapped
        # dimension, where it is the contiguous one, is a multiple of 16 bytes). Else the loads
        # along it stay narrow: a vector across the wrap would be misaligned.
        offs_am = tl.max_contiguous(tl.multiple_of(offs_am, BLOCK_M), BLOCK_M)
        offs_bn = tl.max_contiguous(tl.multiple_of(offs_bn, BLOCK_N), BLOCK_N)
    offs_k = k_begin * BLOCK_K + tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + _scaled(offs_am[:, None], stride_am, ALIGN) + _scaled(offs_k[None, :], stride_ak, ALIGN)
    b_ptrs = b_ptr + _scaled(offs_k[:, None], stride_bk, ALIGN) + _scaled(offs_bn[None, :], stride_bn, ALIGN)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for kb in range(k_begin, k_end):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = _aligned(K, ALIGN) - kb * BLOCK_K
            a = tl.load(a_ptrs, mask=tl.arange(0, BLOCK_K)[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=tl.arange(0, BLOCK_K)[:, None] < k_left, other=0.0)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    return acc


@triton.jit
def _store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, INDEX_64: tl.constexpr, C_ALIGN: tl.constexpr):
    offs_m, offs_n = _tile_offsets(pid_m, pid_n, BLOCK_M, BLOCK_N, INDEX_64)
    c_ptrs = c_ptr + _scaled(offs_m[:, None], stride_cm, C_ALIGN) + _scaled(offs_n[None, :], stride_cn, C_ALIGN)
    mask = (offs_m[:, None] < M) & (offs_n[None, :] < _aligned(N, C_ALIGN))
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _tiled_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                  stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                  GROUP_SIZE_M: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr,
                  DOT_PRECISION: tl.constexpr, ALIGN: tl.constexpr, C_ALIGN: tl.constexpr,
                  WRAP_ALIGNED: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _grouped_tile(tl.program_id(0), num_pid_m, num_pid_n, GROUP_SIZE_M)
    acc = _tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    pid_m, pid_n, 0, tl.cdiv(K, BLOCK_K),
                    BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INDEX_64, DOT_PRECISION, ALIGN, WRAP_ALIGNED)
    _store_tile(c_ptr, acc, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M, BLOCK_N, INDEX_64, C_ALIGN)


@triton.jit
def _splitk_kernel(a_ptr, b_ptr, c_ptr, partial_ptr, arrivals_ptr, M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                   GROUP_SIZE_M: tl.constexpr, SPLIT_K: tl.constexpr, EVEN_K: tl.constexpr,
                   INDEX_64: tl.constexpr, DOT_PRECISION: tl.constexpr, ALIGN: tl.constexpr,
                   C_ALIGN: tl.constexpr, WRAP_ALIGNED: tl.constexpr):
    tile_id = tl.program_id(0)
    split = tl.program_id(1)
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    pid_m, pid_n = _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
    k_blocks = tl.cdiv(K, BLOCK_K)
    per_split = tl.cdiv(k_blocks, SPLIT_K)
    k_begin = split * per_split
    k_end = min(k_begin + per_split, k_blocks)
    acc = _tile_dot(a_ptr, b_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                    pid_m, pid_n, k_begin, k_end,
                    BLOCK_M, BLOCK_N, BLOCK_K, EVEN_K, INDEX_64, DOT_PRECISION, ALIGN, WRAP_ALIGNED)
    # Each tile owns SPLIT_K contiguous fp32 blocks of the workspace; full blocks need no mask.
    local = tl.arange(0, BLOCK_M)[:, None] * BLOCK_N + tl.arange(0, BLOCK_N)[None, :]
    tile_base = partial_ptr + tile_id.to(tl.int64) * (SPLIT_K * BLOCK_M * BLOCK_N)
    tl.store(tile_base + split * (BLOCK_M * BLOCK_N) + local, acc)
    # The barrier orders every thread's partial store before the release; the program that
    # arrives last (acquire) sums the slices, writes C and re-arms the counter for the next call.
    tl.debug_barrier()
    arrived = tl.atomic_add(arrivals_ptr + tile_id, 1, sem="acq_rel")
    if arrived == SPLIT_K - 1:
        total = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            total += tl.load(tile_base + s * (BLOCK_M * BLOCK_N) + local, cache_modifier=".cg")
        _store_tile(c_ptr, total, M, N, stride_cm, stride_cn, pid_m, pid_n, BLOCK_M, BLOCK_N, INDEX_64, C_ALIGN)
        tl.atomic_xchg(arrivals_ptr + tile_id, 0)


@triton.jit
def _gemv_row(a_row_ptr, b_ptr, N, K, stride_ak, stride_bk, stride_bn, pid_n,
              BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """fp32 dot products of one row of A with BLOCK_N columns of B over all of K: a multiply
    and a sum per element, no tensor cores. One row streams B once; what bounds it is how many loads are
    in flight, so the tile is thin in N and long in K, and the sum over K waits until the end."""
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    if INDEX_64:
        offs_n = offs_n.to(tl.int64)
    # Columns past the edge wrap back into range: every load stays in bounds without a mask on N
    # (the wrapped sums are never stored).
    offs_bn = offs_n % N
    acc = tl.zeros((BLOCK_N, BLOCK_K), dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        if INDEX_64:
            offs_k = offs_k.to(tl.int64)
        a_ptrs = a_row_ptr + offs_k * stride_ak
        b_ptrs = b_ptr + offs_k[None, :] * stride_bk + offs_bn[:, None] * stride_bn
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            a = tl.load(a_ptrs, mask=offs_k < K, other=0.0)
            b = tl.load(b_ptrs, mask=offs_k[None, :] < K, other=0.0)
        acc += b.to(tl.float32) * a.to(tl.float32)[None, :]
    return tl.sum(acc, axis=1)


@triton.jit
def _gemv_kernel(a_ptr, b_ptr, c_ptr, M, N, K,
                 stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr, INDEX_64: tl.constexpr):
    """C = A @ B one row of A at a time (grid: column blocks x rows), each program over all of K: a thin
    block of columns per program makes thousands of programs, and so many loads in flight."""
    pid_n = tl.program_id(0)
    row = tl.program_id(1)
    if INDEX_64:
        row = row.to(tl.int64)
    acc = _gemv_row(a_ptr + row * stride_am, b_ptr, N, K, stride_ak, stride_bk, stride_bn, pid_n,
                    BLOCK_N, BLOCK_K, EVEN_K, INDEX_64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tl.store(c_ptr + row * stride_cm + offs_n * stride_cn, acc.to(c_ptr.dtype.element_ty), mask=offs_n < N)


@triton.jit
def _tma_kernel(a_desc, b_desc, c_desc, M, N, K,
                BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                GROUP_SIZE_M: tl.constexpr, NUM_SM: tl.constexpr, B_KMAJOR: tl.constexpr,
                FLATTEN: tl.constexpr, EPILOGUE_SUBTILE: tl.constexpr, DOT_PRECISION: tl.constexpr):
    num_pid_m = tl.cdiv(M, BLOCK_M)
    num_pid_n = tl.cdiv(N, BLOCK_N)
    k_blocks = tl.cdiv(K, BLOCK_K)
    num_tiles = num_pid_m * num_pid_n
    for tile_id in tl.range(tl.program_id(0), num_tiles, NUM_SM, flatten=FLATTEN):
        pid_m, pid_n = _grouped_tile(tile_id, num_pid_m, num_pid_n, GROUP_SIZE_M)
        off_m = pid_m * BLOCK_M
        off_n = pid_n * BLOCK_N
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for kb in range(k_blocks):
            off_k = kb * BLOCK_K
            a = a_desc.load([off_m, off_k])
            if B_KMAJOR:
                acc = tl.dot(a, b_desc.load([off_n, off_k]).T, acc, input_precision=DOT_PRECISION)
            else:
                acc = tl.dot(a, b_desc.load([off_k, off_n]), acc, input_precision=DOT_PRECISION)
        if EPILOGUE_SUBTILE:
            # Two half-width stores need half the shared memory for the epilogue.
            halves = tl.permute(tl.reshape(acc, (BLOCK_M, 2, BLOCK_N // 2)), (0, 2, 1))
            left, right = tl.split(halves)
            c_desc.store([off_m, off_n], left.to(c_desc.dtype))
            c_desc.store([off_m, off_n + BLOCK_N // 2], right.to(c_desc.dtype))
        else:
            c_desc.store([off_m, off_n], acc.to(c_desc.dtype))


@triton.jit
def _pad_rows(src_ptr, dst_ptr, rows, cols, dst_row0, dst_rows, dst_cols, stride_r, stride_c, tile_r, tile_c,
              BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """One (BLOCK_R, BLOCK_C) tile of a padding copy: src inside (rows, cols), 0 elsewhere in
    (dst_rows, dst_cols), the tile's rows landing from ``dst_row0`` on: one pass over both buffers.

    The source rows may start anywhere (4099 fp16 values: odd byte offsets), so its loads are
    narrow, but a warp's loads still cover contiguous bytes; the destination is row-major with
    aligned rows, so its stores are wide."""
    # 64-bit offsets: a column-major source steps rows * cols apart, past 2**31 on large operands.
    offs_r = (tile_r * BLOCK_R + tl.arange(0, BLOCK_R)).to(tl.int64)
    offs_c = (tile_c * BLOCK_C + tl.arange(0, BLOCK_C)).to(tl.int64)
    values = tl.load(src_ptr + offs_r[:, None] * stride_r + offs_c[None, :] * stride_c,
                     mask=(offs_r[:, None] < rows) & (offs_c[None, :] < cols), other=0.0)
    tl.store(dst_ptr + (dst_row0 + offs_r[:, None]) * dst_cols + offs_c[None, :], values,
             mask=(offs_r[:, None] < dst_rows) & (offs_c[None, :] < dst_cols))


@triton.jit
def _pad_pair_kernel(a_ptr, w_ptr, dst_ptr, m, n, k, k_padded, stride_am, stride_ak, stride_wn, stride_wk,
                     a_programs, tiles_c, BLOCK_R: tl.constexpr, BLOCK_C: tl.constexpr):
    """Both of repack's copies in one launch: A [m, k] into dst's first m rows of k_padded, then
    w = B^T [n, k] into the n rows after them; zeros past k. The first ``a_programs`` programs copy A."""
    pid = tl.program_id(0)
    if pid < a_programs:
        _pad_rows(a_ptr, dst_ptr, m, k, 0, m, k_padded, stride_am, stride_ak, pid // tiles_c, pid % tiles_c,
                  BLOCK_R, BLOCK_C)
    else:
        pid -= a_programs
        _pad_rows(w_ptr, dst_ptr, n, k, m, n, k_padded, stride_wn, stride_wk, pid // tiles_c, pid % tiles_c,
                  BLOCK_R, BLOCK_C)
