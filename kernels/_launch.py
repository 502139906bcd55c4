"""Launch a compiled Triton kernel straight through its launcher once the call's specialization is known.

``kernel[grid](*args)`` binds and specializes every argument, hashes a cache key, looks up the device and
stream, builds launch metadata and calls the (empty) launch hook chains: 16-30 us per launch on the H100
box's host against 7-11 us direct, while a small group's whole kernel takes 4-7 us (docs/BENCHMARKS.md,
2026-11-23).
A caller that knows its arguments specialize the same way on every call (the same tensors or fresh ones
from torch's allocator, the same integers) launches the ``CompiledKernel`` that its first call returned,
through that kernel's own launcher: what Triton itself does after the lookups.

The first call, and every call where the shortcut is not known to be right, takes Triton's path: under
the interpreter, with launch hooks installed (profilers such as proton), with another CUDA device current
than the first call's, or on a triton whose ``CompiledKernel`` lacks the attributes (3.6 has them).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import triton

logger = logging.getLogger(__name__)


# KERNELS_DIRECT_LAUNCH=0 keeps every launch on Triton's own path (to rule the shortcut out when
# debugging, or to time both paths).
ENABLED = os.environ.get("KERNELS_DIRECT_LAUNCH", "1") != "0"

try:
    from triton import knobs as _knobs
except ImportError:  # an older triton without knobs: hooks cannot be installed this way
    _knobs = None

# What Triton itself calls for the current stream's handle: cheaper than torch.cuda.current_stream().
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None) or (
    lambda device: torch.cuda.current_stream(device).cuda_stream)
# torch.cuda.current_device() without its Python wrapper (lazy-init checks): a call costs ~1 us there.
_current_device = getattr(torch._C, "_cuda_getDevice", None) or (lambda: torch.cuda.current_device())


def _listening(hook: Any) -> bool:
    """triton 3.6 keeps hooks in a chain (``.calls``); an older one in a plain attribute."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else True


_RUNTIME = getattr(_knobs, "runtime", None)


def _hooks_installed() -> bool:
    """Whether anything listens to kernel launches; the shortcut would skip their calls."""
    runtime = _RUNTIME
    return runtime is not None and (_listening(runtime.launch_enter_hook) or _listening(runtime.launch_exit_hook))


# What a parameter slot of a launch from C++ holds (kernels/_native.cpp ``Slot``): the call's A, B or C,
# a fixed value, the call's bias (kernels.matmul_bias), or its offsets (SLOT_D: kernels.moe_matmul's).
SLOT_A, SLOT_B, SLOT_C, SLOT_FIXED_64, SLOT_FIXED_32, SLOT_BIAS, SLOT_D = 0, 1, 2, 3, 4, 5, 6
# The direct kernels' own operands: A, B and C are their first three arguments.
OPERANDS = {0: SLOT_A, 1: SLOT_B, 2: SLOT_C}


@dataclass(frozen=True)
class NativeLaunch:
    """A compiled kernel's launch as kernels/_native.cpp makes it (``DirectLaunch.native_launch``)."""

    function: int  # the CUfunction
    grid: tuple[int, int, int]
    threads: int
    shared: int
    codes: list[int]  # per kernel parameter: SLOT_A, SLOT_B, SLOT_C, SLOT_FIXED_64 or SLOT_FIXED_32
    values: list[int]
    keep: list[torch.Tensor]  # the tensors whose addresses are among ``values``
    device: int  # the CUDA device whose context holds ``function``


def native_allowed() -> bool:
    """Whether kernels/_native.cpp may launch a handed-over kernel now: what ``DirectLaunch.ready`` asks of
    the process (the shortcut enabled, no launch hook listening), asked by the C++ path on every call."""
    return ENABLED and not _hooks_installed()


# The parameter list ``native_launch`` builds is triton 3.6's launcher's (kernel parameters, then the global
# and profile scratch pointers: third_party/nvidia/backend/driver.py make_launcher). Another triton may pass
# other hidden parameters: its kernels stay on Triton's launcher.
_NATIVE_ABI = tuple(triton.__version__.split(".")[:2]) == ("3", "6")


class DirectLaunch:
    """One kernel, one grid and one set of constexprs; ``__call__(*runtime_args)`` launches it.

    The caller promises that every call passes runtime arguments that Triton would specialize alike
    (equal integers, tensors of one dtype with 16-byte aligned data). Triton's launcher then takes
    the runtime arguments followed by the constexprs, in the kernel's parameter order.
    """

    def __init__(self, kernel: Any, grid: tuple[int, ...], options: dict[str, Any]) -> None:
        self.kernel = kernel
        self.grid = tuple(grid) + (1,) * (3 - len(grid))
        self.options = options
        self._compiled: Any = None
        self._launch: Any = None  # what launches: Triton's C launcher itself, or the compiled kernel's run
        self._fixed: tuple = ()  # the launch's arguments between the stream and the kernel's own
        self._constexprs: tuple = ()
        self._device = -1
        self.direct_calls = 0  # launches that took the shortcut (the GPU tests read it)

    def ready(self) -> bool:
        """Whether this call may launch the compiled kernel directly: adopted, on its device, unheard."""
        return (self._launch is not None and ENABLED and _current_device() == self._device
                and not _hooks_installed())

    def launch_direct(self, *args: Any) -> None:
        """Launch the adopted kernel; only after ``ready()`` said so."""
        gx, gy, gz = self.grid
        self._launch(gx, gy, gz, _raw_stream(self._device), *self._fixed, *args, *self._constexprs)
        self.direct_calls += 1

    def descriptor_launcher(self) -> tuple[Callable[..., None], list[dict]] | None:
        """(Triton's C launcher, the metadata of each tensor descriptor) where the adopted launch is
        triton's tensor-descriptor wrapper around that launcher, else None.

        The wrapper (triton 3.6, ``wrap_handle_tensordesc``) encodes every descriptor argument into a
        CUtensorMap on every launch, in Python. A caller that passes each descriptor already expanded
        (``make_tensordesc_arg``'s output, built once per base address) calls the C launcher itself
        through ``launch_raw``."""
        code, cells = getattr(self._launch, "__code__", None), getattr(self._launch, "__closure__", None)
        if code is None or not cells:
            return None
        names = {name: cell.cell_contents for name, cell in zip(code.co_freevars, cells)}
        raw, metas = names.get("launcher"), names.get("tensordesc_meta")
        if not callable(raw) or not metas or any(not isinstance(m, dict) for m in metas):
            return None  # no lowering to CUtensorMaps, or another triton's wrapper: keep the wrapper
        return raw, list(metas)

    def launch_raw(self, raw: Callable[..., None], *args: Any) -> None:
        """Launch through ``raw`` (from ``descriptor_launcher``), descriptors expanded; after ``ready()``."""
        gx, gy, gz = self.grid
        raw(gx, gy, gz, _raw_stream(self._device), *self._fixed, *args, *self._constexprs)
        self.direct_calls += 1

    def native_launch(self, args: Sequence[Any], per_call: Mapping[int, int]) -> NativeLaunch | None:
        """How kernels/_native.cpp launches the adopted kernel with runtime arguments like ``args``, where
        the arguments at the positions of ``per_call`` change from call to call (it maps each to SLOT_A,
        SLOT_B or SLOT_C: the call's A, B or C) and every other one is fixed: a tensor's address (kept
        alive with the plan) or an integer. None where that launch would not be the one Triton's
        launcher makes: nothing adopted yet, a kernel that takes scratch memory, launch attributes
        (clusters, cooperative, PDL) or a parameter other than a pointer or a 32/64-bit integer."""
        compiled, run = self._compiled, getattr(self._compiled, "run", None)
        if not _NATIVE_ABI or self._launch is None or compiled is None or run is None:
            return None
        metadata, src = compiled.metadata, getattr(compiled, "src", None)
        signature = getattr(src, "signature", None)
        if (not isinstance(signature, dict) or getattr(run, "global_scratch_size", 1) != 0
                or getattr(run, "profile_scratch_size", 1) != 0 or getattr(run, "launch_cooperative_grid", True)
                or getattr(run, "launch_pdl", True) or getattr(metadata, "num_ctas", 1) != 1):
            return None
        types = list(signature.values())[:len(args)]
        if len(types) != len(args):
            return None
        codes: list[int] = []
        values: list[int] = []
        keep: list[torch.Tensor] = []
        for position, (value, kind) in enumerate(zip(args, types)):
            if kind == "constexpr":  # an integer Triton specialized away (a 1): not a parameter
                continue
            if not isinstance(kind, str):
                return None
            if position in per_call:
                if not kind.startswith("*"):
                    return None
                codes.append(per_call[position])
                values.append(0)
            elif kind.startswith("*") and isinstance(value, torch.Tensor):
                codes.append(SLOT_FIXED_64)
                values.append(value.data_ptr())
                keep.append(value)
            elif kind in ("i32", "i64") and isinstance(value, int) and not isinstance(value, bool):
                codes.append(SLOT_FIXED_32 if kind == "i32" else SLOT_FIXED_64)
                values.append(value)
            else:
                return None
        return NativeLaunch(int(compiled.function), tuple(self.grid), 32 * int(metadata.num_warps),
                            int(metadata.shared), codes, values, keep, self._device)

    def __call__(self, *args: Any) -> None:
        launch = self._launch
        if launch is not None and ENABLED and _current_device() == self._device and not _hooks_installed():
            gx, gy, gz = self.grid
            launch(gx, gy, gz, _raw_stream(self._device), *self._fixed, *args, *self._constexprs)
            self.direct_calls += 1
            return
        self.launch_triton(*args)

    def launch_triton(self, *args: Any) -> None:
        """Launch on Triton's own path (binding, specializing, hooks), adopting the compiled kernel.

        Triton launches on the current device, not the operands': where the first operand lives on
        another GPU, that GPU is made current for the launch (and the adoption, which notes the device)."""
        first = getattr(args[0], "base", args[0]) if args else None  # a TMA launch's TensorDescriptor: its tensor
        index = first.get_device() if isinstance(first, torch.Tensor) else -1
        if index >= 0 and index != _current_device():
            with torch.cuda.device(index):
                self._launch_triton(args)
        else:
            self._launch_triton(args)

    def _launch_triton(self, args: tuple) -> None:
        result = self.kernel[self.grid](*args, **self.options)
        if self._compiled is None:
            self._adopt(result, len(args))

    def _adopt(self, compiled: Any, runtime_args: int) -> None:
        """Keep what the first launch compiled, if this triton lets it be launched directly."""
        names = getattr(self.kernel, "arg_names", None)
        if names is None or not all(hasattr(compiled, a) for a in ("run", "function", "packed_metadata")):
            return  # the interpreter returns no CompiledKernel; Triton's path stays
        tail = names[runtime_args:]
        if any(name not in self.options for name in tail):
            logger.debug("%s: constexprs %s not all given; keeping Triton's launch path", names, tail)
            return
        if compiled.function is None:  # not loaded onto a device: nothing ran
            return
        launch, fixed = _launcher_of(compiled)
        # ``_launch`` last: a concurrent call reads it first and takes the shortcut only once it is set,
        # so everything the shortcut passes must already be in place (free-threaded builds switch anywhere).
        self._constexprs = tuple(self.options[name] for name in tail)
        self._device = torch.cuda.current_device()
        self._compiled = compiled
        self._fixed = fixed
        self._launch = launch


def _launcher_of(compiled: Any) -> tuple[Any, tuple]:
    """(callable, fixed arguments) that launch ``compiled`` given (grid, stream, fixed, args).

    triton 3.6's ``CompiledKernel.run`` is a ``CudaLauncher`` whose ``__call__`` allocates scratch
    space (none for kernels that need none), then calls its C ``launch`` with the grid, stream,
    function, cooperative/PDL flags, both scratch buffers, the packed metadata and three hook
    slots. Where no scratch is needed, that C function is called here directly: one Python frame
    and two closures fewer per launch. Otherwise ``run`` itself is called, as Triton does.
    """
    run = compiled.run
    c_launch = getattr(run, "launch", None)
    if (c_launch is not None and getattr(run, "global_scratch_size", 1) == 0
            and getattr(run, "profile_scratch_size", 1) == 0 and hasattr(run, "launch_cooperative_grid")):
        return c_launch, (compiled.function, run.launch_cooperative_grid, getattr(run, "launch_pdl", False),
                          None, None, compiled.packed_metadata, None, None, None)
    return run, (compiled.function, compiled.packed_metadata, None, None, None)


_ABSENT = object()


def data_layout(t: torch.Tensor) -> tuple[int, torch.dtype, torch.Size, tuple[int, ...]]:
    """Where ``t``'s data lies and how: what a view kept of it (a transposed weight, a stacked or [E, K, N]
    one) stays right for. New data may keep the address (``w.data = w.data[:2]``, a transposed square weight):
    its dtype, shape and strides tell it apart."""
    return t.data_ptr(), t.dtype, t.shape, t.stride()


class BoundedDict(dict):
    """A plain dict for what a hot path looks up on every call (ready launches, kept plans by signature): one
    ``get``, no lock and no reordering (``LruCache``'s cost about a microsecond of host time a call: timeit, CPU
    build machine, torch 2.13.0+cpu, 2026-11-29), which starts again once it holds ``capacity`` entries, as
    ever-new sizes would otherwise grow it for ever."""

    def __init__(self, capacity: int) -> None:
        super().__init__()
        self.capacity = capacity

    def __setitem__(self, key: Hashable, value: Any) -> None:
        if len(self) >= self.capacity:
            self.clear()
        super().__setitem__(key, value)

    def __reduce__(self) -> tuple:  # a copy or a pickle is made with its capacity before its items go in
        return BoundedDict, (self.capacity,), None, None, iter(self.items())


class LruCache:
    """A bounded, thread-safe, clearable map that forgets the least recently used entry first."""

    def __init__(self, capacity: int = 256) -> None:
        self._capacity = capacity
        self._entries: OrderedDict[Hashable, Any] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: Hashable, default: Any = None) -> Any:
        with self._lock:
            entry = self._entries.get(key, _ABSENT)
            if entry is _ABSENT:
                return default
            self._entries.move_to_end(key)
            return entry

    def get_or_make(self, key: Hashable, make: Callable[[], Any]) -> Any:
        """The entry for ``key``, made by ``make()`` and kept if there is none yet."""
        entry = self.get(key, _ABSENT)
        if entry is _ABSENT:
            entry = make()
            self.put(key, entry)
        return entry

    def put(self, key: Hashable, entry: Any) -> None:
        with self._lock:
            self._entries[key] = entry
            while len(self._entries) > self._capacity:
                self._entries.popitem(last=False)

    def clear(self) -> None:
        with self._lock:
            self._entries.clear()

    def __len__(self) -> int:
        return len(self._entries)
