"""kernels.matmul's cuBLAS plans served from C++ (kernels/_native.cpp), where this machine can build it.

A signature whose plan is cuBLAS in both modes is most of a tuned table on the shapes models run (cuBLAS
is hard to beat there). In Python its call costs the plan key, the dict lookup and torch.mm's own
argument parsing: 1.08x torch.matmul's host time on the H100 and H200 boxes (scripts/host_cost.py,
docs/BENCHMARKS.md). The extension keeps the set of those signatures and runs ``at::mm`` on a hit, from
one C call; on a miss it returns None in about 40 ns and the Python path decides as before.

A signature whose eager plan is cuBLAS and whose graph plan is a Triton config (an eager record that
cuBLAS won, a graph record that a kernel won) is served too, where the call is an eager one: the C++
path asks ``kernels._modes`` what ``kernels.matmul`` asks (the thread's forced mode, ``KERNELS_MODE``,
then the capture check for a CUDA tensor). In Python such a call also paid the mode check: on the H200
box its cuBLAS eager picks ran at 0.84-0.88x torch.matmul on 13-20 us problems (docs/BENCHMARKS.md,
2026-11-25).

A signature whose eager plan is a tiled, split-K or repack Triton kernel is served too, once its kernels are
compiled: the C++ path allocates C and launches them through the driver (``cuLaunchKernel``), with the
arguments Triton's own launcher would pass, on the default stream of a current device (kernels/_plans.py
hands the launches over after a call there). In Python such a call cost the plan key, the lookup, the output
allocation and Triton's launcher, which reads each tensor's address through Python: 0.88-0.94x of
torch.matmul's host time on the H100 box (docs/BENCHMARKS.md, 2026-11-25), while cuBLAS's own
call pays torch's dispatcher and cuBLAS's heuristics. Another stream, a capture, a forced graph mode where
the graph plan differs, a misaligned operand or a failed launch: the Python path serves the call.

The extension is built in a daemon thread the first time a GPU process has something for it to serve:
a cuBLAS plan put (``remember``), a tiled, split-K or repack eager plan put (kernels/_plans.py ``_mirror``),
a ``kernels.matmul_bias`` signature sent to ``torch.addmm`` or an epilogue launch handed over
(``remember_addmm``, ``remember_epilogue_launch``), or ``kernels.matmul`` learning that no GPU of the process
has a tuned table (kernels/_plans.py ``_learn_cublas_everywhere``: its calls then put no plan). It is built
with torch's own ``cpp_extension`` (a C++ compiler and ninja; the build is cached across processes in
``TORCH_EXTENSIONS_DIR``, by default ``~/.cache/torch_extensions``). Until it is ready, and wherever it
cannot be built, the Python path serves every call: nothing but host time depends on it.
``kernels.matmul_bias`` signatures that dispatch sends to ``torch.addmm`` in every mode (an untuned or
cuBLAS-won layer with a bias: most of a patched model's layers), or in eager calls alone, are served the
same way, by ``try_addmm``, while ``DISPATCHER.changes`` stands; and so are the Triton plans of
``kernels.matmul_bias`` and ``kernels.gated_matmul`` (``try_addmm``, ``try_gated``), handed over by
kernels/epilogue.py after their first call (docs/MODES.md, step 9), and the eager plans of ``kernels.moe_matmul``
and ``kernels.moe_gated_matmul`` (``try_moe``, ``try_moe_gated``: a Triton launch, or torch._grouped_mm alone),
handed over by kernels/_grouped_dispatch.py (step 10). ``KERNELS_NATIVE=0`` turns it off. Record mode suspends it (it counts every call in Python). A plan the
tuner pins (kernels/_plans.py ``pinning``) is mirrored like any other, so that the tuner times cuBLAS as
the user's call will run it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Hashable, Iterator
from importlib import resources
from typing import Any

log = logging.getLogger(__name__)

_ENV = "KERNELS_NATIVE"
_NAME = "triton_tuner_native"
BOTH, EAGER_ONLY = "both", "eager"  # what the C++ path serves of a signature (kernels/_plans.py _served)


class _Native:
    """``try_mm``: the C function while it may serve calls, else None (what kernels.matmul reads)."""

    __slots__ = ("try_mm", "try_addmm", "try_gated", "try_moe", "try_moe_gated", "module", "state", "suspended",
                 "pending", "pending_addmm", "pending_epilogue", "pending_moe", "decided")

    def __init__(self) -> None:
        self.try_mm: Callable[[Any, Any], Any] | None = None
        self.try_addmm: Callable[[Any, Any, Any], Any] | None = None  # kernels.matmul_bias's, as try_mm
        self.try_gated: Callable[[Any, Any], Any] | None = None  # kernels.gated_matmul's handed-over launches
        # kernels.moe_matmul's and moe_gated_matmul's handed-over plans (x, w, offsets)
        self.try_moe: Callable[[Any, Any, Any], Any] | None = None
        self.try_moe_gated: Callable[[Any, Any, Any], Any] | None = None
        # matmul_bias key -> (DISPATCHER.changes, eager calls alone), put before the module was ready
        self.pending_addmm: dict[Hashable, tuple[int, bool]] = {}
        # (gated, signature key) -> remember_epilogue_launch's arguments, handed over before the module was ready
        self.pending_epilogue: dict[Hashable, tuple] = {}
        # (gated, MoE signature fields) -> remember_moe's other arguments, handed over before the module was ready
        self.pending_moe: dict[Hashable, tuple] = {}
        self.module: Any = None
        self.state = "idle"  # idle, building, ready, failed, off
        self.suspended = 0
        self.pending: dict[Hashable, str | None] = {}  # plan key -> what to serve, put before the module was ready
        self.decided = threading.Event()  # set once the state is ready, failed or off


NATIVE = _Native()
_LOCK = threading.RLock()
_PENDING_CAPACITY = 4096  # as kernels/_plans.py's plans
# torch's build takes a lock file in the build directory and waits, without a limit, while one is there.
# A process that exits during its build (the build runs in a daemon thread) leaves the file behind, and
# every later process then waited for ever: on the H100 box a pytest run that ended 20 s into a build
# hung the next benchmark's ``start(block=True)`` until it was killed (2026-11-25). A lock is taken as
# left behind once nothing in its build directory has changed for this long; a cold build takes 30-60 s
# on the GPU boxes (torch's FileBaton never touches its lock while it holds it, so the whole directory
# is the sign of life).
STALE_LOCK_S = 180.0
BLOCK_LIMIT_S = STALE_LOCK_S + 120.0  # what ``start(block=True)`` waits at most: a stale lock, then a build


def wanted() -> bool:
    """Whether this process may build and use the extension (``KERNELS_NATIVE`` not 0)."""
    return os.environ.get(_ENV, "1").strip().lower() not in ("0", "false", "no", "off")


def start(block: bool = False) -> str:
    """Build (or load the cached build of) the extension, in a daemon thread; ``block``: wait for it, up
    to BLOCK_LIMIT_S. Returns the state: "ready", "failed" or "off" once decided, "building" while a
    thread builds."""
    with _LOCK:
        if NATIVE.state == "idle":
            if not wanted():
                NATIVE.state = "off"
                NATIVE.decided.set()
                return NATIVE.state
            NATIVE.state = "building"
            threading.Thread(target=_build, name="kernels-native-build", daemon=True).start()
    if block and not NATIVE.decided.wait(BLOCK_LIMIT_S):
        log.warning("the C++ path of cuBLAS plans is still building after %.0f s; Python serves calls meanwhile",
                    BLOCK_LIMIT_S)
    return NATIVE.state


def _cuda_major() -> int:
    """torch's CUDA major version (0 without CUDA): the C++ path makes its cublasLt plans with that libcublasLt."""
    import torch

    version = torch.version.cuda or ""
    head = version.split(".")[0]
    return int(head) if head.isdigit() else 0


def _build() -> None:
    try:
        from torch.utils.cpp_extension import load

        from . import _modes

        _clear_stale_lock(_NAME)
        with _builder_mark(_NAME), resources.as_file(resources.files("kernels") / "_native.cpp") as source:
            module = load(name=_NAME, sources=[str(source)], extra_cflags=["-O2"], extra_ldflags=["-ldl"],
                          verbose=False)
        module.use_modes(_modes)
        module.use_cuda_major(_cuda_major())
        from . import _launch

        module.use_launch_check(_launch.native_allowed)
        from .dispatch import DISPATCHER

        module.use_dispatcher(DISPATCHER)
    except Exception as exc:  # no compiler, no ninja, a read-only cache...: the Python path stays
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        log.info("the C++ path of cuBLAS plans is not available here (%s); Python serves them", first)
        with _LOCK:
            NATIVE.state = "failed"
            NATIVE.pending.clear()
            NATIVE.pending_addmm.clear()
            NATIVE.pending_epilogue.clear()
            NATIVE.pending_moe.clear()
            NATIVE.decided.set()
        return
    with _LOCK:
        for key, served in NATIVE.pending.items():
            _apply(module, key, served)
        NATIVE.pending.clear()
        for key, value in NATIVE.pending_addmm.items():
            _apply_addmm(module, key, value)
        NATIVE.pending_addmm.clear()
        for kind_key, value in NATIVE.pending_epilogue.items():
            _apply_epilogue(module, kind_key, value)
        NATIVE.pending_epilogue.clear()
        for kind_key, value in NATIVE.pending_moe.items():
            _apply_moe(module, kind_key, value)
        NATIVE.pending_moe.clear()
        NATIVE.module, NATIVE.state = module, "ready"
        _publish()
        NATIVE.decided.set()


def _clear_stale_lock(name: str, stale_s: float | None = None) -> None:
    """Remove the build lock of extension ``name`` at once where the processes that marked the directory
    (``_builder_mark``) have all exited and none works in it, else once nothing in its build directory has
    changed for ``stale_s`` (STALE_LOCK_S): a live build writes its files before that, or its process exited
    and left the lock. Until then, wait: another process may be building, and its result is ours to load. A
    lock taken after this returns is torch's to wait on, without a limit; ``start(block=True)`` is bounded."""
    try:
        from torch.utils.cpp_extension import _get_build_directory  # torch's own naming of the directory
    except ImportError:  # another torch: its load() waits as before
        return
    stale_s = STALE_LOCK_S if stale_s is None else stale_s
    directory = _get_build_directory(name, verbose=False)
    lock = os.path.join(directory, "lock")
    while os.path.exists(lock):
        try:
            judged = os.stat(lock).st_ino  # the lock judged below: another one found later is not removed
        except OSError:
            return  # gone meanwhile
        if _builders_gone(directory):
            if _remove_unless_renewed(lock, -1.0, judged):
                log.warning("removed %s: the process that built there exited during its build", lock)
                _forget_dead_marks(directory)
            return
        quiet = time.time() - _last_change(directory)
        if quiet > stale_s:
            if _remove_unless_renewed(lock, stale_s):
                log.warning("removed %s: its build directory had not changed for %.0f s (a build whose process "
                            "exited)", lock, quiet)
            return
        time.sleep(min(0.5, stale_s - quiet + 0.01))


_MARK_PREFIX = "builder."


def _mark_name() -> str:
    return f"{_MARK_PREFIX}{socket.gethostname()}.{os.getpid()}"


@contextlib.contextmanager
def _builder_mark(name: str) -> Iterator[None]:
    """A file naming this host and process in the build directory while it builds: a later process that
    finds the lock, every such mark of a process that no longer runs, and no process working in the
    directory, knows the lock was left behind and need not wait STALE_LOCK_S for it."""
    try:
        from torch.utils.cpp_extension import _get_build_directory
        mark = os.path.join(_get_build_directory(name, verbose=False), _mark_name())
        with open(mark, "w"):
            pass
    except (ImportError, OSError):  # no mark: later processes judge a lock by its age alone
        mark = None
    try:
        yield
    finally:
        if mark is not None:
            try:
                os.remove(mark)
            except OSError:
                pass


def _builders_gone(directory: str) -> bool:
    """Whether the lock in ``directory`` is known to be left behind: it has builder marks, all of this host
    and of processes that no longer run, and no process of this host runs in the directory (a compiler that
    an exited build left running). False where that cannot be known (no marks, another host's mark, no
    /proc): the lock is then judged by its age."""
    marks = _marks(directory)
    if not marks or not os.path.isdir("/proc"):
        return False
    return all(dead for _, dead in marks) and not _working_in(directory)


def _marks(directory: str) -> list[tuple[str, bool]]:
    """(path, dead) of each builder mark in ``directory``: dead where it names a process of this host that no
    longer runs (another host's process, or a name not ours to read, counts as alive)."""
    host = socket.gethostname()
    found = []
    try:
        entries = list(os.scandir(directory))
    except OSError:
        return []
    for entry in entries:
        if entry.name.startswith(_MARK_PREFIX):
            mark_host, _, pid = entry.name[len(_MARK_PREFIX):].rpartition(".")
            found.append((entry.path, mark_host == host and pid.isdigit() and not _alive(int(pid))))
    return found


def _forget_dead_marks(directory: str) -> None:
    for path, dead in _marks(directory):
        if dead:
            try:
                os.remove(path)
            except OSError:
                pass


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: it runs
        return True
    return True


def _working_in(directory: str) -> bool:
    """Whether a process of this host has its working directory in ``directory`` (ninja and its compilers
    run there)."""
    real = os.path.realpath(directory)
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cwd = os.readlink(f"/proc/{entry}/cwd")
        except OSError:  # gone, or not ours to read
            continue
        if cwd == real or cwd.startswith(real + os.sep):
            return True
    return False


def _last_change(directory: str) -> float:
    """The newest modification time of the files in ``directory`` (0 where it cannot be read)."""
    try:
        with os.scandir(directory) as entries:
            return max((entry.stat().st_mtime for entry in entries), default=0.0)
    except OSError:
        return 0.0


def _remove_unless_renewed(lock: str, stale_s: float, judged: int | None = None) -> bool:
    """Remove ``lock`` if it is still the stale one: it is moved aside first (atomic), and put back where
    another process took a fresh lock between our look and the move (the lock moved is younger than
    ``stale_s``, or is another file than the one judged, inode ``judged``). True where a stale lock went."""
    aside = f"{lock}.stale-{os.getpid()}-{threading.get_ident()}"
    try:
        os.rename(lock, aside)
    except OSError:  # gone already: another process removed it or its build finished
        return False
    try:
        moved = os.stat(aside)
        if time.time() - moved.st_mtime > stale_s and (judged is None or moved.st_ino == judged):
            return True
        try:  # a fresh lock, taken after our look: back where its owner will release it
            os.link(aside, lock)
        except OSError:
            pass  # a third process locked meanwhile; the fresh one we moved is its owner's to miss
        return False
    finally:
        try:
            os.remove(aside)
        except OSError:
            pass


def _signature(key: Hashable) -> tuple[list[int], Any, Any] | None:
    """(a's and b's sizes and strides, dtype, device) of a plan key, as the C++ sets take them; None where
    the operands are not 2-D (the C++ path serves 2-D calls alone)."""
    a_shape, b_shape, a_stride, b_stride, dtype, device = key
    fields = [*a_shape, *b_shape, *a_stride, *b_stride]
    return (fields, dtype, device) if len(fields) == 8 else None


def _apply(module: Any, key: Hashable, served: str | None) -> None:
    signature = _signature(key)
    if signature is not None:
        {BOTH: module.add, EAGER_ONLY: module.add_eager}.get(served, module.discard)(*signature)


def _apply_addmm(module: Any, key: Hashable, value: tuple[int, bool]) -> None:
    signature = _signature(key)
    if signature is not None:
        module.add_addmm(*signature, *value)


def _kernel_fields(made: list[Any]) -> list[tuple]:
    """Each kernels._launch.NativeLaunch of ``made`` as the C++ path's add functions take a kernel."""
    return [(launch.function, list(launch.grid), launch.threads, launch.shared, launch.codes, launch.values)
            for launch in made]


def _apply_epilogue(module: Any, kind_key: tuple[bool, Hashable], value: tuple) -> None:
    """``kind_key``: (gated, the signature's key); ``value``: (both, changes, made, bias_dtype)."""
    gated, key = kind_key
    both, changes, made, bias_dtype = value
    signature = _signature(key)
    if signature is None:
        return
    fields = signature[0]  # a's sizes, b's sizes, then strides: C is a's rows by the output's width
    width = fields[3] // 2 if gated else fields[3]
    module.add_epilogue_launch(*signature, gated, both, [fields[0], width], _kernel_fields(made), changes, bias_dtype)


def _publish() -> None:
    serving = NATIVE.module is not None and NATIVE.suspended == 0
    NATIVE.try_mm = NATIVE.module.try_mm if serving else None
    NATIVE.try_addmm = NATIVE.module.try_addmm if serving else None
    NATIVE.try_gated = NATIVE.module.try_gated if serving else None
    NATIVE.try_moe = NATIVE.module.try_moe if serving else None
    NATIVE.try_moe_gated = NATIVE.module.try_moe_gated if serving else None


def remember(key: Hashable, served: str | None, on_cuda: bool) -> None:
    """Plans were put for ``key`` (kernels/_plans.py): served here from now on as ``served`` says (``BOTH``,
    ``EAGER_ONLY``, or None: not at all). The first cuBLAS plan of a GPU process starts the build."""
    _put(NATIVE.pending, key, served, _apply, build=served is not None and on_cuda)


def _launchable_for(key: Hashable, made: Any) -> bool:
    """Whether ``made`` (kernels._launch.NativeLaunch) can serve the signature ``key``: a kernel runs only in
    the context it was loaded in, so one loaded on another device than the signature's (its first call ran
    with another device current) stays on the Python path."""
    device = getattr(key[-1], "index", None)
    return bool(made) and all(launch.device == device for launch in made)


def remember_launch(key: Hashable, both: bool, made: Any) -> bool:
    """Serve the signature ``key`` from C++ by launching compiled Triton kernels (``made``, a list of
    kernels._launch.NativeLaunch, made in order; None: they cannot be launched that way) on the default
    stream, in eager calls, and in graph ones too where ``both``. Only once the module is ready
    (kernels/_plans.py offers the launches again until it is). True where the C++ path took them."""
    signature = _signature(key)
    with _LOCK:
        module = NATIVE.module
        if module is None or signature is None or not _launchable_for(key, made):
            return False
        fields = signature[0]  # a's sizes, b's sizes, then strides: C is a's rows by b's columns
        keep = [tensor for launch in made for tensor in launch.keep]
        return bool(module.add_launch(*signature, both, [fields[0], fields[3]], _kernel_fields(made), keep))


def remember_addmm(key: Hashable, changes: int, on_cuda: bool, eager_only: bool = False) -> None:
    """``kernels.matmul_bias`` found that dispatch sends the signature ``key`` to torch.addmm in every mode
    (``eager_only``: in eager calls alone), as ``DISPATCHER.changes`` read ``changes``: served from C++ (in
    eager calls alone where ``eager_only``) while that count stands (a clear, another database or a pin
    bumps it, and the C++ path then leaves the call to Python, which puts it again)."""
    _put(NATIVE.pending_addmm, key, (changes, eager_only), _apply_addmm, build=on_cuda)


def remember_epilogue_launch(key: Hashable, gated: bool, both: bool, changes: int, made: list[Any],
                             bias_dtype: Any = None) -> None:
    """Serve the ``kernels.matmul_bias`` (or, ``gated``, ``kernels.gated_matmul``) signature ``key`` from C++
    by ``made`` (kernels._launch.NativeLaunch, one kernel: the epilogue's Triton launch, its bias in
    ``bias_dtype``) on the default stream, in eager calls (in graph ones too where ``both``), while
    ``DISPATCHER.changes`` reads ``changes``. Kept until the module is ready; dropped where it cannot be."""
    if not _launchable_for(key, made):
        return  # the Python path keeps it
    _put(NATIVE.pending_epilogue, (gated, key), (both, changes, made, bias_dtype), _apply_epilogue, build=True)


def remember_moe(fields: tuple[int, ...], dtype: Any, offsets_dtype: Any, device: Any, gated: bool, changes: int,
                 made: list[Any] | None) -> None:
    """Serve the ``kernels.moe_matmul`` (or, ``gated``, ``kernels.moe_gated_matmul``) eager signature ``fields``
    (x's and w's sizes, x's and w's strides, offsets' size and stride) of ``dtype`` operands and ``offsets_dtype``
    offsets on ``device`` from C++, while ``DISPATCHER.changes`` reads ``changes``: by ``made`` (one
    kernels._launch.NativeLaunch, x, w, the output and offsets in slots A, B, C and D), or where ``made`` is
    None by torch._grouped_mm itself (moe_matmul's baseline). Kept until the module is ready."""
    if made is not None and not all(launch.device == getattr(device, "index", None) for launch in made):
        return  # loaded in another device's context: the Python path keeps it
    if made is not None and any(launch.keep for launch in made):
        return  # a fixed buffer's address among its arguments: a MoE plan keeps none alive, so Python keeps it
    _put(NATIVE.pending_moe, (gated, tuple(fields)), (dtype, offsets_dtype, device, changes, made), _apply_moe,
         build=True)


def _apply_moe(module: Any, kind_key: tuple[bool, tuple[int, ...]], value: tuple) -> None:
    gated, fields = kind_key
    dtype, offsets_dtype, device, changes, made = value
    if made is None:
        if not gated:
            module.add_moe_baseline(list(fields), dtype, offsets_dtype, device, changes)
        return
    width = fields[4] // 2 if gated else fields[4]  # w [E, K, N]: the output is [T, N], or [T, N/2] gated
    module.add_moe_launch(list(fields), dtype, offsets_dtype, device, gated, width, _kernel_fields(made), changes)


def _put(pending: dict, key: Hashable, value: Any, apply: Callable[[Any, Hashable, Any], None], build: bool) -> None:
    """``apply(module, key, value)`` now where the module is ready, else kept in ``pending`` until it is
    (nothing where it failed or is off); ``build``: a GPU call that may start the build."""
    with _LOCK:
        if NATIVE.module is not None:
            apply(NATIVE.module, key, value)
            return
        if NATIVE.state in ("failed", "off"):
            return
        if len(pending) >= _PENDING_CAPACITY:
            pending.clear()
        pending[key] = value
    if build and NATIVE.state == "idle":
        start()


def forget_addmm() -> None:
    """matmul_bias forgot what it learnt (kernels/epilogue.py ``_PATHS`` at capacity): serve none of it
    until learnt again, so that the C++ set never outgrows ``_PATHS`` and drops signatures still learnt."""
    with _LOCK:
        NATIVE.pending_addmm.clear()
        if NATIVE.module is not None:
            NATIVE.module.clear_addmm()


def forget_all() -> None:
    """Every plan is gone (``kernels.clear_cache``, another database): serve nothing until put again."""
    with _LOCK:
        NATIVE.pending.clear()
        NATIVE.pending_epilogue.clear()
        NATIVE.pending_moe.clear()
        if NATIVE.module is not None:
            NATIVE.module.clear()


def suspend() -> None:
    """Every call takes the Python path until as many ``resume`` calls (record mode, a measurement of the
    Python path)."""
    with _LOCK:
        NATIVE.suspended += 1
        NATIVE.try_mm = NATIVE.try_addmm = NATIVE.try_gated = NATIVE.try_moe = NATIVE.try_moe_gated = None


def resume() -> None:
    with _LOCK:
        NATIVE.suspended = max(0, NATIVE.suspended - 1)
        if NATIVE.module is not None:
            _publish()


def served() -> int:
    """How many signatures the C++ path serves now (for tests and ``explain``)."""
    with _LOCK:
        return NATIVE.module.size() if NATIVE.module is not None else 0


def launches() -> int:
    """How many calls the C++ path has served by launching a Triton kernel (for tests and probes)."""
    with _LOCK:
        return NATIVE.module.launches() if NATIVE.module is not None else 0


def lt_served() -> int:
    """How many calls the C++ path has served by a kept cublasLt plan (for tests and probes)."""
    with _LOCK:
        return NATIVE.module.lt_served() if NATIVE.module is not None else 0


def moe_baseline_calls() -> int:
    """How many ``kernels.moe_matmul`` calls the C++ path has served by torch._grouped_mm (for tests and probes)."""
    with _LOCK:
        return NATIVE.module.moe_baseline_calls() if NATIVE.module is not None else 0


__all__ = ["BOTH", "EAGER_ONLY", "NATIVE", "forget_addmm", "forget_all", "launches", "lt_served", "moe_baseline_calls",
           "remember", "remember_addmm", "remember_epilogue_launch", "remember_launch", "remember_moe", "resume",
           "served", "start", "suspend", "wanted"]
