"""Dense GEMM, C = A @ B: the Triton kernels, their search space, reference and launcher.

Five variants, chosen by the ``VARIANT`` parameter like any other tunable:

- ``tiled``: one program per output tile, program order grouped by ``GROUP_SIZE_M`` so that
  neighbouring programs share rows of A and columns of B in L2. Any strides, any sizes (masked
  edges). The portable fallback: every GPU Triton supports, and the interpreter.
- ``splitk``: ``tiled`` with the K loop cut into ``SPLIT_K`` slices run by separate programs; the
  last program to finish a tile sums the slices and writes C, so it stays one launch with no zeroing
  pass. For small M and large K, where one row of tiles would leave most SMs idle.
- ``tma``: persistent (``NUM_SM`` programs loop over the tiles) with Hopper tensor descriptors (TMA)
  for loads and stores; needs row-major A, 16-byte aligned rows, and compute capability >= 9.
- ``repack``: for rows that are not 16-byte aligned (K = 4099), copy A and B into zero-padded
  aligned buffers, then run ``tiled`` (``SPLIT_K=1``) or ``splitk`` with wide, pipelined loads. In
  the space only for such problems.
- ``gemv``: one row of A (a decode step's single token) against a K-major B (``w.t()`` of an
  ``nn.Linear`` weight): each program multiplies ``GEMV_BLOCK_N`` columns of B (1-8) by the row over
  ``GEMV_BLOCK_K``-long runs of K and sums at the end, no tensor cores. In the space only for M = 1:
  the call streams B once, a tile of tensor-core rows would be 15/16 empty, and thin column blocks
  make thousands of programs, so many loads in flight (scripts/probes/gemv_probe.py, retired at 1996844: 1.04-1.40x
  cuBLAS on the H100 where 32-64 columns per program with a split K reached 0.95-1.10x).

Rows that are 16-byte aligned but not multiples of 16 elements (1000) get the ALIGN hints
(``alignment_hints``), which let ``tiled`` and ``splitk`` use 16-byte loads there.

fp16 and bf16 accumulate in fp32; fp32 inputs use TF32 tensor cores (``input_precision="tf32"``),
as ``torch.backends.cuda.matmul.allow_tf32 = True`` would.
"""

from __future__ import annotations

import functools
import math
import threading
from collections.abc import Callable, Hashable
from typing import Any

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from ._check import loud_edges
from ._gemm_triton import _gemv_kernel, _pad_pair_kernel, _splitk_kernel, _tiled_kernel, _tma_kernel
from ._launch import SLOT_A, SLOT_B, SLOT_C, DirectLaunch, LruCache, NativeLaunch, _raw_stream
from ._memory import kept_empty
from ._modes import capturing as _capturing
from ._spec import Config, DeviceInfo, KernelSpec, Param, Problem, SearchSpace, fold_to_least_covering, log_distance

KERNEL = "matmul"

TORCH_DTYPES = {"fp16": torch.float16, "bf16": torch.bfloat16, "fp32": torch.float32}
DTYPE_NAMES = {v: k for k, v in TORCH_DTYPES.items()}

# Beyond 2**31 elements int32 offsets overflow; kernels then index in int64 (a constexpr switch).
_INT32_LIMIT = 2**31 - 1


# ----------------------------------------------------------------------------------------------
# Search space
# ----------------------------------------------------------------------------------------------

VARIANTS = ("tiled", "splitk", "tma", "repack", "gemv")

SPACE_PARAMS = (
    Param("VARIANT", VARIANTS),
    Param("BLOCK_M", (16, 32, 64, 128, 256)),
    Param("BLOCK_N", (32, 64, 128, 256)),
    Param("BLOCK_K", (32, 64, 128, 256)),
    Param("GROUP_SIZE_M", (1, 4, 8, 16)),
    Param("SPLIT_K", (1, 2, 3, 4, 6, 8, 16)),
    Param("NUM_SM", (32, 66, 132, 264)),
    Param("FLATTEN", (False, True)),
    Param("EPILOGUE_SUBTILE", (False, True)),
    Param("num_warps", (2, 4, 8)),
    Param("num_stages", (2, 3, 4, 5, 6)),
    # gemv's own block: columns of B per program, and the run of K each step multiplies. Added after
    # tables were shipped: a config stored before then leaves them out (Param.default).
    Param("GEMV_BLOCK_N", (1, 2, 4, 8), default=1),
    Param("GEMV_BLOCK_K", (256, 512, 1024, 2048, 4096), default=256),
)

_NOT_GEMV = {"GEMV_BLOCK_N": 1, "GEMV_BLOCK_K": 256}

# Values a variant ignores are folded to one representative, so the search never pays twice.
_IGNORED_BY_VARIANT = {
    "tiled": {"SPLIT_K": 1, "NUM_SM": 132, "FLATTEN": False, "EPILOGUE_SUBTILE": False, **_NOT_GEMV},
    "splitk": {"NUM_SM": 132, "FLATTEN": False, "EPILOGUE_SUBTILE": False, **_NOT_GEMV},
    "tma": {"SPLIT_K": 1, **_NOT_GEMV},
    "repack": {"NUM_SM": 132, "FLATTEN": False, "EPILOGUE_SUBTILE": False, **_NOT_GEMV},
    "gemv": {"BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 32, "GROUP_SIZE_M": 1, "SPLIT_K": 1, "NUM_SM": 132,
             "FLATTEN": False, "EPILOGUE_SUBTILE": False},
}

# gemv's fp32 partial sums are a GEMV_BLOCK_N x GEMV_BLOCK_K tile in registers: at most this many per thread.
GEMV_SUMS_PER_THREAD = 128


def _element_size(problem: Problem) -> int:
    return 4 if problem.dtype == "fp32" else 2


def _fits_shared_memory(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    if config["VARIANT"] == "gemv":  # plain loads into registers: no tiles staged in shared memory
        return None
    bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
    size = _element_size(problem)
    need = config.num_stages * (bm * bk + bk * bn) * size
    if config["VARIANT"] == "tma":
        half = 2 if config["EPILOGUE_SUBTILE"] else 1
        need += bm * bn // half * size  # the epilogue's staging buffer for the TMA store
    if need > device.shared_memory_bytes:
        return (f"needs ~{need // 1024} KiB of shared memory, over the device's "
                f"{device.shared_memory_bytes // 1024} KiB")
    return None


def _fits_registers(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    # Measured on triton 3.6: above ~256 fp32 accumulators per thread the kernel spills.
    per_thread = config["BLOCK_M"] * config["BLOCK_N"] // (32 * config.num_warps)
    if per_thread > 256:
        return f"{per_thread} fp32 accumulators per thread (BLOCK_M*BLOCK_N/(32*num_warps)) would spill"
    return None


def _tile_near_problem(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    m, n, k = problem.shape
    if config["VARIANT"] in ("splitk", "repack"):
        k = max(1, math.ceil(k / config["SPLIT_K"]))
    for name, size in (("BLOCK_M", m), ("BLOCK_N", n), ("BLOCK_K", k)):
        limit = max(_SMALLEST[name], _next_power_of_2(size))
        if config[name] > limit:
            return f"{name}={config[name]} is larger than the problem needs ({limit})"
    return None


_SMALLEST = {p.name: min(p.values) for p in SPACE_PARAMS if p.name.startswith("BLOCK_")}


def _next_power_of_2(n: int) -> int:
    # triton.next_power_of_2 is a JIT-aware function: per call it cost more than the rest of this
    # constraint, which runs for every config a search or sweep enumerates (73,280 for 4096^3).
    return 1 << max(n - 1, 0).bit_length()


def _variant_fits(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    variant = config["VARIANT"]
    m, n, k = problem.shape
    if variant == "repack" and not _misaligned_rows(problem):
        return "VARIANT=repack only helps rows that are not 16-byte aligned; this problem's rows all are"
    if variant == "splitk" and config["SPLIT_K"] == 1:
        return "VARIANT=splitk with SPLIT_K=1 is the tiled kernel; tune SPLIT_K >= 2"
    if variant == "gemv":
        reason = gemv_unsupported(problem)
        return f"VARIANT=gemv {reason}: use VARIANT=tiled or splitk" if reason else gemv_blocks_fit(config, problem)
    if variant in ("splitk", "repack"):
        if config["SPLIT_K"] > _cdiv(k, config["BLOCK_K"]):
            return f"SPLIT_K={config['SPLIT_K']} is more than the {_cdiv(k, config['BLOCK_K'])} K blocks"
    if variant == "tma":
        reason = _tma_unsupported(problem, device)
        if reason:
            return reason
        if config["NUM_SM"] > 2 * max(device.sm_count, 1) and not device.is_cpu:
            return f"NUM_SM={config['NUM_SM']} is over twice the device's {device.sm_count} SMs"
        if config["EPILOGUE_SUBTILE"] and config["BLOCK_N"] < 32:
            return "EPILOGUE_SUBTILE needs BLOCK_N >= 32"
    return None


def gemv_unsupported(problem: Problem) -> str | None:
    """Why the one-row loop (matmul's gemv, the epilogues' GEMV_BLOCK_N > 0) does not fit ``problem``, or None."""
    m = problem.shapes[0][0]
    if m != 1 or problem.layout[1] != "t":
        return (f"is for one row of A (M = 1) against a K-major B (w.t() of a row-major weight, layout '?t'); "
                f"this problem has M = {m} and layout {problem.layout!r}")
    return None


def gemv_blocks_fit(config: Config, problem: Problem, accumulators: int = 1) -> str | None:
    """Why the one-row loop's blocks do not fit ``problem`` or its registers (``accumulators`` sums per output), or None."""
    _, n, k = problem.shapes[0]
    for name, size, least in (("GEMV_BLOCK_N", n, 1), ("GEMV_BLOCK_K", k, 256)):
        limit = max(least, _next_power_of_2(size))
        if config[name] > limit:
            return f"{name}={config[name]} is larger than the problem needs ({limit})"
    sums = accumulators * config["GEMV_BLOCK_N"] * config["GEMV_BLOCK_K"] // (32 * config.num_warps)
    if sums > GEMV_SUMS_PER_THREAD:
        return (f"{sums} fp32 partial sums per thread (GEMV_BLOCK_N*GEMV_BLOCK_K/(32*num_warps), per accumulator), "
                f"over {GEMV_SUMS_PER_THREAD}: fewer columns, a shorter K run or more warps")
    return None


def _tma_unsupported(problem: Problem, device: DeviceInfo) -> str | None:
    if not device.is_cpu and float(device.compute_capability or 0) < 9.0:
        return f"TMA needs compute capability >= 9.0; {device.name} has {device.compute_capability}"
    if problem.layout[0] != "n":
        return "TMA needs a row-major A"
    m, n, k = problem.shape
    size = _element_size(problem)
    b_row = k if problem.layout[1] == "t" else n
    for what, row in (("A's rows (K)", k), ("B's rows", b_row), ("C's rows (N)", n)):
        if (row * size) % 16:
            return f"TMA needs 16-byte aligned rows; {what} are {row * size} bytes"
    return None


def _misaligned_rows(problem: Problem) -> list[str]:
    """The operands whose rows (in the problem's layout) are not a multiple of 16 bytes long."""
    m, n, k = problem.shape
    size = _element_size(problem)
    rows = {"A": k if problem.layout[0] == "n" else m, "B": n if problem.layout[1] == "n" else k}
    return [name for name, row in rows.items() if (row * size) % 16]


def _fold_group_size(config: Config, problem: Problem) -> Config:
    # With GROUP_SIZE_M >= the rows of tiles there is one group, and with one column of tiles the
    # walk is row by row whatever the group: either way those values give one tile order
    # (_grouped_tile), so they fold to the smallest of them.
    m, n, _ = problem.shape
    rows = 1 if _cdiv(n, config["BLOCK_N"]) == 1 else _cdiv(m, config["BLOCK_M"])
    return fold_to_least_covering(config, "GROUP_SIZE_M", _VALUES["GROUP_SIZE_M"], rows)


def _fold_program_count(config: Config, problem: Problem) -> Config:
    # The persistent launcher starts min(NUM_SM, tiles) programs: every NUM_SM >= tiles is one launch.
    if config["VARIANT"] != "tma":
        return config
    m, n, _ = problem.shape
    tiles = _cdiv(m, config["BLOCK_M"]) * _cdiv(n, config["BLOCK_N"])
    return fold_to_least_covering(config, "NUM_SM", _VALUES["NUM_SM"], tiles)


_VALUES = {p.name: p.values for p in SPACE_PARAMS}


SPACE = SearchSpace(
    params=SPACE_PARAMS,
    constraints=(_variant_fits, _tile_near_problem, _fits_shared_memory, _fits_registers),
    ignored={"VARIANT": _IGNORED_BY_VARIANT},
    folds=(_fold_group_size, _fold_program_count),
)


# ----------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------

def _dot_precision(a: torch.Tensor) -> str:
    return "tf32" if a.dtype == torch.float32 else "ieee"


def _needs_int64(*tensors: torch.Tensor) -> bool:
    return any(t.numel() > _INT32_LIMIT for t in tensors)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)  # triton.cdiv is a jitted function: ~1.6 us per host call in triton 3.6


# Ready launches of the tiled and split-K kernels (kernels/_launch.py), keyed by _launch_key.
LAUNCHES = LruCache()


def _launch_key(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple:
    """Everything a launch's grid, constexprs and Triton's specialization depend on: the config, the
    device, the dtype, every size and stride, and each tensor's 16-byte alignment."""
    return (config, a.device, a.dtype, *a.shape, b.shape[1], *a.stride(), *b.stride(), *c.stride(),
            a.data_ptr() % 16, b.data_ptr() % 16, c.data_ptr() % 16)


def _constexprs(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor, **extra: Any) -> dict[str, Any]:
    """The tiled and split-K kernels' constexprs and launch options for ``config`` on these operands."""
    bk = config["BLOCK_K"]
    align, c_align = alignment_hints(a, b, c)
    return dict(BLOCK_M=config["BLOCK_M"], BLOCK_N=config["BLOCK_N"], BLOCK_K=bk,
                GROUP_SIZE_M=config["GROUP_SIZE_M"], EVEN_K=a.shape[1] % bk == 0, INDEX_64=_needs_int64(a, b, c),
                DOT_PRECISION=_dot_precision(a), ALIGN=align, C_ALIGN=c_align, WRAP_ALIGNED=wrap_aligned(a, b),
                num_warps=config.num_warps, num_stages=config.num_stages, **extra)


def alignment_hints(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> tuple[int, int]:
    """(ALIGN, C_ALIGN): 16 bytes' worth of elements where the kernel may rely on 16-byte aligned rows
    that Triton cannot see (of A and B, and of C), else 1.

    Triton specializes an integer argument as aligned only when it divides by 16. A row of 1000 fp16
    values is 2,000 bytes, 16-byte aligned, yet 1000 % 16 = 8: without the hint every load of
    1000x1000x1000 is a scalar 2-byte load and none is pipelined (the PTX has ``ld.global.b16`` and
    no ``cp.async``); with it the loads are 16-byte ``cp.async`` copies (tests/kernels_tests/test_gemm_alignment.py
    compiles both). ALIGN holds when K and the non-unit strides of A and B are multiples of 16
    bytes; C_ALIGN when N and C's are. Each operand needs a unit stride and 16-byte aligned data.
    Where every value divides by 16 already Triton knows, and the hint is left off, so such
    problems compile exactly as before.
    """
    unit = 16 // a.element_size()
    k, n = a.shape[1], b.shape[1]
    return _hint(unit, k, a, b), _hint(unit, n, c)


def wrap_aligned(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Whether the tiles' wrapped edge offsets may be claimed contiguous (the WRAP_ALIGNED constexpr).

    The last tile of a dimension wraps its offsets past the edge back to 0. Where that dimension is
    an operand's contiguous one (N of a row-major B, M of a column-major A), 16-byte vectors stay
    aligned across the wrap only if the dimension is a multiple of 16 bytes. B = W[:, :33] of a
    (K, 64) W has 16-byte aligned rows, yet a vector across its wrap would start 14 bytes in.
    """
    unit = 16 // a.element_size()
    m, n = a.shape[0], b.shape[1]
    a_by_columns = a.stride(0) == 1 and a.stride(1) != 1
    b_by_rows = b.stride(1) == 1
    return not ((a_by_columns and m % unit) or (b_by_rows and n % unit))


def _hint(unit: int, size: int, *tensors: torch.Tensor) -> int:
    values = [size]
    for t in tensors:
        if (t.stride(0) != 1 and t.stride(1) != 1) or t.data_ptr() % 16:
            return 1
        values += [s for s in t.stride() if s != 1]
    if unit <= 1 or any(v % unit for v in values) or all(v % 16 == 0 for v in values):
        return 1
    return unit


def _launch_tiled(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    m, k = a.shape
    n = b.shape[1]
    launch = LAUNCHES.get_or_make(_launch_key(config, a, b, c), lambda: _tiled_launch(config, a, b, c))
    launch(a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))


def _tiled_launch(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> DirectLaunch:
    grid = (_cdiv(a.shape[0], config["BLOCK_M"]) * _cdiv(b.shape[1], config["BLOCK_N"]),)
    return DirectLaunch(_tiled_kernel, grid, _constexprs(config, a, b, c))


def direct_launch(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor
                  ) -> tuple[DirectLaunch, Callable[[], tuple[torch.Tensor, torch.Tensor]] | None]:
    """A tiled, split-K or gemv launch for operands like these (a call plan keeps it, kernels/_plans.py),
    and for a split K the function that hands out its workspace; the runtime arguments are the caller's."""
    if config["VARIANT"] == "gemv":
        return _gemv_launch(config, a, b, c), None
    if config["VARIANT"] == "tiled" or (config["VARIANT"] == "repack" and config["SPLIT_K"] == 1):
        return _tiled_launch(config, a, b, c), None
    m, n = a.shape[0], b.shape[1]
    bm, bn, split = config["BLOCK_M"], config["BLOCK_N"], config["SPLIT_K"]
    tiles = _cdiv(m, bm) * _cdiv(n, bn)
    device, partial_elems = a.device, tiles * split * bm * bn
    launch = DirectLaunch(_splitk_kernel, (tiles, split), _constexprs(config, a, b, c, SPLIT_K=split))
    return launch, _WORKSPACE.getter(device, partial_elems, tiles)


class _Scratch:
    """Scratch buffers kept per (what, device, stream) and grown on demand, for launches that need room
    of their own: split-K's partial tiles and arrival counters, repack's padded operands.

    Per stream, because launches on one stream run in order (one buffer serves them all) while
    launches on concurrent streams would race on a shared one. A buffer outgrown on a side stream is
    kept, not freed: CUDA graphs are captured on side streams (never on the legacy default stream), and
    a captured graph reads and writes its buffer on every replay. Growth at least doubles, so what is
    kept stays under the live buffer's size.

    Kept buffers are allocated outside any CUDA-graph pool (``kernels._memory``), and never while the
    stream captures: a capture whose stream has no buffer large enough gets one for that call from the
    graph's own pool (``make(size, kept=False)``), which the graph then owns like any of its intermediates.
    """

    def __init__(self) -> None:
        self._held: dict[tuple, tuple[int, Any]] = {}
        self._outgrown: list[Any] = []

    def getter(self, what: Hashable, device: torch.device, need: int, make: Callable[[int, bool], Any]
               ) -> Callable[[], Any]:
        """A function that returns the current stream's buffers of ``what`` (at least ``need`` large):
        what a launch plan keeps, so that a call pays a stream query and a dict lookup, nothing more."""
        index = device.index if device.type == "cuda" else None
        held = self._held

        def get() -> Any:
            stream = _raw_stream(index) if index is not None else 0
            entry = held.get((what, index, stream))
            if entry is not None and entry[0] >= need:
                return entry[1]
            if index is not None and _capturing():
                return make(need, False)
            return self._grow((what, index, stream), need, make)
        return get

    def get(self, what: Hashable, device: torch.device, need: int, make: Callable[[int, bool], Any]) -> Any:
        return self.getter(what, device, need, make)()

    def _grow(self, key: tuple, need: int, make: Callable[[int, bool], Any]) -> Any:
        entry = self._held.get(key)
        size = max(need, 2 * entry[0]) if entry is not None else need
        buffers = make(size, True)
        if entry is not None and key[2] != 0:
            self._outgrown.append(entry[1])
        self._held[key] = (size, buffers)
        return buffers


_SCRATCH = _Scratch()


def _scratch_tensor(size: int, kept: bool, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return kept_empty(size, dtype, device) if kept else torch.empty(size, dtype=dtype, device=device)


class _SplitKWorkspace:
    """fp32 partial tiles and arrival counters for split-K (``_Scratch``, per device and stream).

    The kernel re-arms each counter to zero after use, so counters need zeroing once, when their
    buffer is allocated. A kept buffer is allocated and zeroed outside any capture. A capture's
    buffer for one call is zeroed by a node of that graph, before the kernel on every replay.
    """

    def getter(self, device: torch.device, partial_elems: int, tiles: int
               ) -> Callable[[], tuple[torch.Tensor, torch.Tensor]]:
        # One size covers both: partial tiles of `need` fp32 elements, and a counter per 256 of them
        # (a tile holds at least 16 x 16 elements, so the tiles fit).
        need = max(partial_elems, tiles * 256, 1 << 16)
        return _SCRATCH.getter("splitk", device, need, lambda size, kept: _splitk_buffers(device, size, kept))

    def get(self, device: torch.device, partial_elems: int, tiles: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.getter(device, partial_elems, tiles)()


def _splitk_buffers(device: torch.device, size: int, kept: bool) -> tuple[torch.Tensor, torch.Tensor]:
    partial = _scratch_tensor(size, kept, torch.float32, device)
    counters = _scratch_tensor(size // 256, kept, torch.int32, device).zero_()
    return partial, counters


_WORKSPACE = _SplitKWorkspace()


def _launch_splitk(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    m, k = a.shape
    n = b.shape[1]
    bm, bn, split = config["BLOCK_M"], config["BLOCK_N"], config["SPLIT_K"]
    tiles = _cdiv(m, bm) * _cdiv(n, bn)
    # The workspace may be reallocated between calls; a fresh allocation has the same alignment.
    partial, arrivals = _WORKSPACE.get(a.device, tiles * split * bm * bn, tiles)
    launch = LAUNCHES.get_or_make(_launch_key(config, a, b, c), lambda: DirectLaunch(
        _splitk_kernel, (tiles, split), _constexprs(config, a, b, c, SPLIT_K=split)))
    launch(a, b, c, partial, arrivals, m, n, k,
           a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))


# gemv runs a row of programs per row of A, on a grid axis CUDA caps at this many.
_GEMV_MAX_ROWS = 65535


def _gemv_launch(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> DirectLaunch:
    """The gemv launch: the tiled kernel's runtime arguments, so call plans and the C++ path launch it alike."""
    m, k = a.shape
    n = b.shape[1]
    if m > _GEMV_MAX_ROWS:
        raise ValueError(f"VARIANT=gemv launches a row of programs per row of A, at most {_GEMV_MAX_ROWS}; A has {m} "
                         "rows: use VARIANT=tiled or splitk, which the tuner picks for such problems")
    bn, bk = config["GEMV_BLOCK_N"], config["GEMV_BLOCK_K"]
    return DirectLaunch(_gemv_kernel, (_cdiv(n, bn), m),
                        dict(BLOCK_N=bn, BLOCK_K=bk, EVEN_K=k % bk == 0, INDEX_64=_needs_int64(a, b, c),
                             num_warps=config.num_warps, num_stages=config.num_stages))


def _launch_gemv(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    launch = LAUNCHES.get_or_make(_launch_key(config, a, b, c), lambda: _gemv_launch(config, a, b, c))
    launch(a, b, c, a.shape[0], b.shape[1], a.shape[1],
           a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))


def _tma_ready(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> bool:
    """Whether these very tensors meet TMA's rules (a sliced view can break what the shape promised)."""
    size = a.element_size()
    b_kmajor = b.stride(0) == 1 and b.stride(1) != 1
    rows = (a.stride(0), b.stride(1) if b_kmajor else b.stride(0), c.stride(0))
    return (a.stride(1) == 1 and (b_kmajor or b.stride(1) == 1) and c.stride(1) == 1
            and all((r * size) % 16 == 0 for r in rows)
            and all(t.data_ptr() % 16 == 0 for t in (a, b, c)))


def _launch_tma(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    if not _tma_ready(a, b, c):
        _launch_tiled(config, a, b, c)  # same tile shape, pointer loads: right on any strides
        return
    launch = LAUNCHES.get_or_make(_launch_key(config, a, b, c), lambda: TmaLaunch(config, a, b, c))
    launch(a, b, c)


class _Described:
    """What Triton's launcher reads of a tensor descriptor (base, shape, strides, padding), without
    ``TensorDescriptor``'s checks: this launch checked them once, on its first call, for tensors
    laid out like every later call's (same sizes and strides, 16-byte aligned data)."""

    __slots__ = ("base", "shape", "strides", "block_shape", "padding")

    def __init__(self, base: torch.Tensor, shape: list[int], strides: list[int], block_shape: list[int]) -> None:
        self.base, self.shape, self.strides, self.block_shape, self.padding = base, shape, strides, block_shape, "zero"


try:  # how triton 3.6 expands a tensor descriptor for its C launcher (a CUtensorMap, then shape and strides)
    from triton.backends.nvidia.driver import make_tensordesc_arg as _expand_descriptor
except ImportError:  # another backend or triton: the descriptors go through Triton's own wrapper
    _expand_descriptor = None

# CUtensorMaps kept per operand, by base address. A map is a pure function of the address once the
# layout is fixed (as it is per TmaLaunch), so a kept one is never stale; the bound only caps memory
# where activations come from ever-new addresses. It is at least the tuner's input rotation
# (tuner/timing.py MAX_ROTATION): with fewer, every timed eager call re-encoded its maps, a cost a
# model's calls (fixed weights, a few recycled activation buffers) do not pay.
_TENSORMAPS_PER_OPERAND = 256


class TmaLaunch:
    """The persistent TMA kernel on operands laid out like the first call's, launched directly.

    The first call builds real ``TensorDescriptor``s (Triton specializes on them and checks them).
    Later calls skip the Python that triton wraps around its launcher for descriptors: that wrapper
    encodes each operand's CUtensorMap on every launch. Here a map is encoded once per operand and base
    address (a weight's never changes; activations and outputs come back to a few addresses from
    torch's caching allocator) and handed to the C launcher as the wrapper would. Where triton offers
    no such launcher, light stand-ins of the descriptors go through the wrapper (``_Described``).
    Host time per call: 60 us with real descriptors through Triton's path, 17 us with stand-ins through
    the wrapper (2026-11-24); with the kept maps, docs/BENCHMARKS.md (2026-11-24).
    """

    def __init__(self, config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
        m, k = a.shape
        n = b.shape[1]
        bm, bn, bk = config["BLOCK_M"], config["BLOCK_N"], config["BLOCK_K"]
        self.b_kmajor = b.stride(0) == 1 and b.stride(1) != 1
        # (shape, strides, block) of A, of B (as w = b.t() when K-major), of C.
        self.layouts = (([m, k], [a.stride(0), 1], [bm, bk]),
                        ([n, k], [b.stride(1), 1], [bn, bk]) if self.b_kmajor else ([k, n], [b.stride(0), 1], [bk, bn]),
                        ([m, n], [c.stride(0), 1], [bm, bn // 2] if config["EPILOGUE_SUBTILE"] else [bm, bn]))
        self.sizes = (m, n, k)
        programs = min(config["NUM_SM"], _cdiv(m, bm) * _cdiv(n, bn))
        self.launch = DirectLaunch(_tma_kernel, (programs,), dict(
            BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=config["GROUP_SIZE_M"], NUM_SM=programs,
            B_KMAJOR=self.b_kmajor, FLATTEN=config["FLATTEN"], EPILOGUE_SUBTILE=config["EPILOGUE_SUBTILE"],
            DOT_PRECISION=_dot_precision(a), num_warps=config.num_warps, num_stages=config.num_stages))
        self._raw: Callable[..., None] | None = None  # triton's C launcher, once adopted and unwrapped
        self._metas: list[dict] = []
        self._looked = False
        self._maps: tuple[dict[int, tuple], ...] = ({}, {}, {})
        # (A's, B's and C's addresses, the launch's arguments) of the last raw launch: a model's repeated
        # call (the same weight, activations and output recycled by the caching allocator) reuses the
        # whole argument tuple, not three map lookups and a concatenation. One tuple, swapped whole.
        self._last: tuple[tuple[int, int, int], tuple] = ((-1, -1, -1), ())

    def __call__(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
        launch = self.launch
        if launch.ready():
            if not self._looked:
                self._look_for_raw_launcher()
            if self._raw is not None:
                addresses = (a.data_ptr(), b.data_ptr(), c.data_ptr())
                last_addresses, args = self._last
                if addresses != last_addresses:
                    # b's data pointer is that of w = b.t() when K-major: the map needs nothing else of it.
                    args = (*self._map(0, a), *self._map(1, b), *self._map(2, c), *self.sizes)
                    self._last = (addresses, args)
                launch.launch_raw(self._raw, *args)
                return
            a_layout, b_layout, c_layout = self.layouts
            launch.launch_direct(_Described(a, *a_layout), _Described(b.t() if self.b_kmajor else b, *b_layout),
                                 _Described(c, *c_layout), *self.sizes)
            return
        a_layout, b_layout, c_layout = self.layouts  # Triton's path specializes on real descriptors, and checks them
        launch.launch_triton(TensorDescriptor(a, *a_layout), TensorDescriptor(b.t() if self.b_kmajor else b, *b_layout),
                             TensorDescriptor(c, *c_layout), *self.sizes)

    def _look_for_raw_launcher(self) -> None:
        found = self.launch.descriptor_launcher() if _expand_descriptor is not None else None
        if found is not None and len(found[1]) == len(self.layouts):
            self._metas = found[1]
            self._raw = found[0]  # set last: a thread that sees it finds the metadata in place
        self._looked = True

    def _map(self, operand: int, t: torch.Tensor) -> tuple:
        """The expanded descriptor of ``t`` (CUtensorMap, shape, strides), encoded once per address."""
        ptr = t.data_ptr()
        kept = self._maps[operand]
        expanded = kept.get(ptr)
        if expanded is None:
            if len(kept) >= _TENSORMAPS_PER_OPERAND:
                kept.clear()
            expanded = kept[ptr] = tuple(_expand_descriptor(_Described(t, *self.layouts[operand]),
                                                            self._metas[operand]))
        return expanded


_PAD_BLOCK_R, _PAD_BLOCK_C = 16, 256


class RepackLaunch:
    """``repack`` on operands laid out like the first call's: one launch copies both operands into a
    padded scratch buffer kept per stream (``_Scratch``), one runs the kernel on it. Before, each call
    allocated two buffers and launched two copies (docs/BENCHMARKS.md, 2026-11-24)."""

    def __init__(self, config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
        m, k = a.shape
        n = b.shape[1]
        k_padded = _cdiv(k, config["BLOCK_K"]) * config["BLOCK_K"]
        self.elems, self.shapes = (m + n) * k_padded, (m, n, k_padded)
        tiles_c = _cdiv(k_padded, _PAD_BLOCK_C)
        a_programs = _cdiv(m, _PAD_BLOCK_R) * tiles_c
        self.pad = DirectLaunch(_pad_pair_kernel, (a_programs + _cdiv(n, _PAD_BLOCK_R) * tiles_c,),
                                dict(BLOCK_R=_PAD_BLOCK_R, BLOCK_C=_PAD_BLOCK_C, num_warps=4))
        # B is copied as w = B^T, rows along K, whatever its own layout (see _launch_repack).
        self.pad_args = (m, n, k, k_padded, a.stride(0), a.stride(1), b.stride(1), b.stride(0), a_programs, tiles_c)
        self._views: tuple[Any, Any, Any] = (None, None, None)
        dtype, device = a.dtype, a.device
        self.scratch = _SCRATCH.getter(("repack", dtype), device, self.elems,
                                       lambda size, kept: _scratch_tensor(size, kept, dtype, device))
        _, a_padded, b_padded = self._padded_views()  # their layout, for the kernel's launch: nothing copied yet
        self.launch, self.workspace = direct_launch(config, a_padded, b_padded, c)
        self.args = (m, n, k_padded, a_padded.stride(0), a_padded.stride(1), b_padded.stride(0),
                     b_padded.stride(1), c.stride(0), c.stride(1))

    def _padded_views(self) -> tuple[Any, torch.Tensor, torch.Tensor]:
        """(this stream's scratch buffer, A padded [m, k_padded], B padded [k_padded, n] as a view of
        w [n, k_padded]); the views are made again only when the stream's buffer is new."""
        buffer = self.scratch()
        if self._views[0] is buffer:
            return self._views
        m, n, k_padded = self.shapes
        views = (buffer, buffer[:m * k_padded].view(m, k_padded),
                 buffer[m * k_padded:(m + n) * k_padded].view(n, k_padded).t())
        if not (buffer.is_cuda and _capturing()):  # a capture's own buffer must die with its call
            self._views = views
        return views

    def native_ready(self) -> bool:
        """Whether both kernels have been compiled and adopted (the first call ran)."""
        return self.pad.ready() and self.launch.ready()

    def native_launch(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> list[NativeLaunch] | None:
        """The copy and the kernel as kernels/_native.cpp launches them, A, B and C filled in per call, on
        the C++ path's padded buffer (``_native_padded``): the Python path's buffer of the default stream
        may be in use by a call that the C++ path leaves to Python (another thread's, a torch function
        mode's), and the C++ path holds its own lock across every pair of launches, not ``_REPACK_PAIR``.
        Call it on the default stream only (split-K's workspace is that stream's), once ``native_ready``."""
        m, n, k_padded = self.shapes
        buffer = _native_padded(self.elems, a.dtype, a.device)
        a_padded = buffer[:m * k_padded].view(m, k_padded)
        b_padded = buffer[m * k_padded:(m + n) * k_padded].view(n, k_padded).t()
        pad = self.pad.native_launch((a, b, buffer, *self.pad_args), {0: SLOT_A, 1: SLOT_B})
        fixed = self.args if self.workspace is None else (*self.workspace(), *self.args)
        gemm = self.launch.native_launch((a_padded, b_padded, c, *fixed), {2: SLOT_C})
        return None if pad is None or gemm is None else [pad, gemm]

    def __call__(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
        # The copy and the kernel are two launches on one buffer per stream: another thread's copy on
        # the same stream between them would hand this kernel its operands. The lock keeps each pair
        # together (Triton's launcher lets go of the GIL); uncontended, it costs well under 1 us.
        with _REPACK_PAIR:
            buffer, a_padded, b_padded = self._padded_views()
            self.pad(a, b, buffer, *self.pad_args)
            if self.workspace is None:
                self.launch(a_padded, b_padded, c, *self.args)
            else:
                self.launch(a_padded, b_padded, c, *self.workspace(), *self.args)


_NATIVE_PADDED: dict[tuple[torch.dtype, torch.device], torch.Tensor] = {}
_NATIVE_PADDED_LOCK = threading.Lock()


def _native_padded(elems: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """The padded buffer of repack plans launched from C++, one per dtype and device, at least ``elems``
    long. The C++ path launches every pair under one lock on the default stream, so the plans share it;
    it grows at least twofold, and a plan keeps the buffer it was handed, so what all plans hold stays
    under twice the largest."""
    with _NATIVE_PADDED_LOCK:
        held = _NATIVE_PADDED.get((dtype, device))
        if held is None or held.numel() < elems:
            held = kept_empty(max(elems, 2 * held.numel()) if held is not None else elems, dtype, device)
            _NATIVE_PADDED[(dtype, device)] = held
        return held


_REPACK_PAIR = threading.RLock()  # re-entrant: a launch hook that itself runs a repack call must not deadlock


def _launch_repack(config: Config, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    """Copy A and B into a zero-padded buffer with 16-byte aligned rows, then run the tiled kernel
    (or split-K, with SPLIT_K > 1) on it: ``RepackLaunch``, as a call plan runs it.

    Rows that are not a multiple of 16 bytes (K = 4099) defeat every wide load: the tiled kernel falls
    back to 2-byte loads that cannot be pipelined, and TMA refuses such strides. One padding copy of
    both operands (zeros past K, which add nothing to the sum) costs a pass over A and B; the search
    weighs that against the faster kernel, copy included.

    B is copied K-major, as ``w.t()`` of an (N, K_padded) weight, whatever its own layout: its
    rows are then aligned whatever N is, and N is not the dimension its loads are wide along, so
    the tiles' wrap at N = 257 costs nothing (wrap_aligned) and C is written in place.
    """
    LAUNCHES.get_or_make(_launch_key(config, a, b, c), lambda: RepackLaunch(config, a, b, c))(a, b, c)


_LAUNCHERS = {"tiled": _launch_tiled, "splitk": _launch_splitk, "tma": _launch_tma, "repack": _launch_repack,
              "gemv": _launch_gemv}


def matmul_with(config: Config, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B with one explicit config (``VARIANT=cublas`` runs torch.matmul)."""
    check_operands(a, b)
    return _run_checked(config, a, b, out)


def _checked_out(out: torch.Tensor, a: torch.Tensor, m: int, n: int) -> torch.Tensor:
    """``out`` itself if the kernel may write C into it, else the error that says why not."""
    if not isinstance(out, torch.Tensor):
        raise TypeError(f"out must be a torch tensor; got {type(out).__name__}")
    if tuple(out.shape) != (m, n):
        raise ValueError(f"out has shape {tuple(out.shape)} but C is ({m}, {n}); pass an out of that shape or none")
    if out.dtype != a.dtype:
        raise TypeError(f"out is {out.dtype} but the operands are {a.dtype}; C is written in the operands' dtype")
    if out.device != a.device:
        raise ValueError(f"out is on {out.device} but the operands are on {a.device}")
    if overlapping(out):
        raise ValueError(f"out has elements that share memory (strides {out.stride()}, e.g. an expanded tensor): "
                         "the result would be garbage; pass a tensor whose elements are distinct, e.g. torch.empty")
    return out


def overlapping(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` share memory (a stride 0 from ``expand``, or strides that interleave):
    torch refuses to write such a tensor, and so do we."""
    if t.is_contiguous():  # the usual out, answered in C
        return False
    reach = 1
    for stride, size in sorted((st, sz) for st, sz in zip(t.stride(), t.shape) if sz > 1):
        if stride < reach:
            return True
        reach = stride * size
    return False


def _run_checked(config: Config, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """The launcher behind matmul_with and the dispatcher, for operands already checked."""
    m, k = a.shape
    n = b.shape[1]
    variant = config.get("VARIANT", "tiled")
    if variant == "cublas":
        return torch.matmul(a, b, out=out)
    c = _checked_out(out, a, m, n) if out is not None else torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_()
    _LAUNCHERS[variant](config, a, b, c)
    return c


# ----------------------------------------------------------------------------------------------
# What the tuner and the dispatcher need: the KernelSpec
# ----------------------------------------------------------------------------------------------

def check_operands(a: Any, b: Any) -> None:
    """Raise TypeError/ValueError naming what is wrong with a matmul's operands, and the fix."""
    for name, t in (("a", a), ("b", b)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"matmul takes torch tensors; {name} is a {type(t).__name__}")
        if t.dim() != 2:
            raise ValueError(f"matmul takes 2-D tensors; {name} has shape {tuple(t.shape)}. "
                             "Reshape batched inputs to 2-D (x.reshape(-1, x.shape[-1])) or use torch.matmul")
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(f"matmul takes float16, bfloat16 or float32; {name} is {t.dtype}. "
                            f"Cast it first, e.g. {name}.half()")
    if a.dtype != b.dtype:
        raise TypeError(f"a is {a.dtype} but b is {b.dtype}; cast one so both have the same dtype")
    if a.shape[1] != b.shape[0]:
        raise ValueError(f"inner dimensions differ: a is {tuple(a.shape)}, b is {tuple(b.shape)}; "
                         "a's columns must equal b's rows (did you mean b.t()?)")
    if a.device != b.device:
        raise ValueError(f"a is on {a.device} but b is on {b.device}; move both to one device")


def layout_letter(t: torch.Tensor) -> str:
    """'n' for row-major (last stride 1), 't' for a transposed view (first stride 1)."""
    if t.stride(1) == 1 or t.shape[1] <= 1:
        return "n"
    return "t" if t.stride(0) == 1 or t.shape[0] <= 1 else "n"


def problem_of(a: torch.Tensor, b: torch.Tensor) -> Problem:
    check_operands(a, b)
    return Problem(KERNEL, DTYPE_NAMES[a.dtype], layout_letter(a) + layout_letter(b),
                   ((a.shape[0], b.shape[1], a.shape[1]),))


def make_inputs(problem: Problem, device: Any, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Fresh random normal operands in the problem's layout, scaled so that C is O(1)."""
    m, n, k = problem.shape
    gen = torch.Generator(device=device).manual_seed(seed)
    dtype = TORCH_DTYPES[problem.dtype]
    scale = 1.0 / math.sqrt(max(k, 1))

    def operand(rows: int, cols: int, letter: str) -> torch.Tensor:
        shape = (cols, rows) if letter == "t" else (rows, cols)
        t = (torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * math.sqrt(scale)).to(dtype)
        return t.t() if letter == "t" else t

    return operand(m, k, problem.layout[0]), operand(k, n, problem.layout[1])


def check_inputs(problem: Problem, device: Any, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``make_inputs`` with loud edges (kernels/_check.py): the last K column, last row and last column."""
    a, b = make_inputs(problem, device, seed)
    loud_edges(a, b)
    return a, b


def reference(inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    a, b = inputs
    return torch.matmul(a.double(), b.double()).float() if a.device.type == "cpu" else \
        torch.matmul(a.float(), b.float())


def run(config: Config, inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return _run_checked(config, *inputs)


def baseline(inputs: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
    return torch.matmul(*inputs)


def default_config(problem: Problem, device: DeviceInfo) -> Config:
    """A sound tiled config for any problem: tiles no larger than the problem, always valid."""
    m, n, k = problem.shape
    bm = min(128, max(16, triton.next_power_of_2(max(m, 1))))
    bn = min(128, max(32, triton.next_power_of_2(max(n, 1))))
    bk = min(64, max(32, triton.next_power_of_2(max(k, 1))))
    stages = 3 if problem.dtype != "fp32" else 2
    config = Config.make(VARIANT="tiled", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=8,
                         SPLIT_K=1, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False,
                         num_warps=4 if bm * bn <= 64 * 128 else 8, num_stages=stages)
    # Smaller GPUs (A10, L4: ~99 KiB per block) need a shallower pipeline, then smaller tiles.
    while _fits_shared_memory(config, problem, device):
        if config.num_stages > 2:
            config = config.replace(num_stages=config.num_stages - 1)
        elif config["BLOCK_K"] > 32:
            config = config.replace(BLOCK_K=config["BLOCK_K"] // 2)
        elif max(config["BLOCK_M"], config["BLOCK_N"]) > 32:
            config = config.replace(BLOCK_M=max(16, config["BLOCK_M"] // 2), BLOCK_N=max(32, config["BLOCK_N"] // 2))
        else:
            break  # 32x32x32 in two stages fits every GPU Triton supports
    return SPACE.canonical(config)


# (GEMV_BLOCK_N, GEMV_BLOCK_K, num_warps) of the gemv seeds: the best of scripts/probes/gemv_probe.py, retired at 1996844 on nine
# one-row problems (H100, 2026-11-26) and their neighbours.
GEMV_SEEDS = ((4, 2048, 4), (2, 2048, 2), (2, 1024, 4), (8, 1024, 8), (1, 4096, 2))


def seed_configs(problem: Problem, device: DeviceInfo) -> list[Config]:
    """Configs that are good on Hopper for problems of this kind: the search measures them first."""
    m, n, k = problem.shape
    base = dict(GROUP_SIZE_M=8, SPLIT_K=1, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False)
    rows: list[dict] = []
    if m <= 128:  # memory-bound: thin tiles, deep K, many programs in flight
        rows += [dict(VARIANT="tiled", BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, num_warps=4, num_stages=5),
                 dict(VARIANT="tiled", BLOCK_M=16, BLOCK_N=32, BLOCK_K=256, num_warps=4, num_stages=5),
                 dict(VARIANT="splitk", BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, SPLIT_K=4, num_warps=4, num_stages=4),
                 dict(VARIANT="splitk", BLOCK_M=32, BLOCK_N=64, BLOCK_K=128, SPLIT_K=2, num_warps=4, num_stages=4),
                 dict(VARIANT="tma", BLOCK_M=64, BLOCK_N=64, BLOCK_K=128, NUM_SM=132, num_warps=4, num_stages=4)]
    if not gemv_unsupported(problem):  # one row: B streamed by thin column blocks, long runs of K
        rows += [dict(VARIANT="gemv", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GEMV_BLOCK_N=bn, GEMV_BLOCK_K=bk,
                      num_warps=warps, num_stages=2) for bn, bk, warps in GEMV_SEEDS]
    if _misaligned_rows(problem):  # rows that are not 16-byte aligned: the padded copy, then wide loads
        rows += [dict(VARIANT="repack", BLOCK_M=256, BLOCK_N=64, BLOCK_K=64, num_warps=8, num_stages=5),
                 dict(VARIANT="repack", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
                 dict(VARIANT="repack", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, SPLIT_K=2, num_warps=8, num_stages=4),
                 dict(VARIANT="repack", BLOCK_M=128, BLOCK_N=64, BLOCK_K=64, SPLIT_K=2, num_warps=4, num_stages=4)]
    rows += [dict(VARIANT="tma", BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3),
             dict(VARIANT="tma", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
             dict(VARIANT="tma", BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3,
                  EPILOGUE_SUBTILE=True, FLATTEN=True),
             dict(VARIANT="tiled", BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3),
             dict(VARIANT="tiled", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, num_warps=8, num_stages=4),
             dict(VARIANT="tiled", BLOCK_M=64, BLOCK_N=128, BLOCK_K=64, num_warps=4, num_stages=4)]
    configs = [SPACE.canonical(Config.from_dict({**base, **row})) for row in rows]
    return [c for c in configs if SPACE.violation(c, problem, device) is None]


def distance(p: Problem, q: Problem) -> float:
    if p.dtype != q.dtype or p.layout != q.layout or len(p.shapes) != 1 or len(q.shapes) != 1:
        return math.inf
    return log_distance(p.shape, q.shape)


def _one_gemm(problem: Problem) -> None:
    if len(problem.shapes) != 1:
        raise ValueError(f"matmul problem key {problem.key!r} names {len(problem.shapes)} GEMMs; a dense matmul "
                         "key has one MxNxK (groups belong to grouped_matmul or moe_matmul)")


MATMUL = KernelSpec(
    name=KERNEL,
    space=SPACE,
    dtypes=("fp16", "bf16", "fp32"),
    problem_of=problem_of,
    make_inputs=make_inputs,
    reference=reference,
    run=run,
    baseline=baseline,
    default_config=default_config,
    distance=distance,
    seeds=seed_configs,
    check_problem=_one_gemm,
    check_inputs=check_inputs,
    # Where the problem folds them (kernels/_spec.py SearchSpace.portable): the usual group, one
    # program per SM.
    portable_values=lambda device: {"GROUP_SIZE_M": 8, "NUM_SM": device.sm_count},
    baseline_when_untuned=True,
)


@functools.lru_cache(maxsize=None)
def _tutorial_configs() -> tuple[Config, ...]:
    """The 16-ish configs of Triton's matmul tutorial, as a warm start and as the autotune baseline."""
    rows = [(128, 256, 64, 3, 8), (64, 256, 32, 4, 4), (128, 128, 32, 4, 4), (128, 64, 32, 4, 4),
            (64, 128, 32, 4, 4), (128, 32, 32, 4, 4), (64, 32, 32, 5, 2), (32, 64, 32, 5, 2),
            (128, 256, 128, 3, 8), (256, 128, 128, 3, 8), (256, 64, 128, 4, 4), (64, 256, 128, 4, 4),
            (128, 128, 128, 4, 4), (128, 64, 64, 4, 4), (64, 128, 64, 4, 4), (128, 32, 64, 4, 4)]
    return tuple(SPACE.canonical(Config.make(VARIANT="tiled", BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_SIZE_M=8,
                                       SPLIT_K=1, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False,
                                       num_warps=w, num_stages=s))
                 for bm, bn, bk, s, w in rows)


def tutorial_configs() -> tuple[Config, ...]:
    return _tutorial_configs()
