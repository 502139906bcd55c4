"""Two ways to be called, each with its own tuned winner (docs/MODES.md).

- ``eager``: a Python loop calls the kernel; each call pays its host time, and a call costs
  max(host, GPU) as the caller sees it.
- ``graph``: the call is captured in a CUDA graph and replayed (vLLM/SGLang decode,
  ``torch.compile(mode="reduce-overhead")``); host time vanishes and only GPU time counts.

Dispatch picks the graph winner while the current CUDA stream is capturing, the eager winner
otherwise. ``dispatch_mode("graph")`` (a context manager, per thread) or ``KERNELS_MODE=graph`` (the
environment, read at import) force one; the context manager wins over the environment.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator

import torch

EAGER = "eager"
GRAPH = "graph"
MODES = (EAGER, GRAPH)

_ENV = "KERNELS_MODE"


def _mode_from_env() -> str | None:
    value = os.environ.get(_ENV, "").strip().lower()
    if value in ("", "auto"):
        return None
    if value not in MODES:
        raise ValueError(f"{_ENV}={value!r} is not a dispatch mode; set it to eager, graph or auto (or unset it)")
    return value


ENV_MODE = _mode_from_env()
AUTO = "auto"


class _Forced(threading.local):
    """The mode ``dispatch_mode`` forces on this thread: None when it forces none (then KERNELS_MODE
    decides), AUTO to follow the capture check whatever KERNELS_MODE says."""

    mode: str | None = None


LOCAL = _Forced()


# The capture check: torch.cuda.is_current_stream_capturing() without its Python wrapper, since every
# call whose modes' plans differ makes it. That query is a CUDA runtime call (about 3 us per call on the
# H100 box, 2026-11-24: an eager winner stored at 1.14x ran at 1.00x through dispatch). CUDA cannot
# capture the legacy default stream, where eager code runs, so there a thread-local read of the
# current stream answers. Tests on a machine without CUDA replace it with a stand-in (and say so).
_is_capturing = getattr(torch._C, "_cuda_isCurrentStreamCapturing", None)
_raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)


def _capturing() -> bool:
    return _raw_stream(-1) != 0 and _is_capturing()


if _is_capturing is None:  # a build without CUDA
    capturing = lambda: False  # noqa: E731
elif _raw_stream is None:
    capturing = _is_capturing
else:
    capturing = _capturing


def forced() -> str | None:
    """The mode forced by ``dispatch_mode`` on this thread, else by ``KERNELS_MODE``, else None."""
    mode = LOCAL.mode or ENV_MODE
    return None if mode == AUTO else mode


def current(on_cuda: bool) -> str:
    """The mode of a call whose operands are (``on_cuda``) or are not on a CUDA device.

    kernels.matmul inlines these lines (each call counts): keep the two in step."""
    mode = LOCAL.mode or ENV_MODE
    if mode is None or mode is AUTO:
        return GRAPH if on_cuda and capturing() else EAGER
    return mode


@contextlib.contextmanager
def dispatch_mode(mode: str) -> Iterator[None]:
    """Within the block, calls on this thread get ``mode``'s winners ("eager", "graph" or "auto")."""
    if mode not in MODES + (AUTO,):
        raise ValueError(f"dispatch mode {mode!r} is not one of eager, graph, auto")
    before = LOCAL.mode
    LOCAL.mode = AUTO if mode == AUTO else mode  # AUTO itself, so that ``is`` finds it
    try:
        yield
    finally:
        LOCAL.mode = before
