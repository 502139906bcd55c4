"""Device memory that a cache keeps past the call that allocated it: split-K and repack scratch.

Why not a plain ``torch.empty``: torch.compile's CUDA graphs (``mode="reduce-overhead"``) warm each graph
up and record it with every allocation of the calling thread routed to the graphs' private pool. A block
of that pool that no graph output holds is the trees' to hand out again, and before each warm-up they
check that none is live (``RuntimeError: Detected N tensor(s) in the cudagraph pool not tracked as
outputs``, measured on the H100 with split-K configs, docs/PYTORCH.md). A buffer a cache keeps would be
such a block. The routing is by thread (by stream in older torch), so a kept buffer is allocated by a
thread of our own on a stream of our own: from torch's ordinary pool, wherever the caller's thread is routed.

The caller's current stream is recorded as a user of the buffer (``record_stream``), so that freeing it
waits for that stream's work; a cache that hands the buffer to other streams records them too.

Never call this while the current stream captures: what a graph allocates for one call belongs in the
graph's own pool (the callers allocate per call there instead). Each call hands over to the allocator
thread (a thread wake-up and a wait): for buffers made once per stream and size, not per call. Grouped
tables, built per operand signature, are allocated inline (kernels/grouped.py ``_to_device`` says why).
"""

from __future__ import annotations

import concurrent.futures
import os
import threading

import torch

__all__ = ["kept_empty"]

_LOCK = threading.Lock()
_STATE: dict[str, object] = {}  # the allocator thread's executor, its pid, and its stream per device


def kept_empty(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised 1-D tensor of ``numel`` elements that a cache may keep for good (see the module's doc)."""
    if device.type != "cuda":
        return torch.empty(numel, dtype=dtype, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    tensor, stream = _on_our_thread(numel, dtype, index)
    current = torch.cuda.current_stream(index)
    # The block may have been freed on our stream by earlier kept buffers only after their users' work
    # (recorded below); waiting for that stream anyway costs one event, once per allocation.
    current.wait_stream(stream)
    tensor.record_stream(current)
    return tensor


def _on_our_thread(numel: int, dtype: torch.dtype, index: int) -> tuple[torch.Tensor, torch.cuda.Stream]:
    """Allocate on the allocator thread; inline where that thread cannot serve: the caller is that thread,
    the interpreter is shutting down, or this is a forked child (whose copy of the thread never runs)."""
    with _LOCK:
        executor = _STATE.get("executor")
        if executor is None or _STATE.get("pid") != os.getpid():
            executor = _STATE["executor"] = concurrent.futures.ThreadPoolExecutor(
                max_workers=1, thread_name_prefix="kernels-kept-memory")
            _STATE["pid"] = os.getpid()
    if threading.current_thread().name.startswith("kernels-kept-memory"):
        return _allocate(numel, dtype, index)
    try:
        future = executor.submit(_allocate, numel, dtype, index)
    except RuntimeError:  # "cannot schedule new futures after interpreter shutdown"
        return _allocate(numel, dtype, index)
    return future.result()


def _allocate(numel: int, dtype: torch.dtype, index: int) -> tuple[torch.Tensor, torch.cuda.Stream]:
    key = f"stream{index}"
    with _LOCK:
        stream = _STATE.get(key)
        if stream is None:
            stream = _STATE[key] = torch.cuda.Stream(device=index)
    # The allocator tags the block with this stream, on which nothing of ours runs: a block freed here is
    # reused by another kept buffer only once the streams recorded on it are done with it.
    with torch.cuda.device(index), torch.cuda.stream(stream):
        return torch.empty(numel, dtype=dtype, device=torch.device("cuda", index)), stream
