"""The grouped kernel's device table outlives every cache that drops it while a CUDA graph may read it,
and is ready, and freed safely, whichever stream uses it.

On a machine without CUDA there are no streams and nothing is ever captured, so these are test
doubles here, each standing in for what CUDA would say: ``kernels._modes.capturing`` (whether the
current stream is capturing), ``grouped._stream_of`` (the table's device and building stream),
``grouped._wait_for`` (a spy on the wait for the building stream) and
``grouped._raw_stream`` (the current stream's handle); ``grouped._record_use`` (``record_stream``) is a
spy. The kernels still run for real, under the interpreter. The tests marked ``gpu`` capture and switch
streams for real.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator

import pytest
import torch

import kernels
from kernels import _memory, _modes, grouped
from kernels._device import current_device
from kernels._spec import Config, Problem

# Small tiles keep the interpreter fast; GROUP has 4 tiles of 16x32, so the kernel is launched.
CONFIG = Config.make(num_warps=2, num_stages=2, BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, NUM_SM=4)
GROUP = Problem("grouped_matmul", "fp16", "nn", ((16, 32, 32), (8, 48, 16), (0, 32, 8)))

BUILT_ON, OTHER = 7, 9  # raw stream handles the stand-ins hand out

# ||out - ref|| / ||ref|| of an fp16 output accumulated in fp32 (as tests/kernels_tests/test_capture.py).
TOLERANCE = 5e-3


@pytest.fixture(autouse=True)
def fresh_caches(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """Empty launch caches and a keep list of this test's own, so kept tables never leak between tests."""
    monkeypatch.setattr(grouped, "CAPTURED", {})
    kernels.clear_cache()
    yield
    kernels.clear_cache()


class FakeStreams:
    """What CUDA would say about streams, set by the test: capturing or not, and the current stream."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.capturing = False
        self.stream = BUILT_ON
        self.recorded: list[tuple[int, int]] = []  # (table id, stream) per record_stream
        self.waits: list[tuple[object, int]] = []  # (the stream waited for, the waiting stream) per wait
        monkeypatch.setattr(_modes, "capturing", lambda: self.capturing)  # stand-in: no CUDA capture here
        monkeypatch.setattr(grouped, "_stream_of", lambda device: (0, self.stream, f"stream {self.stream}"))
        monkeypatch.setattr(grouped, "_wait_for", lambda builder, device: self.waits.append((builder, self.stream)))
        monkeypatch.setattr(grouped, "_raw_stream", lambda index: self.stream)
        monkeypatch.setattr(grouped, "_record_use",
                            lambda table, device: self.recorded.append((id(table), self.stream)))


@pytest.fixture
def streams(monkeypatch: pytest.MonkeyPatch) -> FakeStreams:
    if torch.cuda.is_available():  # fake stream handles must not reach a real launch
        pytest.skip("stand-ins for CUDA's answers, for the CPU; on a GPU the tests marked gpu ask CUDA itself")
    return FakeStreams(monkeypatch)


def _operands(torch_device: torch.device, seed: int = 0) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    return grouped.make_inputs(GROUP, torch_device, seed)


def _assert_right(outs: list[torch.Tensor], As: list[torch.Tensor], Bs: list[torch.Tensor]) -> None:
    for i, (out, a, b) in enumerate(zip(outs, As, Bs)):
        ref = a.float() @ b.float()
        err = (out.float() - ref).norm().item()
        assert err <= TOLERANCE * max(ref.norm().item(), 1e-6), f"output {i}: error {err}"


def _table_of(As: list[torch.Tensor], Bs: list[torch.Tensor]) -> weakref.ref:
    """A weak reference to the table TABLES holds for CONFIG on these operands: it dies with the table."""
    return weakref.ref(grouped.TABLES.get((grouped.signature(As, Bs), CONFIG)).table)


def _evict_all_tables() -> None:
    for i in range(grouped.TABLES._capacity):  # least recently used goes first: every real entry goes
        grouped.TABLES.put(("filler", i), None)


# ----------------------------------------------------------------------------------- the keep decision

def test_keep_if_captured_keeps_a_table_only_while_capturing_and_once() -> None:
    table = torch.arange(4, dtype=torch.int64)
    assert grouped._keep_if_captured(table, capturing=False) is False
    assert grouped.CAPTURED == {}, "an eager call's table may be freed with its cache entry"
    assert grouped._keep_if_captured(table, capturing=True) is True
    assert grouped._keep_if_captured(table, capturing=True) is True
    assert len(grouped.CAPTURED) == 1 and grouped.CAPTURED[id(table)] is table, "kept once, however often captured"


# ----------------------------------------------------------------- tables a capture reads are kept for good

@pytest.mark.parametrize("drop", ["clear_cache", "eviction"])
def test_a_table_used_while_capturing_outlives_its_cache_entry(torch_device, streams: FakeStreams, drop: str) -> None:
    As, Bs = _operands(torch_device)
    grouped.grouped_matmul_with(CONFIG, As, Bs)  # the warm-up, outside the capture, builds the table
    streams.capturing = True
    outs = grouped.grouped_matmul_with(CONFIG, As, Bs)  # the call the graph would record
    streams.capturing = False
    table = _table_of(As, Bs)
    kernels.clear_cache() if drop == "clear_cache" else _evict_all_tables()
    gc.collect()
    assert table() is not None and grouped.CAPTURED[id(table())] is table(), "a replay would read a freed table"
    _assert_right(outs, As, Bs)


def test_a_table_built_while_capturing_is_its_graphs_own_and_not_kept(torch_device, streams: FakeStreams,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Allocated from the graph's pool and filled by a node of that graph on every replay: the graph owns
    it like any intermediate. Kept, it would be a live block of that pool, which torch.compile's CUDA-graph
    trees refuse. ``_building_in_capture`` is a stand-in, as above."""
    monkeypatch.setattr(grouped, "_building_in_capture", lambda device: streams.capturing)
    As, Bs = _operands(torch_device, seed=1)
    streams.capturing = True
    _assert_right(grouped.grouped_matmul_with(CONFIG, As, Bs), As, Bs)
    streams.capturing = False
    assert grouped.TABLES.get((grouped.signature(As, Bs), CONFIG)) is None
    assert grouped.CAPTURED == {}


def test_dispatch_keeps_the_table_of_a_call_it_serves_while_capturing(torch_device, streams: FakeStreams,
                                                                      own_database) -> None:
    As, Bs = _operands(torch_device, seed=2)
    kernels.grouped_matmul(As, Bs)
    launch = grouped.CALLS.get((grouped.signature(As, Bs), _modes.current(As[0].is_cuda)))
    assert launch is not None, "an untuned group runs the Triton kernel (its default config)"
    table = weakref.ref(launch.table)
    del launch
    streams.capturing = True
    kernels.grouped_matmul(As, Bs)
    streams.capturing = False
    kernels.clear_cache()
    gc.collect()
    assert table() is not None and grouped.CAPTURED[id(table())] is table()


def test_calls_outside_a_capture_keep_nothing_and_their_table_dies_with_the_cache(torch_device,
                                                                                  streams: FakeStreams) -> None:
    As, Bs = _operands(torch_device, seed=3)
    for _ in range(2):
        _assert_right(grouped.grouped_matmul_with(CONFIG, As, Bs), As, Bs)
    table = _table_of(As, Bs)
    assert grouped.CAPTURED == {}
    kernels.clear_cache()
    gc.collect()
    assert table() is None, "an eager table is freed with its cache entries"


def test_a_group_without_tiles_launches_nothing_and_keeps_nothing(torch_device, streams: FakeStreams) -> None:
    As, Bs = grouped.make_inputs(Problem("grouped_matmul", "fp16", "nn", ((0, 32, 8), (8, 0, 16))), torch_device, 4)
    grouped.grouped_matmul_with(CONFIG, As, Bs)
    streams.capturing = True
    outs = grouped.grouped_matmul_with(CONFIG, As, Bs)
    assert [tuple(o.shape) for o in outs] == [(0, 32), (8, 0)]
    assert grouped.CAPTURED == {}, "a graph that launches no kernel reads no table"


def test_tables_without_streams_are_never_kept_or_recorded(monkeypatch: pytest.MonkeyPatch) -> None:
    """The CPU's table: no stream to capture on or record, so the call skips both, whatever the capture check says."""
    if not kernels.interpreter_enabled():
        pytest.skip("CPU tensors run the Triton kernel only under the interpreter")
    recorded = []
    monkeypatch.setattr(_modes, "capturing", lambda: True)  # stand-in; CPU tensors are never captured
    monkeypatch.setattr(grouped, "_record_use", lambda table, device: recorded.append(table))
    As, Bs = _operands(torch.device("cpu"))
    _assert_right(grouped.grouped_matmul_with(CONFIG, As, Bs), As, Bs)
    launch = grouped.TABLES.get((grouped.signature(As, Bs), CONFIG))
    assert (launch.device, launch.streams) == (-1, set())
    assert grouped.CAPTURED == {} and recorded == []


# ------------------------------------------------------------------------ a table used from other streams

def test_a_table_is_recorded_once_on_each_stream_other_than_its_builder(torch_device, streams: FakeStreams) -> None:
    As, Bs = _operands(torch_device, seed=5)
    grouped.grouped_matmul_with(CONFIG, As, Bs)
    grouped.grouped_matmul_with(CONFIG, As, Bs)
    assert streams.recorded == [], "the building stream is the allocator's own: nothing to record"
    streams.stream = OTHER
    for _ in range(3):
        _assert_right(grouped.grouped_matmul_with(CONFIG, As, Bs), As, Bs)
    table = _table_of(As, Bs)
    assert streams.recorded == [(id(table()), OTHER)], "recorded once: later work on that stream is waited for too"
    assert streams.waits == [(f"stream {BUILT_ON}", OTHER)], "the other stream waits for the table's copy, once"
    streams.stream = BUILT_ON
    grouped.grouped_matmul_with(CONFIG, As, Bs)
    assert len(streams.recorded) == 1 and len(streams.waits) == 1


def test_a_call_while_capturing_keeps_the_table_instead_of_recording_the_capturing_stream(
        torch_device, streams: FakeStreams) -> None:
    As, Bs = _operands(torch_device, seed=6)
    grouped.grouped_matmul_with(CONFIG, As, Bs)
    streams.capturing, streams.stream = True, OTHER  # torch.cuda.graph captures on a stream of its own
    grouped.grouped_matmul_with(CONFIG, As, Bs)
    assert streams.recorded == [], "a kept table is never freed: no stream needs recording"
    assert grouped.CAPTURED[id(_table_of(As, Bs)())] is not None


# --------------------------------------------------------------------------------------- on a real GPU

# A graph whose table was freed reads whatever reuses the block. Zeros make that a clean failure: the
# kernel then sees no tiles and leaves the NaNs put in the outputs (other garbage could fault the GPU and
# fail every later test). 256 of them take every free block of the table's size class.
_SCRAPS = 256

# GPU clock cycles that keep a stream busy for some 0.1 s on an H100 (1.98 GHz boost), far longer than
# the host takes to build and launch, so a stream that does not wait for another shows.
_BUSY_CYCLES = 200_000_000


def _gpu_group(seed: int) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    As = [torch.randn(m, 64, device="cuda", generator=gen).half() for m in (32, 48, 80)]
    Bs = [torch.randn(64, 48, device="cuda", generator=gen).half() for _ in As]
    return As, Bs


@pytest.mark.gpu
def test_a_captured_group_replays_right_after_clear_cache_frees_every_cached_table(own_database) -> None:
    As, Bs = _gpu_group(0)
    # The warm-up runs on the default stream, so the table comes from that stream's pool, where the
    # scraps below are allocated: a freed table's block would go to them.
    for mode in kernels.MODES:  # resolve and compile both modes' launches before capturing
        with kernels.dispatch_mode(mode):
            kernels.grouped_matmul(As, Bs)
    torch.cuda.synchronize()
    launch = grouped.CALLS.get((grouped.signature(As, Bs), kernels.GRAPH))
    assert launch is not None, "the graph winner of this group is the Triton kernel"
    table_id, table_ptr, numel = id(launch.table), launch.table.data_ptr(), launch.table.numel()
    del launch  # the test must not keep the table alive itself
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        outs = kernels.grouped_matmul(As, Bs)
    kernels.clear_cache()
    gc.collect()
    assert table_id in grouped.CAPTURED and grouped.CAPTURED[table_id].data_ptr() == table_ptr
    scraps = [torch.zeros(numel, dtype=torch.int64, device="cuda") for _ in range(_SCRAPS)]
    assert table_ptr not in {s.data_ptr() for s in scraps}, "the captured table's block was handed out again"
    for a in As:
        a.mul_(2)
    for out in outs:
        out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    _assert_right(outs, As, Bs)


@pytest.mark.gpu
def test_a_launch_built_on_one_stream_runs_right_on_another_and_its_table_waits_for_it() -> None:
    As, Bs = _gpu_group(1)
    config = grouped.default_config(grouped.problem_of(As, Bs), current_device(As[0].device))
    grouped.grouped_matmul_with(config, [a.clone() for a in As], [b.clone() for b in Bs])  # compile first
    torch.cuda.synchronize()
    builder, user = torch.cuda.Stream(), torch.cuda.Stream()

    # The table's copy queues behind a busy builder: only `user` waiting for its event makes it ready there.
    with torch.cuda.stream(builder):
        torch.cuda._sleep(_BUSY_CYCLES)
        launch = grouped.prepare(config, grouped.signature(As, Bs), As[0].device)
    with torch.cuda.stream(user):
        first = launch(As[0])
    assert user.cuda_stream in launch.streams, "the table was not recorded on the stream that used it"
    torch.cuda.synchronize()
    _assert_right(first, As, Bs)

    # Dropped while `user` has yet to read it: its block must not go to the builder's next allocations
    # (the table's own stream), nor to kept buffers (kernels/_memory.py).
    with torch.cuda.stream(user):
        torch.cuda._sleep(10 * _BUSY_CYCLES)  # about 1 s: longer than the host's work below
        As[0].mul_(2)
        second = launch(As[0])
    table_ptr, numel = launch.table.data_ptr(), launch.table.numel()
    grouped.TABLES.clear()
    del launch
    gc.collect()
    with torch.cuda.stream(builder):
        scraps = [torch.zeros(numel, dtype=torch.int64, device="cuda") for _ in range(_SCRAPS)]
        scraps += [_memory.kept_empty(numel, torch.int64, torch.device("cuda")) for _ in range(_SCRAPS)]
    assert not user.query(), "`user` finished before the check, which then proves nothing: sleep longer"
    assert table_ptr not in {s.data_ptr() for s in scraps}, "the table was reused while `user` still read it"
    torch.cuda.synchronize()
    _assert_right(second, As, Bs)


def test_a_launch_built_while_capturing_serves_that_capture_alone(torch_device, streams: FakeStreams,
                                                                   monkeypatch: pytest.MonkeyPatch,
                                                                   own_database) -> None:
    """Its table holds values only once that graph has replayed (the copy is a node of it): an eager call
    or another capture must build its own. ``_building_in_capture`` is a stand-in, as above."""
    monkeypatch.setattr(grouped, "_building_in_capture", lambda device: streams.capturing)
    As, Bs = _operands(torch_device, seed=5)
    streams.capturing = True
    _assert_right(grouped.grouped_matmul_with(CONFIG, As, Bs), As, Bs)
    _assert_right(kernels.grouped_matmul(As, Bs), As, Bs)
    assert grouped.TABLES.get((grouped.signature(As, Bs), CONFIG)) is None
    assert len(grouped.CALLS) == 0, "dispatch keeps no launch built inside a capture"
    assert grouped.CAPTURED == {}, "the capture's own tables are its graph's, not kept"
    streams.capturing = False
    _assert_right(kernels.grouped_matmul(As, Bs), As, Bs)
    assert len(grouped.CALLS) == 1, "outside the capture, a launch is built again and kept"


def test_tables_kept_inside_a_released_block_go_with_it_and_older_ones_stay(torch_device, streams: FakeStreams) -> None:
    """The tuner's graph timings capture a table per timed config; their graphs die with the timing."""
    As, Bs = _operands(torch_device, seed=6)
    streams.capturing = True
    grouped.grouped_matmul_with(CONFIG, As, Bs)  # a user's capture: kept for good
    kept = dict(grouped.CAPTURED)
    with grouped.captures_released():
        other_As, other_Bs = _operands(torch_device, seed=7)
        grouped.grouped_matmul_with(CONFIG, other_As, other_Bs)
        assert len(grouped.CAPTURED) == len(kept) + 1
    streams.capturing = False
    assert grouped.CAPTURED == kept
