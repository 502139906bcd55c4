"""Whether patching a module can make it faster: does dispatch run one of our kernels for its problems?

``kernels.patch`` swaps a module's forward only where this says yes. A module whose every problem dispatch would
hand to the baseline (cuBLAS, ``torch._grouped_mm``) gains nothing from the swap and pays our path's host time
on every call: on an H200 with no table (2026-11-28, torch 2.11.0+cu130, triton 3.6.0, transformers 5.24.0,
``scripts/bench_models.py --no-shipped --control``) the patched dense models ran at 0.94-0.99x of vanilla in
prefill 512 and decode where an unpatched copy read 0.98-1.02x, and MoE decode at batch 1 0.79x. Such a module
keeps torch's forward. Dispatch's own rules decide (a tuned record, a neighbour's, the untuned GPU's cuBLAS), so
the evidence is what the tables hold for this GPU, per problem.

A module's problems are not known before it runs (the row count is the batch's tokens), so each is asked at
``PROBE_ROWS``, from a decode step of one token to a long prefill. Record mode patches every module: it is
there to see every problem, tuned or not (``search --recorded`` then tunes them, and a later ``patch`` finds
the evidence).

The same question per call (``takes_ours``): a patched module meets row counts where dispatch runs the
baseline too (a table with Triton winners at decode sizes, cuBLAS at prefill). There the module runs torch's
own forward, not our path around the same cuBLAS call: on the H200 with its table (2026-11-28, same versions,
``scripts/bench_models.py --control``) our path
there cost prefill at 512 tokens 5-6% of a host-bound model's time (0.94-0.95x of vanilla, against 0.98-1.00x
once routed). The answer is kept per (module's kernel and shape, x's shape, dtype, device) and forgotten with
dispatch's plans (``kernels.clear_cache``, ``use_database``, the refresh thread).
"""

from __future__ import annotations

import torch

from . import _plans, moe, moe_gated
from ._device import current_device
from ._families import KERNELS
from ._launch import BoundedDict
from ._modes import MODES
from ._record_mode import RECORDER
from ._spec import DeviceInfo, KernelSpec, Problem, is_baseline
from .dispatch import DISPATCHER
from .gemm import DTYPE_NAMES

__all__ = ["PROBE_ROWS", "Evidence", "Route", "route_of", "takes_ours"]

# Row counts a model's GEMMs meet: decode at batch 1 to 64, prefill of one prompt to a batch of long ones.
PROBE_ROWS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


class Evidence:
    """What dispatch runs for the modules of one ``patch`` call, asked once per (kernel, N, K, dtype, device):
    a model repeats its layers' shapes."""

    def __init__(self, rows: tuple[int, ...] = PROBE_ROWS, everywhere: bool = False) -> None:
        self.rows = rows
        self.everywhere = everywhere  # kernels.patch(..., everywhere=True): no question asked
        self._found: dict[tuple, bool] = {}

    def runs_a_kernel(self, spec: KernelSpec, n: int, k: int, weight: torch.Tensor) -> bool:
        """Whether dispatch runs a config of ``spec`` other than its baseline, in either mode, for [M, K] rows
        on a weight like ``weight`` giving N columns, at any M of ``rows``. Always yes in record mode. A
        weight whose dtype our kernels do not take says no (torch runs it anyway); one on a device dispatch
        does not know (meta: a model built for its shapes) says yes, as patch did before it asked. A float64
        weight says no even with ``everywhere``: only torch computes it."""
        dtype = DTYPE_NAMES.get(weight.dtype)
        if dtype is None:
            return False
        if RECORDER.on or self.everywhere or weight.device.type not in ("cuda", "cpu"):
            return True
        key = (spec.name, n, k, dtype, weight.device)
        found = self._found.get(key)
        if found is None:
            device = current_device(weight.device)
            found = self._found[key] = any(_dispatch_runs_a_kernel(spec, dtype, m, n, k, device) for m in self.rows)
        return found

    def route(self, spec: KernelSpec, n: int, k: int) -> Route | None:
        """The per-call route of a module patched on this evidence (``takes_ours``); None with ``everywhere``,
        whose modules take our path on every call."""
        return None if self.everywhere else route_of(spec, n, k)

    def moe_runs_a_kernel(self, w: torch.Tensor, gated: bool = False) -> bool:
        """Whether dispatch runs a ``moe_matmul`` config other than its baseline for expert weights ``w`` (as
        ``moe_matmul`` takes them, [E, K, N]) at any routed row count of ``rows``, in either mode; with
        ``gated``, a ``moe_gated_matmul`` config for the gate/up weights ``w`` [E, K, 2I]."""
        if RECORDER.on or self.everywhere or w.device.type != "cuda":
            return True  # on the CPU kernels/hf.py's experts_forward decides per call, as before
        if w.dtype not in moe.DTYPES:  # float32 experts: torch's (our MoE kernels take half precision)
            return False
        family = moe_gated if gated else moe
        key = (family.KERNEL, tuple(w.shape), moe.weight_layout(w), w.dtype, w.device)
        found = self._found.get(key)
        if found is None:
            found = self._found[key] = any(not is_baseline(family.resolve(family.key_of(rows, w, mode)))
                                           for rows in self.rows for mode in MODES)
        return found


def _dispatch_runs_a_kernel(spec: KernelSpec, dtype: str, m: int, n: int, k: int, device: DeviceInfo) -> bool:
    """Whether dispatch runs a config of ``spec`` other than its baseline for [M, K] rows (row-major) on a
    transposed weight giving N columns (an nn.Linear's call), in either mode."""
    problem = Problem(spec.name, dtype, "nt", ((m, n, k),))
    return any(not is_baseline(DISPATCHER.choose(spec, problem, device, mode).config) for mode in MODES)


class Route:
    """One (kernel, N, K) a patched module computes: its per-call answers are keyed by this object, hashed by
    identity (a short flat key per call: the check costs a patched module's call about as much as
    nn.Linear's own ``self.weight`` lookup). One object per (kernel, N, K) in a process (``route_of``); a
    pickled or deep-copied module gets that process's object back."""

    __slots__ = ("kernel", "n", "k")

    def __init__(self, kernel: str, n: int, k: int) -> None:
        self.kernel, self.n, self.k = kernel, n, k

    def __reduce__(self) -> tuple:
        return _route_named, (self.kernel, self.n, self.k)

    def __deepcopy__(self, memo: dict) -> Route:
        return self

    def __repr__(self) -> str:
        return f"Route({self.kernel}, N={self.n}, K={self.k})"


# The per-call answers: (route, x's shape, dtype, device index) -> take our path. Prompts of ever-new lengths
# must not grow it for ever: past its capacity it starts again (each answer is one dispatch question).
_ROUTES: BoundedDict = BoundedDict(1 << 16)
_INTERNED: dict[tuple[str, int, int], Route] = {}
_plans.ON_CLEAR.append(_ROUTES.clear)


def route_of(spec: KernelSpec, n: int, k: int) -> Route:
    """The route of a module computing N columns from rows of K features on ``spec``'s kernel."""
    return _route_named(spec.name, n, k)


def _route_named(kernel: str, n: int, k: int) -> Route:
    found = _INTERNED.get((kernel, n, k))
    if found is None:
        found = _INTERNED.setdefault((kernel, n, k), Route(kernel, n, k))
    return found


def takes_ours(route: Route, x: torch.Tensor) -> bool:
    """Whether a patched module's call on ``x`` (rows of K features, any leading shape) takes our path:
    dispatch runs a config other than the baseline for these rows in either mode, or record mode is on (it
    counts the call). Eager calls only: under tracing the module's operator runs."""
    key = (route, x.shape, x.dtype, x.get_device())
    found = _ROUTES.get(key)
    if found is None:
        if RECORDER.on:
            return True  # not kept: the answer changes when recording stops (which clears these anyway)
        spec = KERNELS[route.kernel]
        found = _ROUTES[key] = _runs_a_kernel_at(spec, x.numel() // route.k if route.k else 0, route.n, route.k, x)
    return found


def _runs_a_kernel_at(spec: KernelSpec, rows: int, n: int, k: int, x: torch.Tensor) -> bool:
    dtype = DTYPE_NAMES.get(x.dtype)
    if dtype is None or x.device.type not in ("cuda", "cpu"):
        return dtype is not None  # float64: torch's forward; meta and other devices: our path, as before
    return _dispatch_runs_a_kernel(spec, dtype, rows, n, k, current_device(x.device))
