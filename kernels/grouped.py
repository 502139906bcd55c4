"""Persistent grouped GEMM: C_i = A_i @ B_i for a list of differently shaped fp16/bf16 GEMMs in one launch.

The host packs one int64 table per operand signature, copied to the device in one transfer: the running tile count of
each problem (a prefix array of group + 1 entries), then one row per problem (``_ROW``). All outputs live in
one buffer allocated per call, passed as a typed pointer that also tells the kernel the dtype.
``NUM_SM`` programs walk the tiles of all problems (program p takes tiles p, p + NUM_SM, ...); since a
program's tiles only increase, the problem that owns the current tile is found by stepping forward
through the prefix array, never by a fresh search.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import math
from array import array
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import triton
import triton.language as tl

from . import _modes
from ._check import LOUD, loud_edges
from ._device import interpreter_enabled
from ._launch import DirectLaunch, LruCache, _raw_stream
from ._spec import (Config, DeviceInfo, KernelSpec, Param, Problem, SearchSpace, fold_to_least_covering, is_baseline,
                    log_distance)

logger = logging.getLogger(__name__)

KERNEL = "grouped_matmul"

_DTYPE_NAMES = {torch.float16: "fp16", torch.bfloat16: "bf16"}
_TORCH_DTYPES = {name: dtype for dtype, name in _DTYPE_NAMES.items()}
_ELEMENT_SIZE = 2  # bytes, fp16 and bf16 alike

# Table row per problem: a_ptr, b_ptr, C's element offset in the output buffer, M, N, K, stride_am,
# stride_ak, stride_bk, stride_bn, stride_cm, stride_cn. The kernel reads fields at these positions.
_ROW = tl.constexpr(12)  # jitted code may read a global only if it is a constexpr

# A 16-byte load holds 8 fp16/bf16 elements: the alignment the kernel may promise the compiler.
_VECTOR = 8

# Every program keeps BLOCK_M * BLOCK_N fp32 accumulators spread over its threads; past 256 per thread
# (the register file's per-thread limit is 255) they spill, and such a config is never a winner.
_MAX_ACCUMULATORS_PER_THREAD = 256

# Programs per launch. 66/132/264 are half, one and two waves on the H100's 132 SMs; the powers of two
# serve small groups and other cards. Under the interpreter every program runs serially on the CPU, so
# there only small counts are worth trying.
NUM_SM_VALUES = (4, 8, 16, 32, 64, 66, 128, 132, 264)
_CPU_MAX_NUM_SM = 16


def _cdiv(a: int, b: int) -> int:
    # triton.cdiv is a jitted function in triton 3.6: calling it from Python costs microseconds.
    return -(-a // b)


# ----------------------------------------------------------------------------------------------- kernel

@triton.jit
def _strides(ptr, FIRST_UNIT: tl.constexpr, SECOND_UNIT: tl.constexpr, ALIGNED: tl.constexpr):
    """An operand's two strides from the table; a unit stride becomes the constant 1 so loads along it vectorize."""
    first = tl.load(ptr)
    second = tl.load(ptr + 1)
    if ALIGNED:
        first = tl.multiple_of(first, 8)
        second = tl.multiple_of(second, 8)
    if FIRST_UNIT:
        first = 1
    if SECOND_UNIT:
        second = 1
    return first, second


@triton.jit
def _matmul_tile(row, tile, c_base, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 A_M_UNIT: tl.constexpr, A_K_UNIT: tl.constexpr, B_K_UNIT: tl.constexpr, B_N_UNIT: tl.constexpr,
                 ALIGNED: tl.constexpr):
    """C[tile] = A[tile rows] @ B[tile columns] for the problem whose table row is ``row``."""
    a_ptr = tl.load(row + 0).to(c_base.dtype)  # every operand has C's element type
    b_ptr = tl.load(row + 1).to(c_base.dtype)
    c_ptr = c_base + tl.load(row + 2)
    M = tl.load(row + 3)
    N = tl.load(row + 4)
    K = tl.load(row + 5)
    stride_am, stride_ak = _strides(row + 6, A_M_UNIT, A_K_UNIT, ALIGNED)
    stride_bk, stride_bn = _strides(row + 8, B_K_UNIT, B_N_UNIT, ALIGNED)
    stride_cm = tl.load(row + 10)
    if ALIGNED:
        # The host checked these; without them, masks and addresses read from memory defeat wide loads.
        a_ptr = tl.multiple_of(a_ptr, 16)
        b_ptr = tl.multiple_of(b_ptr, 16)
        c_ptr = tl.multiple_of(c_ptr, 16)
        N = tl.multiple_of(N, 8)
        K = tl.multiple_of(K, 8)
        stride_cm = tl.multiple_of(stride_cm, 8)
        if A_M_UNIT:
            M = tl.multiple_of(M, 8)

    tiles_n = tl.cdiv(N, BLOCK_N)
    offs_m = (tile // tiles_n) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = (tile % tiles_n) * BLOCK_N + tl.arange(0, BLOCK_N)
    tile_product(a_ptr, b_ptr, c_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                 stride_cm, BLOCK_M, BLOCK_N, BLOCK_K)


@triton.jit
def tile_product(a_ptr, b_ptr, c_ptr, offs_m, offs_n, M, N, K, stride_am, stride_ak, stride_bk, stride_bn,
                 stride_cm, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """C[offs_m, offs_n] = A[offs_m, :K] @ B[:K, offs_n] with fp32 accumulation; rows >= M and
    columns >= N are masked. C's column stride is 1: the launchers allocate it row-major."""
    offs_k = tl.arange(0, BLOCK_K)
    a_ptrs = a_ptr + offs_m[:, None] * stride_am + offs_k[None, :] * stride_ak
    b_ptrs = b_ptr + offs_k[:, None] * stride_bk + offs_n[None, :] * stride_bn
    mask_m = offs_m[:, None] < M
    mask_n = offs_n[None, :] < N
    # K == 0 runs no step and stores the zeros the product is.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        k_left = K - k * BLOCK_K
        a = tl.load(a_ptrs, mask=mask_m & (offs_k[None, :] < k_left), other=0.0)
        b = tl.load(b_ptrs, mask=(offs_k[:, None] < k_left) & mask_n, other=0.0)
        acc = tl.dot(a, b, acc)
        a_ptrs += BLOCK_K * stride_ak
        b_ptrs += BLOCK_K * stride_bk
    c_ptrs = c_ptr + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=mask_m & mask_n)


@triton.jit
def _grouped_matmul_kernel(table_ptr, c_base, group_size, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                           BLOCK_K: tl.constexpr, A_M_UNIT: tl.constexpr, A_K_UNIT: tl.constexpr,
                           B_K_UNIT: tl.constexpr, B_N_UNIT: tl.constexpr, ALIGNED: tl.constexpr):
    """Each program takes every num_programs-th tile of the whole group; table layout in the module docstring."""
    rows_ptr = table_ptr + group_size + 1
    total_tiles = tl.load(table_ptr + group_size)
    problem = 0
    problem_end = tl.load(table_ptr + 1)
    for tile in range(tl.program_id(0), total_tiles, tl.num_programs(0)):
        # Tiles only increase, so the owning problem only moves forward: O(group + tiles) per program.
        # Problems without tiles (M or N == 0) end where they start and are stepped over.
        while problem_end <= tile:
            problem += 1
            problem_end = tl.load(table_ptr + problem + 1)
        _matmul_tile(rows_ptr + problem * _ROW, tile - tl.load(table_ptr + problem), c_base,
                     BLOCK_M, BLOCK_N, BLOCK_K, A_M_UNIT, A_K_UNIT, B_K_UNIT, B_N_UNIT, ALIGNED)


# -------------------------------------------------------------------------------------- problem of a call

def _check_operands(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> None:
    """Raise the TypeError/ValueError that names the first bad operand and the fix (the slow, precise path)."""
    for name, seq in (("As", As), ("Bs", Bs)):
        if not isinstance(seq, (list, tuple)):
            raise TypeError(f"grouped_matmul takes {name} as a list or tuple of tensors; got {type(seq).__name__}")
    if len(As) != len(Bs) or not As:
        raise ValueError(f"grouped_matmul takes equally long, non-empty As and Bs; got {len(As)} and {len(Bs)}")
    for i, (a, b) in enumerate(zip(As, Bs)):
        for name, t in ((f"As[{i}]", a), (f"Bs[{i}]", b)):
            if not isinstance(t, torch.Tensor):
                raise TypeError(f"{name} is a {type(t).__name__}; grouped_matmul takes torch tensors")
            if t.dim() != 2:
                raise ValueError(f"{name} has shape {tuple(t.shape)}; grouped_matmul takes 2-D matrices")
            if t.dtype not in _DTYPE_NAMES:
                raise TypeError(f"grouped_matmul takes float16 or bfloat16; got {t.dtype} at {name}; "
                                "cast with .half() or .bfloat16()")
            if t.dtype != As[0].dtype:
                raise TypeError(f"grouped_matmul takes one dtype for all operands; As[0] is {As[0].dtype} but "
                                f"{name} is {t.dtype}; cast them all with .half() or all with .bfloat16()")
            if t.device != As[0].device:
                raise ValueError(f"grouped_matmul takes all operands on one device; As[0] is on {As[0].device} "
                                 f"but {name} is on {t.device}; move them with .to({str(As[0].device)!r})")
        if a.shape[1] != b.shape[0]:
            raise ValueError(f"As[{i}] has shape {tuple(a.shape)} and Bs[{i}] {tuple(b.shape)}: "
                             f"inner dimensions {a.shape[1]} and {b.shape[0]} differ")


def _operands_ok(As: object, Bs: object) -> bool:
    """The fast check of the hot path: one look at each operand, no messages built."""
    if not (isinstance(As, (list, tuple)) and isinstance(Bs, (list, tuple)) and As and len(As) == len(Bs)
            and isinstance(As[0], torch.Tensor) and As[0].dtype in _DTYPE_NAMES):
        return False
    dtype, device = As[0].dtype, As[0].device
    return all(isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dim() == 2 and b.dim() == 2
               and a.dtype == dtype and b.dtype == dtype and a.device == device and b.device == device
               and a.shape[1] == b.shape[0] for a, b in zip(As, Bs))


def _layout_letter(row_major: bool, column_major: bool) -> str:
    # General strides run too; the letter only keys the problem, so they share the row-major key.
    return "t" if column_major and not row_major else "n"


def problem_of(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> Problem:
    """The problem ``grouped_matmul(As, Bs)`` poses; TypeError/ValueError naming the bad operand.

    A layout letter is ``n`` when every operand is row-major, ``t`` when every one is column-major;
    a dimension of size 0 or 1 never steps, so its stride counts for either.
    """
    if not _operands_ok(As, Bs):
        _check_operands(As, Bs)
        raise ValueError("grouped_matmul: bad operands")  # unreachable: the check above names the fault
    shapes = []
    a_row = a_col = b_row = b_col = True
    for a, b in zip(As, Bs):
        (m, k), n = a.shape, b.shape[1]
        (sam, sak), (sbk, sbn) = a.stride(), b.stride()
        shapes.append((m, n, k))
        a_row &= k <= 1 or sak == 1
        a_col &= m <= 1 or sam == 1
        b_row &= n <= 1 or sbn == 1
        b_col &= k <= 1 or sbk == 1
    layout = _layout_letter(a_row, a_col) + _layout_letter(b_row, b_col)
    return Problem(KERNEL, _DTYPE_NAMES[As[0].dtype], layout, tuple(shapes))


# --------------------------------------------------------------------------------------------- launcher

# One operand pair as the launch sees it: (A's address, dtype, M, K, stride_am, stride_ak, B's address,
# dtype, K, N, stride_bk, stride_bn). Everything a table, a layout flag or the alignment promise depends
# on is in here, so equal signatures may share a cached plan and table. Addresses also tell devices
# apart: CUDA's unified virtual addressing gives every device (and the host) its own range.
Signature = tuple


def signature(As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> Signature | None:
    """One pass over the operands (under 1 us per pair); None when they are not lists of tensors.

    Cheaper than checking them: a signature that matches one cached after a full check names operands
    that would pass it again (same dtypes, devices, shapes; a 3-D tensor has a longer shape). Shapes
    and strides stay the tuples torch returns: unpacking them made a repeated call on 64 pairs 103 us
    instead of 92-96 (launch stubbed; a probe retired at 1996844, ``scripts/probes/host_overhead.py``,
    2-core x86_64 CPU, torch 2.13.0+cpu, triton 3.6.0, 2026-11-23).
    """
    try:
        # Empty lists: None, so that the full check names the problem (a group needs a GEMM).
        return tuple((a.data_ptr(), a.dtype, a.shape, a.stride(), b.data_ptr(), b.dtype, b.shape, b.stride())
                     for a, b in zip(As, Bs, strict=True)) or None
    except (AttributeError, TypeError, ValueError):
        return None


@dataclass
class _Plan:
    """What one pass over a call's signature gives the launcher."""

    table: array  # int64: tile prefix (group + 1 entries), then one _ROW-long row per problem
    outputs: list[tuple[int, int, int]]  # (element offset into the C buffer, M, N) per problem
    c_elements: int
    flags: dict[str, bool]  # the kernel's layout and alignment constexprs
    stacked_n: int | None  # all problems share this N: C is one (sum M, N) matrix, split by rows

    @property
    def total_tiles(self) -> int:
        return self.table[len(self.outputs)]

    @functools.cached_property
    def _rows(self) -> list[int]:
        return [m for _, m, _ in self.outputs]

    def views(self, c: torch.Tensor) -> list[torch.Tensor]:
        """The per-problem outputs inside the buffer ``c``: one split when stacked (a third of the
        host time of a view per problem for 64 problems)."""
        if self.stacked_n is not None:
            return list(torch.split_with_sizes(c.view(-1, self.stacked_n), self._rows))
        return [c.as_strided((m, n), (n, 1), offset) for offset, m, n in self.outputs]


def _plan(pairs: Signature, block_m: int, block_n: int) -> _Plan:
    """Build the table in one pass, noting which strides are 1 and what is a multiple of 8 for every problem."""
    prefix, rows, outputs = array("q", [0]), array("q"), []
    a_m_unit = a_k_unit = b_k_unit = b_n_unit = True
    ptr_bits = extent_bits = m_bits = am_bits = ak_bits = bk_bits = bn_bits = 0  # OR of values: low bits tell
    offset = 0
    widths = {pair[6][1] for pair in pairs}
    # Stacked outputs start where the previous one ends; N % 8 keeps each start 16-byte aligned too.
    stacked_n = widths.pop() if len(widths) == 1 and next(iter(widths), 0) > 0 else None
    for a_ptr, _, (m, k), (sam, sak), b_ptr, _, (_, n), (sbk, sbn) in pairs:
        # A dimension that never steps may carry any stride: 0 keeps the alignment promise true for it.
        sam, sbn = (sam if m > 1 else 0), (sbn if n > 1 else 0)
        sak, sbk = (sak, sbk) if k > 1 else (0, 0)
        a_m_unit &= m <= 1 or sam == 1
        a_k_unit &= k <= 1 or sak == 1
        b_k_unit &= k <= 1 or sbk == 1
        b_n_unit &= n <= 1 or sbn == 1
        ptr_bits |= a_ptr | b_ptr
        extent_bits |= n | k
        m_bits |= m
        am_bits, ak_bits, bk_bits, bn_bits = am_bits | sam, ak_bits | sak, bk_bits | sbk, bn_bits | sbn
        rows.extend((a_ptr, b_ptr, offset, m, n, k, sam, sak, sbk, sbn, n, 1))
        prefix.append(prefix[-1] + _cdiv(m, block_m) * _cdiv(n, block_n))
        outputs.append((offset, m, n))
        offset += m * n if stacked_n is not None else _cdiv(m * n, _VECTOR) * _VECTOR  # 16-byte aligned starts
    # Each operand uses one unit axis (row-major wins when a group is both); the other strides must align.
    flags = dict(A_M_UNIT=a_m_unit and not a_k_unit, A_K_UNIT=a_k_unit,
                 B_K_UNIT=b_k_unit and not b_n_unit, B_N_UNIT=b_n_unit)
    # Masks along a contiguous axis stay uniform over a 16-byte vector only if that extent is a multiple of 8:
    # N always (C is row-major), K (contiguous in row-major A and in B = w.t()), M only for A = x.t().
    strides = ((am_bits, flags["A_M_UNIT"]), (ak_bits, flags["A_K_UNIT"]), (bk_bits, flags["B_K_UNIT"]),
               (bn_bits, flags["B_N_UNIT"]))
    flags["ALIGNED"] = (ptr_bits % 16 == 0 and extent_bits % _VECTOR == 0
                        and (not flags["A_M_UNIT"] or m_bits % _VECTOR == 0)
                        and all(unit or bits % _VECTOR == 0 for bits, unit in strides))
    prefix.extend(rows)
    return _Plan(prefix, outputs, offset, flags, stacked_n)


def _to_device(table: array, device: torch.device, in_capture: bool) -> torch.Tensor:
    """The table on ``device``: one host-to-device copy per operand signature, asynchronous and ordered on
    the building stream (another stream waits for that stream first, ``Launch._guard_table``)."""
    host = torch.frombuffer(table, dtype=torch.int64)
    if device.type != "cuda":
        return host.clone()  # the interpreter reads it in place; the array dies with this frame
    # torch's caching host allocator hands out pinned blocks cheaply and keeps each until its copy is done.
    pinned = torch.empty(len(table), dtype=torch.int64, pin_memory=True).copy_(host)
    if in_capture:
        # The graph's own table, from its pool, for this call alone: the copy is a node of the graph, run
        # before its kernel on every replay, and it reads the pinned block then: keep that for good
        # (recent torch leaks such blocks itself; older ones may hand them out again).
        _keep_for_good(pinned)
        return pinned.to(device, non_blocking=True)
    # A table the caches keep, allocated inline on the building stream (the allocator's own). Not through
    # kernels/_memory.py: callers whose operands move build a table per call, and a hand-over to another
    # thread per build would cost more than the build. No CUDA-graph pool can take it: the operator carries
    # torch.Tag.cudagraph_unsafe, so torch.compile runs it outside its graphs' warm-ups (kernels/ops.py),
    # and a capture by hand builds its own tables (above).
    return pinned.to(device, non_blocking=True)


# Tensors that a captured CUDA graph reads, by id, for the life of the process: a graph bakes in their
# addresses and may be replayed for ever, while clear_cache (refresh threads, use_database, record mode)
# or eviction from TABLES and CALLS would free them and let the caching allocator hand the block out
# again. Nothing says when a graph dies, so they are never let go. Growth is bounded by what is captured:
# one entry per table captured into a graph (one per signature and config, a handful per model), and
# again only when a signature is captured anew after its Launch was dropped.
CAPTURED: dict[int, torch.Tensor] = {}


@contextlib.contextmanager
def captures_released() -> Iterator[None]:
    """Tensors kept for graphs captured inside the block are let go at its end: for a caller whose graphs
    die with the block (the tuner's timings, which would otherwise keep a table per timed config)."""
    before = set(CAPTURED)
    try:
        yield
    finally:
        for key in [key for key in CAPTURED if key not in before]:
            CAPTURED.pop(key, None)


def _keep_for_good(tensor: torch.Tensor) -> None:
    CAPTURED.setdefault(id(tensor), tensor)  # atomic under the GIL; the id is unique while the entry lives


def _keep_if_captured(table: torch.Tensor, capturing: bool) -> bool:
    """Keep ``table`` for good when the current stream is capturing (a graph now holds its address); whether it did."""
    if capturing:
        _keep_for_good(table)
    return capturing


def _record_use(table: torch.Tensor, device: int) -> None:
    """Make the freeing of ``table`` wait for the work queued so far and later on the current stream."""
    table.record_stream(torch.cuda.current_stream(device))


def _stream_of(device: torch.device) -> tuple[int, int | None, Any]:
    """(device index, raw handle of its current stream, that stream), or (-1, None, None) where tensors
    have no streams (the CPU)."""
    if device.type != "cuda":
        return -1, None, None
    index = device.index if device.index is not None else torch.cuda.current_device()
    return index, _raw_stream(index), torch.cuda.current_stream(index)


def _wait_for(builder: Any, device: int) -> None:
    """Make the current stream wait for what ``builder`` has queued so far (the table's copy among it)."""
    torch.cuda.current_stream(device).wait_stream(builder)


# Ready launches, keyed by (signature, config): the device table with its launch arguments. A table is
# a pure function of those, so a call with the same operands (static buffers, CUDA-graph style serving,
# a benchmark loop) skips the Python pass and the host-to-device copy; a table reads the live tensors,
# never a snapshot. The room is the tuner's eager contest's: each side's tables over every rotated input
# set (tuner/timing.py MAX_ROTATION sets, tuner/search.py FINALISTS + cuBLAS sides); with less, each timed
# call rebuilt its table, a cost that a model's calls on recycled buffers do not pay.
TABLES = LruCache(capacity=1024)

# What dispatch resolved for a signature alone: a Launch, or None where cuBLAS won, so that a repeated
# call of grouped_matmul also skips the operand check and the config lookup.
CALLS = LruCache()


def _check_launchable(device: torch.device) -> None:
    if device.type == "cpu" and not interpreter_enabled():
        raise ValueError("grouped_matmul got CPU tensors, but Triton kernels run on the GPU; move them with "
                         ".cuda(), or set TRITON_INTERPRET=1 before triton is imported to run the interpreter")


@dataclass(frozen=True)
class Launch:
    """Everything one config needs to run on one operand signature, computed once."""

    plan: _Plan
    table: torch.Tensor
    kernel: DirectLaunch  # the table, a fresh C buffer and the group size specialize alike on every call
    device: int = -1  # the table's CUDA device; -1 where it has no streams (the CPU)
    # Raw handles of the streams whose use of the table its freeing waits for: the one that built it (the
    # allocator's own), then each other one it ran on (record_stream). A set: one lookup per call.
    streams: set[int] = field(default_factory=set, compare=False, repr=False)
    # Built while the stream captured: the table's copy is a node of that graph, so the table holds its
    # values only once that graph has replayed. Such a launch serves that capture alone (never cached).
    built_in_capture: bool = False
    # The stream whose queue holds the table's copy (None on the CPU and in a capture, which
    # torch.cuda.graph begins by synchronizing the device): another stream waits for it once, on its first
    # call. No event per build: callers whose operands move every call build a table per call.
    builder: Any = field(default=None, compare=False, repr=False)

    def __call__(self, like: torch.Tensor) -> list[torch.Tensor]:
        """Allocate the outputs and launch; ``like`` gives dtype and device."""
        # One buffer for every C: one allocation per call instead of one per problem.
        c = torch.empty(self.plan.c_elements, dtype=like.dtype, device=like.device)
        outs = self.plan.views(c)
        if self.kernel.grid[0]:  # no tiles: every product is empty, nothing to write
            if self.device >= 0:
                self._guard_table()
            self.kernel(self.table, c, len(self.plan.outputs))
        return outs

    def _guard_table(self) -> None:
        """Keep the table alive for a graph captured now, or make its freeing wait for this stream.

        One capture check (a thread-local read on the default stream) and one stream query per call.
        """
        if self.built_in_capture:
            return  # the capture's own table, in its graph's pool: the graph holds it, nothing to keep
        if _keep_if_captured(self.table, _modes.capturing()):
            return  # never freed now, so no stream needs recording
        stream = _raw_stream(self.device)
        if stream not in self.streams:  # the first call on this stream
            if self.builder is not None:  # the table's copy first (and whatever else the builder had queued)
                _wait_for(self.builder, self.device)
            _record_use(self.table, self.device)
            self.streams.add(stream)  # recorded once: the allocator waits on all later work of the stream too


def _building_in_capture(device: torch.device) -> bool:
    return device.type == "cuda" and _modes.capturing()


def prepare(config: Config, pairs: Signature, device: torch.device) -> Launch:
    """The launch of ``config`` on operands with signature ``pairs``: from TABLES, or built once (and
    kept there unless built inside a capture, see ``Launch.built_in_capture``)."""
    key = (pairs, config)
    launch = TABLES.get(key)
    if launch is None:
        launch = _build_launch(config, pairs, device)
        if not launch.built_in_capture:
            TABLES.put(key, launch)
    return launch


def _build_launch(config: Config, pairs: Signature, device: torch.device) -> Launch:
    values = config.as_dict()
    plan = _plan(pairs, int(values["BLOCK_M"]), int(values["BLOCK_N"]))
    # More programs than tiles would only idle; the kernel strides by the programs actually launched.
    grid = (min(int(values["NUM_SM"]), plan.total_tiles),)
    kwargs = dict(BLOCK_M=values["BLOCK_M"], BLOCK_N=values["BLOCK_N"], BLOCK_K=values["BLOCK_K"],
                  num_warps=values["num_warps"], num_stages=values["num_stages"], **plan.flags)
    in_capture = _building_in_capture(device)
    table = _to_device(plan.table, device, in_capture)
    index, stream, current = _stream_of(device)
    builder = None if in_capture else current
    return Launch(plan, table, DirectLaunch(_grouped_matmul_kernel, grid, kwargs), index,
                  set() if stream is None else {stream}, in_capture, builder)


def _run_checked(config: Config, As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """The launcher behind ``grouped_matmul_with`` and ``run``, for operands already checked."""
    device = As[0].device
    _check_launchable(device)
    return prepare(config, signature(As, Bs), device)(As[0])


def grouped_matmul_with(config: Config, As: Sequence[torch.Tensor], Bs: Sequence[torch.Tensor],
                        ) -> list[torch.Tensor]:
    """``[A_i @ B_i]`` in the input dtype by one launch of ``config`` (``VARIANT=cublas``: a torch.matmul loop).

    The outputs are row-major views into one buffer allocated for the call.
    """
    problem_of(As, Bs)
    if is_baseline(config):
        return baseline((As, Bs))
    reason = SPACE.outside(config)
    if reason:
        raise ValueError(f"config '{config}' is not in the {KERNEL} search space: {reason}")
    return _run_checked(config, As, Bs)


# ----------------------------------------------------------------------------------------- search space

def _total_tiles(shapes: Sequence[tuple[int, int, int]], block_m: int, block_n: int) -> int:
    return sum(_cdiv(m, block_m) * _cdiv(n, block_n) for m, n, _ in shapes)


def _next_pow2(x: int) -> int:
    return 1 << max(x - 1, 0).bit_length()


_BLOCK_DIMS = (("BLOCK_M", 0), ("BLOCK_N", 1), ("BLOCK_K", 2))


def _block_limit(name: str, dim: int, problem: Problem) -> int:
    """The largest sensible block along one dimension: twice the largest extent, rounded up to a power of 2."""
    smallest = int(SPACE.param(name).values[0])  # never rule out every value
    return max(smallest, 2 * _next_pow2(max(shape[dim] for shape in problem.shapes)))


def _tiles_fit_problem(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    for name, dim in _BLOCK_DIMS:
        limit = _block_limit(name, dim, problem)
        if int(config[name]) > limit:
            largest = max(shape[dim] for shape in problem.shapes)
            return f"{name}={config[name]} is far larger than the largest {'MNK'[dim]} ({largest}); at most {limit}"
    return None


def _fits_shared_memory(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    bm, bn, bk = (int(config[name]) for name, _ in _BLOCK_DIMS)
    need = config.num_stages * (bm * bk + bk * bn) * _ELEMENT_SIZE
    if need > device.shared_memory_bytes:
        return (f"{config.num_stages} stages of {bm}x{bk} and {bk}x{bn} tiles need {need} bytes of shared memory; "
                f"{device.alias} has {device.shared_memory_bytes}")
    return None


def _fits_registers(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    per_thread = int(config["BLOCK_M"]) * int(config["BLOCK_N"]) // (32 * config.num_warps)
    if per_thread > _MAX_ACCUMULATORS_PER_THREAD:
        return (f"{per_thread} fp32 accumulators per thread spill past {_MAX_ACCUMULATORS_PER_THREAD}; "
                "use more warps or smaller blocks")
    return None


def _num_sm_fits_device(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    limit = _CPU_MAX_NUM_SM if device.is_cpu else 2 * device.sm_count
    if int(config["NUM_SM"]) > limit:
        return f"NUM_SM={config['NUM_SM']} is more than {limit} programs, too many for {device.alias}"
    return None


def _fold_program_count(config: Config, problem: Problem) -> Config:
    """A NUM_SM above the tile count launches one program per tile, as the least NUM_SM >= the tile
    count does (the launcher starts min(NUM_SM, tiles)): fold it to that one.

    A fold, not a rule that rules it out: a seed or a neighbour with one program per SM then becomes the
    same tile with one program per tile, instead of being dropped as invalid. The H100 sweep of 4x1024^3
    (128 tiles of 128x256) has its best at 128x256x64 with NUM_SM=128; the seed 128x256x64 with 132
    programs was dropped before this fold.
    """
    total = _total_tiles(problem.shapes, int(config["BLOCK_M"]), int(config["BLOCK_N"]))
    return fold_to_least_covering(config, "NUM_SM", NUM_SM_VALUES, total)


# With a tile for every SM, fewer programs than SMs leave SMs idle. In the H100 sweep of the bf16
# 16-expert MoE group (benchmarks/sweeps), every tile shape ran at least 1.24x slower with NUM_SM < 66
# than at its best NUM_SM, which was always 128, 132 or 264. The 10% slack keeps a power of two just
# under the SM count (128 of 132), which was among the best.
_BUSY_SHARE = 0.9


def idle_sms(tiles: int, num_sm: int, device: DeviceInfo) -> str | None:
    """Why ``num_sm`` programs waste a device that has ``tiles`` tiles to hand out, or None."""
    least = math.ceil(_BUSY_SHARE * device.sm_count)
    if tiles >= device.sm_count and num_sm < least:
        return (f"NUM_SM={num_sm} leaves SMs idle: {tiles} tiles for {device.sm_count} SMs; "
                f"use NUM_SM >= {least}")
    return None


def _num_sm_fills_device(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    tiles = _total_tiles(problem.shapes, int(config["BLOCK_M"]), int(config["BLOCK_N"]))
    return idle_sms(tiles, int(config["NUM_SM"]), device)


SPACE = SearchSpace(
    params=(
        Param("BLOCK_M", (16, 32, 64, 128, 256)),
        Param("BLOCK_N", (32, 64, 128, 256)),
        Param("BLOCK_K", (32, 64, 128)),
        Param("NUM_SM", NUM_SM_VALUES),
        Param("num_warps", (2, 4, 8)),
        Param("num_stages", (2, 3, 4, 5)),
    ),
    constraints=(_fits_shared_memory, _tiles_fit_problem, _fits_registers, _num_sm_fits_device,
                 _num_sm_fills_device),
    folds=(_fold_program_count,),
)


# ------------------------------------------------------------------------------------- the rest of the spec

def _largest_at_most(name: str, limit: int) -> int:
    values = [int(v) for v in SPACE.param(name).values]
    return max([v for v in values if v <= limit], default=values[0])


def _config(**values: int) -> Config:
    # Config equality follows parameter order, so build every config in the space's order, as enumerate does.
    return Config.from_dict({name: values[name] for name in SPACE.names})


# The starting point of default_config: small tiles for the interpreter, whose time grows with tile size.
# On the H100 (fp16, nn and nt, the six groups of GPU.md's grouped table, 2026-11-23) the GPU default's
# kernel time was within 1.16x of the best of 60 configs on every group (4x1024^3: 26 us; 64 experts
# K=2048 N=768: 0.19 ms), where 64x64x32 with 3 stages was up to 4x slower.
_DEFAULT_CPU = dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=32, num_warps=4, num_stages=3)
_DEFAULT_GPU = dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4)


def default_config(problem: Problem, device: DeviceInfo) -> Config:
    """A sound config for any problem: the start above shrunk to the problem and the device; always valid."""
    start = _DEFAULT_CPU if device.is_cpu else _DEFAULT_GPU
    values = dict(start)
    for name, dim in _BLOCK_DIMS:
        values[name] = _largest_at_most(name, min(start[name], _block_limit(name, dim, problem)))
    total = _total_tiles(problem.shapes, values["BLOCK_M"], values["BLOCK_N"])
    enough = [v for v in NUM_SM_VALUES if v >= total]  # more programs than tiles would be redundant
    values["NUM_SM"] = min([_largest_at_most("NUM_SM", device.sm_count)] + enough[:1])
    for stages in range(start["num_stages"], 1, -1):  # fewer stages until the buffers fit shared memory
        config = _config(**{**values, "num_stages": stages})
        if SPACE.violation(config, problem, device) is None:
            return config
    # Only a device far smaller than any we know gets here; the smallest point fits every problem.
    smallest = _config(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, NUM_SM=NUM_SM_VALUES[0], num_warps=4, num_stages=2)
    logger.warning("default config %s does not fit %s on %s; using %s", config, problem, device.alias, smallest)
    return smallest


# Tile shapes that are good on Hopper for GEMMs of moderate M: the large-M rows of the dense kernel's
# seeds (kernels/gemm.py seed_configs), each with one program per SM. Measured first by the search.
_HOPPER_TILES = (dict(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3),
                 dict(BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
                 dict(BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4))


# Few rows per group (an MoE layer's decode step: a token or two per expert) make each GEMM a stream of
# its expert's weights: thin tiles and deep K keep many loads in flight. Without them a decode problem
# had no valid seed at all (the tiles above are taller than its rows), so a quick tuning had nothing
# to time (H100, 2026-11-24, bench_layers' MoE decode 1 and 8).
_THIN_TILES = (dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
               dict(BLOCK_M=16, BLOCK_N=128, BLOCK_K=128, num_warps=4, num_stages=4),
               dict(BLOCK_M=16, BLOCK_N=64, BLOCK_K=64, num_warps=4, num_stages=5),
               dict(BLOCK_M=16, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3),
               dict(BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, num_warps=4, num_stages=4),
               dict(BLOCK_M=32, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4))
_THIN_ROWS = 64  # mean rows per group up to which the thin tiles are seeded


def seed_configs(problem: Problem, device: DeviceInfo, space: SearchSpace = SPACE) -> list[Config]:
    """Hopper-good tiles for ``problem``, those that ``space`` allows on ``device``; none for the interpreter,
    whose time grows with tile size."""
    if device.is_cpu:
        return []
    num_sm = _largest_at_most("NUM_SM", device.sm_count)
    mean_rows = sum(m for m, _, _ in problem.shapes) / max(len(problem.shapes), 1)
    tiles = (_THIN_TILES if mean_rows <= _THIN_ROWS else ()) + _HOPPER_TILES
    configs = [space.canonical(_config(**tile, NUM_SM=num_sm), problem) for tile in tiles]
    return list(dict.fromkeys(c for c in configs if space.violation(c, problem, device) is None))


def make_inputs(problem: Problem, torch_device: object, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Random normal operands laid out as the problem says, scaled so each output element is about N(0, 1)."""
    if problem.dtype not in _TORCH_DTYPES:
        raise ValueError(f"grouped_matmul runs fp16 or bf16, not {problem.dtype}")
    dtype = _TORCH_DTYPES[problem.dtype]
    # Drawn on the device: the 64-expert group's 100M normals took 0.6 s from a CPU generator (a 2-core
    # CPU, 2026-11-23), and the search draws inputs twice per candidate in its serial timing loop.
    # Seeded, so repeatable on each device.
    gen = torch.Generator(device=torch_device).manual_seed(seed)

    def operand(rows: int, cols: int, letter: str, scale: float) -> torch.Tensor:
        shape = (cols, rows) if letter == "t" else (rows, cols)
        x = (torch.randn(shape, generator=gen, device=torch_device) * scale).to(dtype=dtype)
        return x.t() if letter == "t" else x

    As, Bs = [], []
    for m, n, k in problem.shapes:
        scale = max(k, 1) ** -0.25  # both operands take a fourth root so neither underflows in fp16
        As.append(operand(m, k, problem.layout[0], scale))
        Bs.append(operand(k, n, problem.layout[1], scale))
    return As, Bs


def check_inputs(problem: Problem, torch_device: object, seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """``make_inputs`` with loud edges in every GEMM (kernels/_check.py), and the whole last GEMM's A loud."""
    As, Bs = make_inputs(problem, torch_device, seed)
    for a, b in zip(As, Bs):
        loud_edges(a, b)
    if As:
        with torch.no_grad():
            As[-1].mul_(LOUD)
    return As, Bs


def reference(inputs: tuple) -> list[torch.Tensor]:
    As, Bs = inputs
    return [a.float() @ b.float() for a, b in zip(As, Bs)]


def run(config: Config, inputs: tuple) -> list[torch.Tensor]:
    """``inputs`` come from ``make_inputs`` or a call that ``problem_of`` already checked."""
    return baseline(inputs) if is_baseline(config) else _run_checked(config, *inputs)


def baseline(inputs: tuple) -> list[torch.Tensor]:
    As, Bs = inputs
    return [torch.matmul(a, b) for a, b in zip(As, Bs)]


def _features(problem: Problem) -> tuple[float, ...]:
    count = len(problem.shapes)
    means = (sum(shape[d] for shape in problem.shapes) / count for d in range(3))
    return (count, problem.flops, *means)


def distance(p: Problem, q: Problem) -> float:
    """Log-distance of (GEMM count, flops, mean M, mean N, mean K); infinite across dtype or layout."""
    if (p.kernel, p.dtype, p.layout) != (q.kernel, q.dtype, q.layout):
        return math.inf
    return log_distance(_features(p), _features(q))


GROUPED_MATMUL = KernelSpec(
    name=KERNEL,
    space=SPACE,
    dtypes=("fp16", "bf16"),
    problem_of=problem_of,
    make_inputs=make_inputs,
    reference=reference,
    run=run,
    baseline=baseline,
    default_config=default_config,
    distance=distance,
    seeds=seed_configs,
    portable_values=lambda device: {"NUM_SM": device.sm_count},  # where folded: one program per SM
    check_inputs=check_inputs,
)

__all__ = ["GROUPED_MATMUL", "SPACE", "NUM_SM_VALUES", "grouped_matmul_with", "problem_of", "default_config"]
