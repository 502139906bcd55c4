"""Tuned Triton kernels: call ``kernels.matmul(a, b)`` and get the config tuned for this GPU and shape.

Importing this package never imports the tuner or Optuna; the tuned tables come from the user's
database (``TUNER_DB`` or the default SQLite file, read only) and the tables shipped in the package.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from ._device import CPU, alias_of, current_device, described_device, interpreter_enabled, resolve_device
from ._spec import BASELINE, Config, is_baseline, DeviceInfo, KernelSpec, Param, Problem, SearchSpace, parse_shape
from .dispatch import DISPATCHER, Choice
from . import _device, _modes, _native, _plans
from ._modes import EAGER, GRAPH, dispatch_mode
from . import grouped
from .grouped import GROUPED_MATMUL, grouped_matmul_with
from .gemm import MATMUL, check_operands, matmul_with
from . import gemm
from . import moe
from .moe import MOE_MATMUL, moe_matmul_with
from . import moe_gated
from .moe_gated import MOE_GATED_MATMUL, moe_gated_matmul_with
from ._record_mode import RECORDER as _REC, env_wants_recording
from ._refresh import REFRESHER as _REFRESHER, env_ttl_s
from . import _autotune, _autotune_core
from ._autotune import AUTOTUNE_MODES, AutotuneError, Autotuner, Key, Launch, Space, autotune

__all__ = [
    "AUTOTUNE_MODES", "AutotuneError", "Autotuner", "Key", "Launch", "Space", "autotune",
    "BASELINE", "Choice", "Config", "DeviceInfo", "KERNELS", "KernelSpec", "Param", "Problem", "SearchSpace",
    "CPU", "alias_of", "clear_cache", "current_device", "described_device", "interpreter_enabled", "explain",
    "get_kernel", "grouped_matmul",
    "grouped_matmul_with", "is_baseline", "matmul", "matmul_with", "moe_matmul", "moe_matmul_with", "parse_shape",
    "MOE_GATED_MATMUL", "moe_gated_matmul", "moe_gated_matmul_with",
    "recording", "refresh_every", "resolve_device", "use_database", "validate_record", "dispatch_mode", "EAGER", "GRAPH", "MODES",
]

MODES = _modes.MODES

from ._families import KERNELS  # noqa: E402

_INTERPRETED = _device.INTERPRETED  # an alias kept for callers; the package's modules read _device.INTERPRETED


def get_kernel(name: str) -> KernelSpec:
    """The kernel family called ``name``, or a ValueError that lists the known ones."""
    try:
        return KERNELS[name]
    except KeyError:
        raise ValueError(f"unknown kernel {name!r}; known kernels: {', '.join(KERNELS)}") from None


# kernels.matmul's whole path, first call and repeated, is one module: kernels/_plans.py (its docstring).
from ._plans import matmul  # noqa: E402
# kernels.grouped_matmul's, kernels.moe_matmul's and kernels.moe_gated_matmul's: kernels/_grouped_dispatch.py.
from . import _grouped_dispatch  # noqa: E402
from ._grouped_dispatch import grouped_matmul, moe_gated_matmul, moe_matmul  # noqa: E402
_COMPILING = _plans._COMPILING  # Dynamo folds it to True while it traces (kernels/_plans.py)
# What scripts/host_cost.py and tests read (the plan dict, the nothing-tuned shortcut, the C++ path).
_PLANS = _plans._PLANS
_FAST = _plans.FAST
_NATIVE = _native.NATIVE


def explain(kernel: str, problem: Problem, device: DeviceInfo | None = None, mode: str = EAGER) -> Choice:
    """Which config the dispatcher would use for ``problem`` in ``mode`` and where it came from."""
    return DISPATCHER.choose(get_kernel(kernel), problem, device or current_device(), mode)


def validate_record(record: Any) -> None:
    """Reject a stored record the runtime could not use: unknown kernel, bad key, config outside the space."""
    if record.dtype == "any":  # a user kernel's (kernels.autotune): its decorator checks the config when it loads it
        if record.kernel in KERNELS:
            raise ValueError(f"{record.kernel} is one of the tuner's own kernels, whose records have a dtype and layout; "
                             "a user kernel's record needs another name")
        _autotune_core.split_problem_key(record.problem_key)
        return
    spec = get_kernel(record.kernel)
    problem = Problem.from_key(spec.name, record.problem_key)
    if problem.dtype not in spec.dtypes:
        raise ValueError(f"{spec.name} does not take dtype {problem.dtype}; it takes {', '.join(spec.dtypes)}")
    spec.check_problem(problem)
    for name, values in (("config", record.config), ("triton_config", record.triton_config)):
        if values is None:
            continue
        reason = spec.outside(Config.from_dict(values))
        if reason:
            raise ValueError(f"{name} is outside the {spec.name} search space: {reason}")


def clear_cache() -> None:
    """Forget loaded tables, e.g. after tuning in this process, and the ready launches; the next call
    reloads and rebuilds them."""
    DISPATCHER.clear()
    _autotune.clear_all()
    _plans.clear()
    grouped.TABLES.clear()
    grouped.CALLS.clear()
    moe.LAUNCHES.clear()
    _grouped_dispatch.clear_ready()
    gemm.LAUNCHES.clear()


@contextlib.contextmanager
def recording(url: str | None = None) -> Iterator[None]:
    """Record mode inside the block: note each problem dispatched, with call counts, into ``url`` (None:
    the database dispatch reads, see ``use_database``); written in the background and when the block ends.
    (``TUNER_RECORD=1`` records the whole process instead; blocks nest: at the end of one, an enclosing
    block or that process-wide recording goes on, into its own database.)"""
    # Recording first, then the clear: a call from another thread in between would otherwise resolve its
    # signature unrecorded, and its counts could never be written (no ``seen`` for its key).
    _REC.start(url if url is not None else DISPATCHER.url)
    clear_cache()  # signatures resolved before now must miss once, so that record mode learns them
    try:
        yield
    finally:
        _REC.stop()
        _plans.clear()  # the cuBLAS shortcut may come back now that nothing is recorded


def use_database(url: str | None = None, use_shipped: bool = True) -> None:
    """Read tuned configs from ``url`` (None: ``TUNER_DB`` or the default file) from now on."""
    DISPATCHER.configure(url, use_shipped)
    _autotune.clear_all()  # kernels.autotune kernels without db= read the same database
    _plans.clear()
    grouped.CALLS.clear()  # resolved under the old tables


def refresh_every(ttl_s: float | None) -> None:
    """Reload the tuned tables every ``ttl_s`` seconds (None: never; ``kernels.clear_cache()`` reloads
    once). Costs nothing per call: a background thread clears the caches (kernels/_refresh.py)."""
    if ttl_s is None:
        _REFRESHER.stop()
    else:
        _REFRESHER.start(ttl_s, clear_cache)


if env_wants_recording():
    _REC.start()
_ENV_TTL_S = env_ttl_s()  # read once: an invalid value warns once
if _ENV_TTL_S is not None:
    refresh_every(_ENV_TTL_S)


# The PyTorch integration (issue 13): fused epilogues, custom operators (registered on import), autograd, nn.
from . import epilogue  # noqa: E402
from .epilogue import GATED_MATMUL, MATMUL_BIAS, gated_matmul, matmul_bias  # noqa: E402
from . import ops  # noqa: E402
from . import nn  # noqa: E402
from .nn import patch, unpatch  # noqa: E402

__all__ += ["GATED_MATMUL", "MATMUL_BIAS", "epilogue", "gated_matmul", "matmul_bias", "nn", "ops", "patch", "unpatch"]
