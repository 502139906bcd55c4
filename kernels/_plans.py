"""``kernels.matmul``: the whole path of a call, first and repeated, in the order a call meets it.

A call takes the first of these steps that applies; each is in this module unless another is named.

1. Traced by torch.compile (``torch.compiler.is_dynamo_compiling()``): the operator ``triton_tuner::matmul``
   (``_traced``; kernels/ops.py), whose fake gives the graph its shape. The compiled graph runs the operator,
   which calls ``matmul`` eagerly. Nothing below is traced: dicts, a lock and a C++ call are host state.
2. Nothing tuned for any GPU of this process (``FAST.cublas_everywhere``, learnt once per ``clear`` by
   ``_learn_cublas_everywhere``): ``torch.mm`` at once, before a key is even built.
3. The C++ path (``NATIVE.try_mm``, kernels/_native.py and _native.cpp): a signature whose eager plan was
   handed over to it (a cuBLAS plan when it is ``put``; a tiled, split-K, gemv or repack launch after a call
   on the default stream, ``_offer_launch``) is served from one C call, its key included; any other call
   returns None from it in about 40 ns and goes on here.
4. The plan dict: the call's ``signature`` finds its ``ModePlans``. A signature's first call
   (``_first_call``) checks the operands, asks the dispatcher for each mode's config, builds each mode's plan
   (``build``) and keeps them (``put``, which tells the C++ path what it may serve: ``_mirror``). An operand
   that wants a gradient takes the operator instead (``_with_grad``), whose backward is two tuned GEMMs.
5. The mode: where the two modes' plans differ, the thread's forced mode, ``KERNELS_MODE`` or the capture
   check picks one (kernels/_modes.py); where they agree (most signatures) nothing is asked.
6. The plan's call. cuBLAS: ``torch.mm`` itself. Tiled, split-K and gemv: ``_Direct`` allocates C and
   launches the compiled kernel through its ``DirectLaunch`` (kernels/_launch.py: Triton's own launch on the
   first call, which compiles; the compiled kernel's C launcher after). TMA and repack: ``_Launched``
   (kernels/gemm.py ``TmaLaunch``, ``RepackLaunch``). Whatever a plan cannot vouch for (a CPU tensor, empty
   sizes, a pointer whose 16-byte alignment differs from the first call's, ``out=``: ``with_out``) takes
   the checked launcher, ``gemm._run_checked``.

Steps 2, 3 and 6's direct launches each exist for host time per call, measured against torch.matmul's
(scripts/host_cost.py; kernels/_native.py and kernels/_launch.py give the figures); a step that does not
apply costs an attribute read or a None return. ``pinned`` and ``pinning`` install a plan for one config:
the tuner times the public call with it (tuner/timing.py), as dispatch will hold it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from typing import Any

import torch

from . import _device, _launch, _modes, _native, gemm
from ._device import current_device
from ._modes import EAGER, GRAPH, MODES
from ._record_mode import RECORDER as _REC
from ._spec import BASELINE, Config, is_baseline
from .dispatch import DISPATCHER

log = logging.getLogger(__name__)

# A plan is called as plan(a, b) on the hot path, and plan.with_out(a, b, out) when out is given.
Plan = Any

_PLANS: dict[Hashable, "ModePlans"] = {}
_LOCK = threading.Lock()
# Counts ``clear`` calls. A plan resolved while a clear ran (another thread's ``use_database``, the refresh
# thread) was resolved under the old tables: ``put`` and ``pinning`` compare it to keep nothing stale.
_GENERATION = 0


# ------------------------------------------------------------------------------------------------ the call

def matmul(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None = None) -> torch.Tensor:
    """C = A @ B with the config tuned for this GPU, problem and dispatch mode (docs/MODES.md).

    A repeated call signature (shapes, strides, a's dtype and device) costs one dict lookup before its
    plan runs; the first one checks the operands and resolves both modes' configs (this module's docstring
    tells each step). b's dtype and device are not in the key (each costs host time on every call): a plan
    checks them itself, and torch.mm (a cuBLAS plan) refuses a mismatch. An operand that requires grad, in
    grad mode, takes ``kernels.ops.matmul`` (a tuned backward) whichever config won; with ``out=`` such a
    call raises, as torch.matmul's does. Under torch.compile the call is its operator (docs/PYTORCH.md).
    """
    if _COMPILING():  # 1. traced: the operator, not this body
        return _traced(a, b, out)
    fast = FAST.cublas_everywhere
    if fast is None:
        fast = _learn_cublas_everywhere()
    native = _NATIVE.try_mm
    if fast and out is None:  # 2. nothing tuned for any GPU here: cuBLAS from the first call, at torch.mm's cost
        try:
            # Once the C++ path is ready, GPU calls take it instead: it serves cuBLAS plans by a kept cublasLt
            # plan, at less host time than torch.mm's (kernels/_native.cpp).
            if a.dtype in _TAKEN and (native is None or not a.is_cuda):
                return _MM(a, b)
        except AttributeError:
            pass  # not a tensor: the checked path below says so
        except RuntimeError:  # b of another dtype or device, not 2-D...: say so as check_operands does
            gemm.check_operands(a, b)
            raise
    if native is not None and out is None:  # 3. a signature handed over to C++ (kernels/_native.py)
        c = native(a, b)
        if c is not None:
            return c
    try:
        key = (a.shape, b.shape, a.stride(), b.stride(), a.dtype, a.device)  # 4. the plan dict: ``signature``
        # A Triton plan records no autograd graph: such a call takes the operator with a backward. Here,
        # after the C++ attempt (which declines these calls), so that its fast path pays nothing.
        if (a.requires_grad or b.requires_grad) and _GRAD_ENABLED():
            return _with_grad(a, b, out)
    except (AttributeError, TypeError):
        gemm.check_operands(a, b)  # not tensors: raises the TypeError that says so
        raise
    plans = _PLANS.get(key)
    if plans is None:
        plans = _first_call(key, a, b)
    if _REC.on:  # record mode: one dict increment per call
        _REC.counts[key] += 1
    plan = plans.both
    if plan is None:  # 5. the modes differ here: _modes.current(), inlined (every such call pays for it)
        mode = _FORCED.mode or _modes.ENV_MODE
        if mode is None or mode is _AUTO:
            mode = GRAPH if a.is_cuda and _modes.capturing() else EAGER
        plan = plans.graph if mode == GRAPH else plans.eager
    if out is None:  # 6. the plan's call
        try:
            return plan(a, b)
        except RuntimeError:  # torch.mm on a b of another dtype or device: say so as check_operands does
            gemm.check_operands(a, b)
            raise
    return with_out(plan, a, b, out)


# Dynamo folds it to True while it traces; eagerly it is a call that returns False: 32 ns on the CPU machine,
# where ``is_compiling`` (which asks ``torch.jit`` first) took 70-146 ns (timeit, torch 2.13.0+cpu, 2026-11-28).
# The only price an eager call pays for the compiled path.
_COMPILING = torch.compiler.is_dynamo_compiling
_GRAD_ENABLED = torch.is_grad_enabled
_MM = torch.mm
_TAKEN = frozenset(gemm.DTYPE_NAMES)
_FORCED = _modes.LOCAL
_AUTO = _modes.AUTO
_NATIVE = _native.NATIVE


def _traced(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """What torch.compile records for a call: the operator (registered by kernels/ops.py on import)."""
    if out is None:
        return torch.ops.triton_tuner.matmul(a, b)
    torch.ops.triton_tuner.matmul_out(a, b, out)
    return out


def _with_grad(a: torch.Tensor, b: torch.Tensor, out: torch.Tensor | None) -> torch.Tensor:
    """A call autograd must record: through ``ops.matmul``, whose backward is two tuned GEMMs. Its body
    calls ``matmul`` again with grad mode off (inside an autograd function), so this does not recurse."""
    if out is not None:
        raise RuntimeError(OUT_WITH_GRAD.format(name="matmul"))
    gemm.check_operands(a, b)
    return torch.ops.triton_tuner.matmul(a, b)


OUT_WITH_GRAD = ("kernels.{name}(..., out=...) does not support automatic differentiation, but an operand "
                 "requires grad; call it under torch.no_grad() or on detached operands, or drop out=")


def _first_call(key: tuple, a: torch.Tensor, b: torch.Tensor) -> ModePlans:
    """A signature's first call: check, resolve each mode's config, build and keep the plans."""
    gemm.check_operands(a, b)
    resolved_in = _GENERATION  # before resolving: a clear meanwhile makes these plans stale
    if a.device.type == "cpu" and not _device.INTERPRETED:
        configs = {mode: BASELINE for mode in MODES}  # no Triton on the CPU unless the interpreter is on
    else:
        problem, device = gemm.MATMUL.problem_of(a, b), current_device(a.device)
        configs = {mode: DISPATCHER.resolve(key + (mode,), gemm.MATMUL, problem, device, mode) for mode in MODES}
        if _REC.on:
            _REC.seen(key, gemm.MATMUL.name, problem, device)
    return put(key, plans_for(configs, a, b), resolved_in)


def _learn_cublas_everywhere() -> bool:
    """Whether every matmul of this process goes to cuBLAS (``_Fast``); remembered until the next ``clear``."""
    resolved_in = _GENERATION  # a clear while the tables are read makes this answer stale
    fast = not (_device.INTERPRETED or _REC.on or FAST.pins) and not any(
        DISPATCHER.has_records(current_device(torch.device("cuda", index)), gemm.MATMUL)
        for index in range(torch.cuda.device_count() if torch.cuda.is_available() else 0))
    with _LOCK:
        if not FAST.pins and resolved_in == _GENERATION:
            FAST.cublas_everywhere = fast
    if fast and torch.cuda.is_available() and _native.NATIVE.state == "idle":
        _native.start()  # in the background: no plan is put meanwhile, so nothing else would start it
    return fast


# ------------------------------------------------------------------------------- the plans of a signature

def signature(a: torch.Tensor, b: torch.Tensor) -> tuple:
    """The plan key of a call: what a plan depends on but the data's addresses, the mode, and b's dtype
    and device (each plan checks those itself: fewer fields to fetch and hash on every call)."""
    return (a.shape, b.shape, a.stride(), b.stride(), a.dtype, a.device)


class ModePlans:
    """The plans of one call signature, per mode; ``both`` is the plan when the two are the same."""

    __slots__ = ("eager", "graph", "both")

    def __init__(self, eager: Plan, graph: Plan) -> None:
        self.eager, self.graph = eager, graph
        self.both = eager if eager is graph else None


def get(key: Hashable) -> ModePlans | None:
    return _PLANS.get(key)


def generation() -> int:
    """The current count of ``clear`` calls; read it before resolving what will be ``put``."""
    return _GENERATION


def put(key: Hashable, plan: ModePlans, resolved_in: int | None = None) -> ModePlans:
    """Keep ``plan`` for ``key`` and return it; where a ``clear`` ran since ``generation()`` returned
    ``resolved_in``, only return it: the call gets it, later calls resolve again under the new tables."""
    with _LOCK:
        if resolved_in is not None and resolved_in != _GENERATION:
            return plan
        if len(_PLANS) >= _CAPACITY:  # a workload of ever-new shapes must not grow memory for ever
            _PLANS.clear()
            _native.forget_all()
        _PLANS[key] = plan
        # A cuBLAS plan is served from C++ once the extension is ready, a Triton one once it is compiled
        # (kernels/_native.py). Under the lock: a ``clear`` between the two would leave C++ serving a
        # signature Python forgot.
        _mirror(key, plan, getattr(key[-1], "type", None) == "cuda")
    return plan


def clear() -> None:
    global _GENERATION
    with _LOCK:
        _GENERATION += 1
        _PLANS.clear()
        _native.forget_all()
        FAST.cublas_everywhere = None
        for forget in ON_CLEAR:
            forget()


# What else keeps answers read from the tables, and forgets them with the plans (kernels/_evidence.py's routes).
ON_CLEAR: list[Callable[[], None]] = []


class _Fast:
    """Whether every matmul in this process resolves to cuBLAS, so that ``kernels.matmul`` may call
    ``torch.mm`` at once: no tuned matmul record for any GPU of this process (shipped or in the user's
    database), no Triton on the CPU (no interpreter), record mode off and no plan pinned. None: not
    known yet (learned on the next call, after every ``clear``).

    A GPU with no table dispatches to cuBLAS anyway; without this, each call would still build its
    plan key first: about 1 us of host time, 7% of a 13 us host-bound call (H200, scripts/host_cost.py,
    2026-11-24), the whole of its eager shortfall against torch.matmul."""

    __slots__ = ("cublas_everywhere", "pins")

    def __init__(self) -> None:
        self.cublas_everywhere: bool | None = None
        self.pins = 0


FAST = _Fast()


# Distinct call signatures kept; a model has a few hundred GEMM signatures per dtype and batch bucket.
_CAPACITY = 4096


# ------------------------------------------------------------------------------------------- plan kinds

class _Checked:
    """Any config, through the checked launcher (``gemm._run_checked``): TMA, repack, odd calls."""

    __slots__ = ("config",)

    def __init__(self, config: Config) -> None:
        self.config = config

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        gemm.check_operands(a, b)  # b's dtype and device are not in the plan's key
        return gemm._run_checked(self.config, a, b)

    def with_out(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return gemm._run_checked(self.config, a, b, out)


class _Fitted:
    """A launch-ready plan. Each call checks, inline (a method call costs host time), that b is what
    the kernel was built for (dtype, device: not in the plan's key) and that the data is 16-byte
    aligned (what the kernel was specialized for); else ``odd`` takes the call."""

    __slots__ = ()

    def odd(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        """A call the launch cannot take: checked (a mismatched b raises), then the checked launcher."""
        gemm.check_operands(a, b)
        return gemm._run_checked(self.config, a, b)


class _Handed(_Fitted):
    """A plan whose launches the C++ path can make itself (kernels/_native.py ``remember_launch``).

    ``offer``, where set (``_mirror``), hands them over after a call, until that path takes them or
    cannot; ``native`` keeps what was handed over, so that a plan put again (the tuner's pins take
    turns) is served from C++ at once."""

    __slots__ = ("offer", "native")

    def native_ready(self) -> bool:
        """Whether every kernel of the plan has been compiled and adopted (its first call ran)."""
        raise NotImplementedError

    def native_launch(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> list[_launch.NativeLaunch] | None:
        """The launches the C++ path makes of this plan on the default stream, A, B and C filled in per
        call; None where it cannot make them. Call it on the default stream only, once ``native_ready``."""
        raise NotImplementedError


class _Direct(_Handed):
    """Tiled, split-K or gemv on operands shaped like the first call's: allocate C, launch, done."""

    __slots__ = ("config", "launch", "args", "c_shape", "workspace", "b_dtype", "b_index")

    def __init__(self, config: Config, a: torch.Tensor, b: torch.Tensor) -> None:
        m, k = a.shape
        n = b.shape[1]
        self.config, self.c_shape = config, (m, n)
        self.b_dtype, self.b_index = b.dtype, b.get_device()
        c = a.new_empty(self.c_shape)
        self.launch, self.workspace = gemm.direct_launch(config, a, b, c)
        self.args = (m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1))
        self.offer: Callable[[_Handed, torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None
        self.native: list[_launch.NativeLaunch] | None = None

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if (a.data_ptr() | b.data_ptr()) & 15 or b.dtype is not self.b_dtype or b.get_device() != self.b_index:
            return self.odd(a, b)
        c = a.new_empty(self.c_shape)
        if self.workspace is None:
            self.launch(a, b, c, *self.args)
        else:
            self.launch(a, b, c, *self.workspace(), *self.args)
        offer = self.offer  # read once: another thread may clear it
        if offer is not None:
            offer(self, a, b, c)
        return c

    def native_ready(self) -> bool:
        return self.launch.ready()

    def native_launch(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> list[_launch.NativeLaunch] | None:
        # split-K's workspace: the default stream's, which the C++ plan keeps alive.
        fixed = self.args if self.workspace is None else (*self.workspace(), *self.args)
        launch = self.launch.native_launch((a, b, c, *fixed), _launch.OPERANDS)
        return None if launch is None else [launch]

    def with_out(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return gemm._run_checked(self.config, a, b, out)


class _Launched(_Handed):
    """TMA or repack on operands laid out like the first call's (kernels/gemm.py TmaLaunch, RepackLaunch).
    A repack plan's two launches can be made from C++ (``RepackLaunch.native_launch``); TMA's cannot."""

    __slots__ = ("config", "launch", "c_shape", "b_dtype", "b_index")

    def __init__(self, config: Config, launch: Any, b: torch.Tensor, c: torch.Tensor) -> None:
        self.config, self.c_shape, self.launch = config, tuple(c.shape), launch
        self.b_dtype, self.b_index = b.dtype, b.get_device()
        self.offer: Callable[[_Handed, torch.Tensor, torch.Tensor, torch.Tensor], None] | None = None
        self.native: list[_launch.NativeLaunch] | None = None

    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if (a.data_ptr() | b.data_ptr()) & 15 or b.dtype is not self.b_dtype or b.get_device() != self.b_index:
            return self.odd(a, b)
        c = a.new_empty(self.c_shape)
        self.launch(a, b, c)
        offer = self.offer  # read once: another thread may clear it
        if offer is not None:
            offer(self, a, b, c)
        return c

    def native_ready(self) -> bool:
        return self.launch.native_ready()

    def native_launch(self, a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> list[_launch.NativeLaunch] | None:
        return self.launch.native_launch(a, b, c)

    def with_out(self, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        return gemm._run_checked(self.config, a, b, out)


# The cuBLAS plan is ``torch.mm`` itself (what ``torch.matmul`` runs for 2-D operands, one step
# sooner): a cuBLAS call then adds only the lookup to torch's own host time.
_CUBLAS = torch.mm


# ------------------------------------------------------------------------------ handed over to C++

def _mirror(key: Hashable, plans: ModePlans | None, on_cuda: bool) -> None:
    """Tell the C++ path what it serves of ``key`` now that ``plans`` hold it (None: nothing): a cuBLAS
    plan at once; a tiled, split-K or repack eager plan from the first call after its kernels are
    compiled, when that call runs on the default stream (``_offer_launch``). The caller holds ``_LOCK``."""
    _native.remember(key, _served(plans), on_cuda)
    eager = plans.eager if plans is not None else None
    if on_cuda and isinstance(eager, _Handed) and hasattr(eager.launch, "native_launch") and _native.wanted():
        both = plans.both is eager
        # A plan handed over before is served again at once: the tuner's side-by-side eager timing puts
        # each pinned plan again before each of its blocks, whose first call would otherwise take the
        # Python path and pay the hand-over (on the H100 box, stored eager Triton wins then read up to
        # 1.5x below what a fresh process measured; docs/BENCHMARKS.md, 2026-11-25).
        if eager.native is not None and _native.remember_launch(key, both, eager.native):
            eager.offer = None
            return
        offers = [0]
        eager.offer = lambda plan, a, b, c: _offer_launch(key, plans, both, plan, a, b, c, offers)
        if _native.NATIVE.state == "idle":  # a process whose plans are all Triton's builds the module too
            _native.start()


# Calls after which a plan that could not be handed over stops offering (a caller always on a side stream,
# a launch hook that stays installed): an offer costs a Python call on each of them.
_OFFERS = 64


def _offer_launch(key: Hashable, plans: ModePlans, both: bool, plan: _Handed, a: torch.Tensor, b: torch.Tensor,
                  c: torch.Tensor, offers: list[int]) -> None:
    """After a call of ``plan`` (the eager plan of ``plans``, held for ``key``): hand its launches to the
    C++ path, once that path is built and the call ran on the default stream; stop offering once it took
    them, refused them, ``plans`` no longer hold the key, or _OFFERS calls could not hand them over. A
    failure here never reaches the call: C is computed, and the Python path goes on serving."""
    if _native.NATIVE.module is None:
        if _native.NATIVE.state in ("failed", "off"):
            plan.offer = None
        return  # not built yet: offered again on the next call
    if _launch._raw_stream(a.device.index) != 0 or not plan.native_ready():
        # Another stream (its buffers are not the default stream's), a launch hook, or not adopted yet.
        offers[0] += 1
        if offers[0] >= _OFFERS:
            plan.offer = None
        return
    with _LOCK:
        if plan.offer is None:
            return  # another thread handed it over meanwhile
        plan.offer = None
        if _PLANS.get(key) is not plans:
            return
        try:
            plan.native = plan.native_launch(a, b, c)
            _native.remember_launch(key, both, plan.native)
        except Exception as error:  # out of memory for repack's buffer, a value C++ cannot take...
            plan.native = None
            log.debug("%s: the launch stays on the Python path (%s)", key, error)


def _served(plans: ModePlans | None) -> str | None:
    """What the C++ path serves of a signature with these plans (kernels/_native.py): every call where
    both modes run cuBLAS, the eager calls where only the eager plan does, else nothing."""
    if plans is None or plans.eager is not _CUBLAS:
        return None
    return _native.BOTH if plans.both is _CUBLAS else _native.EAGER_ONLY


def with_out(plan: Plan, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
    """A call with ``out=``: through the checked launcher, which checks ``out`` too."""
    gemm.check_operands(a, b)  # b's dtype and device are not in the plan's key
    if plan is _CUBLAS:
        # torch.matmul(out=) would resize a wrong-shaped out (with a warning) or cast: refuse what a
        # Triton plan refuses, so that whether cuBLAS won does not change which calls succeed.
        gemm._checked_out(out, a, a.shape[0], b.shape[1])
        return gemm._run_checked(BASELINE, a, b, out)
    return plan.with_out(a, b, out)


def build(config: Config, a: torch.Tensor, b: torch.Tensor) -> Plan:
    """The plan for ``config`` on operands like ``a`` and ``b`` (already checked)."""
    if is_baseline(config):
        return _CUBLAS
    m, k = a.shape
    n = b.shape[1]
    variant = config.get("VARIANT", "tiled")
    if not (a.is_cuda and min(m, n, k) > 0) or (a.data_ptr() | b.data_ptr()) & 15:
        return _Checked(config)
    if variant in ("tiled", "splitk", "gemv"):
        return _Direct(config, a, b)
    c = a.new_empty((m, n))
    if variant == "tma" and gemm._tma_ready(a, b, c):
        return _Launched(config, gemm.TmaLaunch(config, a, b, c), b, c)
    if variant == "repack":
        return _Launched(config, gemm.RepackLaunch(config, a, b, c), b, c)
    return _Checked(config)


def plans_for(configs: dict[str, Config], a: torch.Tensor, b: torch.Tensor) -> ModePlans:
    """The plans of each mode's config; one plan serves both where the configs agree."""
    eager = build(configs[EAGER], a, b)
    graph = eager if configs[GRAPH] == configs[EAGER] else build(configs[GRAPH], a, b)
    return ModePlans(eager, graph)


# ------------------------------------------------------------------------------- pinned by the tuner

@contextlib.contextmanager
def pinned(config: Config, a: torch.Tensor, b: torch.Tensor) -> Iterator[None]:
    """Within the block, ``kernels.matmul`` on operands shaped like ``a`` and ``b`` runs ``config``
    in every mode: the public call, exactly as a user makes it, with the config forced."""
    with pinning([config], a, b) as (install,):
        install()
        yield


@contextlib.contextmanager
def pinning(configs: Sequence[Config], a: torch.Tensor, b: torch.Tensor,
            graph: Config | None = None) -> Iterator[list[Callable[[], None]]]:
    """One installer per config: after ``install()``, ``kernels.matmul`` on operands shaped like ``a``
    and ``b`` runs that config in every mode, until another installer runs or the block ends (then
    the signature's own plans come back). A side-by-side timing of configs takes turns this way.

    With ``graph`` (the graph winner, decided first), each config is pinned as the eager plan beside
    it, as dispatch will hold them: where the two differ, every eager call pays the mode check, and
    an eager contest timed this way stores what the user's call costs."""
    key = signature(a, b)
    if graph is None:
        plans = [ModePlans(plan, plan) for plan in (build(config, a, b) for config in configs)]
    else:
        plans = [plans_for({EAGER: config, GRAPH: graph}, a, b) for config in configs]
    with _LOCK:
        before, resolved_in = _PLANS.get(key), _GENERATION
        FAST.pins += 1
        FAST.cublas_everywhere = False  # the pinned plans must run, not torch.mm at once
    on_cuda = a.is_cuda

    def install(plan: ModePlans) -> None:
        # As dispatch will hold it: a cuBLAS or direct Triton plan is served from C++ where it runs
        # (kernels/_native.py), so the tuner's eager timing is what the user's call costs. Under the lock:
        # a hand-over in flight must not put back the plan this one replaces.
        with _LOCK:
            _PLANS[key] = plan
            _mirror(key, plan, on_cuda)

    try:
        yield [functools.partial(install, plan) for plan in plans]
    finally:
        with _LOCK:
            if resolved_in != _GENERATION:  # cleared meanwhile: ``before`` was resolved under the old tables
                before = None
            if before is None:
                _PLANS.pop(key, None)
            else:
                _PLANS[key] = before
            FAST.pins -= 1
            FAST.cublas_everywhere = None
            _mirror(key, before, on_cuda)  # as put: under the lock


def plan_of(a: torch.Tensor, b: torch.Tensor, mode: str) -> Any:
    """The plan a call in ``mode`` would use now (for tests and ``explain``); None before the first call."""
    plans = _PLANS.get(signature(a, b))
    return None if plans is None else getattr(plans, mode)
