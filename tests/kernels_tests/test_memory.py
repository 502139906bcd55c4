"""kernels/_memory.py: kept buffers are allocated on a thread of ours, and inline where that thread cannot
serve (on itself, after the interpreter began shutting down, in a forked child).

The allocation itself needs CUDA (a stream of ours, the caching allocator's routing), so ``_allocate`` is
a stand-in here that records the thread it ran on; the GPU test of the routing is
tests/kernels_tests/test_compile.py::test_reduce_overhead_keeps_split_k_scratch_right_across_shapes.
"""

from __future__ import annotations

import concurrent.futures
import threading

import pytest
import torch

from kernels import _memory


@pytest.fixture
def threads_seen(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []

    def allocate(numel: int, dtype: torch.dtype, index: int) -> tuple[torch.Tensor, None]:
        seen.append(threading.current_thread().name)
        return torch.empty(numel, dtype=dtype), None

    monkeypatch.setattr(_memory, "_allocate", allocate)
    monkeypatch.setattr(_memory, "_STATE", {})
    return seen


def test_a_cpu_buffer_is_a_plain_allocation(threads_seen: list[str]) -> None:
    assert _memory.kept_empty(8, torch.float32, torch.device("cpu")).shape == (8,)
    assert threads_seen == [], "no routing to escape on the CPU"


def test_kept_allocations_run_on_the_allocator_thread(threads_seen: list[str]) -> None:
    tensor, _ = _memory._on_our_thread(16, torch.int32, 0)
    assert tensor.numel() == 16 and threads_seen[0].startswith("kernels-kept-memory")


def test_on_the_allocator_thread_itself_the_allocation_is_inline(threads_seen: list[str]) -> None:
    """A kept allocation made by the allocator thread (a finalizer run there) must not wait on itself."""
    _memory._on_our_thread(4, torch.int32, 0)
    executor = _memory._STATE["executor"]
    nested = executor.submit(_memory._on_our_thread, 4, torch.int32, 0).result(timeout=10)
    assert nested[0].numel() == 4 and threads_seen[-1].startswith("kernels-kept-memory")


def test_after_shutdown_and_in_a_fork_the_allocation_is_made_anyway(threads_seen: list[str],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    _memory._on_our_thread(4, torch.int32, 0)
    _memory._STATE["executor"].shutdown()  # as at interpreter shutdown: submit raises
    assert _memory._on_our_thread(4, torch.int32, 0)[0].numel() == 4
    assert threads_seen[-1] == threading.current_thread().name, "made inline"
    first = _memory._STATE["executor"]
    monkeypatch.setattr(_memory.os, "getpid", lambda: -1)  # as in a forked child: the inherited thread never runs
    _memory._on_our_thread(4, torch.int32, 0)
    assert _memory._STATE["executor"] is not first and isinstance(_memory._STATE["executor"],
                                                                  concurrent.futures.ThreadPoolExecutor)
    assert threads_seen[-1].startswith("kernels-kept-memory"), "a new allocator thread for the child"
