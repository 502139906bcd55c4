"""Device memory that a cache keeps past the call that allocated it: split-K and repack scratch, grouped tables.

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
graph's own pool (the callers allocate per call there instead).
"""

from __future__ import annotations

import concurrent.futures
import threading

import torch

__all__ = ["kept_empty"]

_ALLOCATOR = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="kernels-kept-memory")
_STREAMS: dict[int, torch.cuda.Stream] = {}  # per device: the allocator thread's own stream
_LOCK = threading.Lock()


def kept_empty(numel: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised 1-D tensor of ``numel`` elements that a cache may keep for good (see the module's doc)."""
    if device.type != "cuda":
        return torch.empty(numel, dtype=dtype, device=device)
    index = device.index if device.index is not None else torch.cuda.current_device()
    tensor = _ALLOCATOR.submit(_allocate, numel, dtype, index).result()
    tensor.record_stream(torch.cuda.current_stream(index))
    return tensor


def _allocate(numel: int, dtype: torch.dtype, index: int) -> torch.Tensor:
    with _LOCK:
        stream = _STREAMS.get(index)
        if stream is None:
            stream = _STREAMS[index] = torch.cuda.Stream(device=index)
    # Its blocks are tagged with this stream, which runs nothing: a block freed here is reused only by
    # another kept buffer, once the streams recorded on it are done with it.
    with torch.cuda.device(index), torch.cuda.stream(stream):
        return torch.empty(numel, dtype=dtype, device=torch.device("cuda", index))
