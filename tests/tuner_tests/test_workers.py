"""CheckPool: candidates compiled and checked in spawned workers, failures confined to their candidate.

Spawned workers inherit TRITON_INTERPRET from this process's environment (tests/conftest.py sets it
without a GPU), so they run the interpreter on a CPU and compile on a GPU. Spawning costs seconds,
so one pool serves the module.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Iterator
from concurrent.futures.process import BrokenProcessPool

import pytest

from kernels import Config, Problem
from tuner import workers
from tuner.workers import CheckPool, Precheck

MATMUL_PROBLEM = Problem("matmul", "fp16", "nn", ((32, 32, 64),))
GOOD = Config.from_dict(dict(VARIANT="tiled", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, SPLIT_K=1,
                             NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=2))
SPLITK = GOOD.replace(VARIANT="splitk", SPLIT_K=2)


@pytest.fixture(scope="module")
def pool() -> Iterator[CheckPool]:
    with CheckPool(workers=2, timeout_s=60) as opened:
        yield opened


def test_good_configs_check_ok(pool: CheckPool) -> None:
    results = pool.check(MATMUL_PROBLEM, [GOOD, SPLITK])
    assert set(results) == {GOOD, SPLITK}
    for config, result in results.items():
        assert result.status == "ok", (str(config), result.reason)
        assert result.rel_error <= 1.0 and result.seconds > 0


def test_close_ends_every_process_of_the_pool_and_its_timing_worker_at_once() -> None:
    # Killed, not asked to exit: a fleet run waits for its workers' pools to close before it ends.
    opened = CheckPool(workers=2, timeout_s=60)
    opened.start()
    assert opened.check(MATMUL_PROBLEM, [GOOD])[GOOD].status == "ok"
    processes = [*opened._pool._processes.values(), *opened.timing._pool._processes.values()]
    assert len(processes) == 3
    opened.close()
    assert all(not p.is_alive() and p.exitcode == -signal.SIGKILL for p in processes), \
        [(p.pid, p.exitcode) for p in processes]
    assert opened.check(MATMUL_PROBLEM, [GOOD])[GOOD].status == "ok"  # a closed pool starts again when used
    opened.close()


def test_failures_are_reported_per_candidate(pool: CheckPool) -> None:
    missing_block_k = Config.from_dict({k: v for k, v in GOOD.as_dict().items() if k != "BLOCK_K"})
    unknown_variant = GOOD.replace(VARIANT="warp-specialized")
    results = pool.check(MATMUL_PROBLEM, [missing_block_k, GOOD, unknown_variant])
    assert results[GOOD].status == "ok"
    assert results[missing_block_k].status == "error"
    assert "no parameter 'BLOCK_K'" in results[missing_block_k].reason
    assert results[unknown_variant].status == "error"
    assert "warp-specialized" in results[unknown_variant].reason


def test_config_that_writes_nothing_is_a_wrong_result(pool: CheckPool) -> None:
    # NUM_SM=0 launches no program: the outputs keep what the fresh buffer held, NaN under the check's poison.
    problem = Problem("grouped_matmul", "fp16", "nn", ((16, 32, 32), (8, 32, 32)))
    idle = Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, NUM_SM=0, num_warps=4, num_stages=2)
    result = pool.check(problem, [idle])[idle]
    assert result.status == "wrong_result", result.reason
    assert "is nan" in result.reason and "its bound" in result.reason


def test_check_each_returns_each_cases_verdict_in_order_across_problems(pool: CheckPool) -> None:
    grouped = Problem("grouped_matmul", "fp16", "nn", ((16, 32, 32), (8, 32, 32)))
    idle = Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, NUM_SM=0, num_warps=4, num_stages=2)
    other = Problem("matmul", "fp16", "nn", ((16, 32, 32),))
    results = pool.check_each([(MATMUL_PROBLEM, GOOD), (grouped, idle), (other, GOOD), (MATMUL_PROBLEM, SPLITK)])
    assert [r.status for r in results] == ["ok", "wrong_result", "ok", "ok"], [r.reason for r in results]


def _exit_on_stage_5(kernel: str, problem_key: str, config_text: str, seed: int) -> Precheck:
    """Stands in for the worker function: dies like a kernel that takes its process down, for one config."""
    if "num_stages: 5" in config_text:
        os._exit(1)
    return _REAL_CHECK(kernel, problem_key, config_text, seed)


_REAL_CHECK = workers._check_in_worker


def test_candidate_that_kills_its_worker_is_crashed_and_bystanders_survive(pool, monkeypatch) -> None:
    # Submitted functions are pickled by name, so the workers import this module to find the stand-in.
    monkeypatch.setattr(workers, "_check_in_worker", _exit_on_stage_5)
    killer = GOOD.replace(num_stages=5)
    results = pool.check(MATMUL_PROBLEM, [GOOD, killer, SPLITK])
    assert results[killer].status == "crashed"
    assert "died" in results[killer].reason
    assert results[GOOD].status == "ok" and results[SPLITK].status == "ok"
    monkeypatch.undo()
    assert pool.check(MATMUL_PROBLEM, [GOOD])[GOOD].status == "ok", "the pool was rebuilt"


def _hang_on_stage_4_or_5(kernel: str, problem_key: str, config_text: str, seed: int) -> Precheck:
    """Stands in for the worker function: never returns for two configs, like a hung compile."""
    if "num_stages: 4" in config_text or "num_stages: 5" in config_text:
        time.sleep(600)  # the pool kills the worker long before
    return _REAL_CHECK(kernel, problem_key, config_text, seed)


def test_hung_candidate_times_out_and_the_pool_recovers(pool, monkeypatch) -> None:
    monkeypatch.setattr(workers, "_check_in_worker", _hang_on_stage_4_or_5)
    monkeypatch.setattr(pool, "timeout_s", 1.0)
    monkeypatch.setattr(workers, "WORKER_START_S", 10.0)  # a rebuilt pool's imports take ~4 s here
    hung = GOOD.replace(num_stages=4)
    result = pool.check(MATMUL_PROBLEM, [hung])[hung]
    assert result.status == "timeout" and "no result within 1 s" in result.reason
    monkeypatch.undo()
    assert pool.check(MATMUL_PROBLEM, [GOOD])[GOOD].status == "ok", "the pool was rebuilt"


@pytest.mark.interpreter
def test_candidate_queued_behind_hung_ones_is_still_checked(private_cache_pool, monkeypatch) -> None:
    # The pool's own Triton cache: with the host's, another test's worker checking GOOD at the same moment
    # holds GOOD's compile lock past this test's 1 s (CI under pytest-xdist, 2026-11-29: "no result within 1 s").
    pool = private_cache_pool
    monkeypatch.setattr(workers, "_check_in_worker", _hang_on_stage_4_or_5)
    monkeypatch.setattr(pool, "timeout_s", 1.0)
    monkeypatch.setattr(workers, "WORKER_START_S", 10.0)  # a rebuilt pool's imports take ~4 s here
    first, second = GOOD.replace(num_stages=4), GOOD.replace(num_stages=5)
    results = pool.check(MATMUL_PROBLEM, [first, second, GOOD])  # two workers, both hung
    assert results[first].status == results[second].status == "timeout"
    assert results[GOOD].status == "ok", results[GOOD].reason


@pytest.fixture
def private_cache_pool(tmp_path, monkeypatch) -> Iterator[CheckPool]:
    """A pool whose workers, and this process, keep Triton's cache (and so the compile locks) in a folder of
    this test's own: under pytest-xdist another test's worker compiling GOOD holds the host's lock for it
    (1.3 s on an H200 under `pytest -n 8 tests/tuner_tests`, 2026-11-29, torch 2.11.0+cu130, triton 3.6.0),
    which this test would read as its own wait."""
    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path / "triton-cache"))
    with CheckPool(workers=2, timeout_s=60) as opened:
        yield opened


def test_a_worker_waits_for_another_holder_of_the_same_binarys_compile_lock(private_cache_pool: CheckPool) -> None:
    """This process holds the lock of GOOD's binary (as another GPU's worker compiling it would): a worker's
    check of GOOD on a problem of the same specialization waits for it, SPLITK's does not."""
    pool = private_cache_pool
    same_binary = Problem("matmul", "fp16", "nn", ((48, 32, 64),))  # 48 rows: divisible by 16, as 32 is
    with workers.compiling_alone("matmul", MATMUL_PROBLEM, str(GOOD)) as waited:
        assert waited < 1.0
        pool.submit(same_binary, GOOD)
        pool.submit(MATMUL_PROBLEM, SPLITK)
        config, result = pool.next_result()
        assert config == SPLITK and result.status == "ok", result.reason
        time.sleep(1.0)
        assert pool.in_flight == 1  # GOOD is still waiting for the lock
        released = time.monotonic()
    config, result = pool.next_result()
    assert config == GOOD and result.status == "ok", result.reason
    assert result.seconds > time.monotonic() - released  # its time includes the wait


def test_binaries_are_keyed_by_what_triton_specializes_on() -> None:
    key = workers._binary_key
    assert key("matmul", MATMUL_PROBLEM, str(GOOD)) == key("matmul", Problem("matmul", "fp16", "nn", ((64, 32, 64),)),
                                                             str(GOOD))
    assert key("matmul", MATMUL_PROBLEM, str(GOOD)) != key("matmul", Problem("matmul", "fp16", "nn", ((33, 32, 64),)),
                                                             str(GOOD))  # 33 rows: not a multiple of 16
    assert key("matmul", MATMUL_PROBLEM, str(GOOD)) != key("matmul", MATMUL_PROBLEM, str(SPLITK))
    assert key("matmul", MATMUL_PROBLEM, str(GOOD)) != key("matmul", Problem("matmul", "bf16", "nn", ((32, 32, 64),)),
                                                             str(GOOD))


def test_pipeline_returns_each_submitted_candidate_once(pool: CheckPool) -> None:
    pool.submit(MATMUL_PROBLEM, GOOD)
    pool.submit(MATMUL_PROBLEM, SPLITK)
    with pytest.raises(RuntimeError, match="in flight already; take a result first"):
        pool.submit(MATMUL_PROBLEM, GOOD.replace(num_stages=3))
    assert pool.in_flight == 2
    results = dict(pool.next_result() for _ in range(2))
    assert set(results) == {GOOD, SPLITK} and all(r.status == "ok" for r in results.values())
    assert pool.in_flight == 0
    with pytest.raises(RuntimeError, match="no candidate in flight"):
        pool.next_result()


def test_pipeline_confines_a_crash_to_its_candidate(pool, monkeypatch) -> None:
    monkeypatch.setattr(workers, "_check_in_worker", _exit_on_stage_5)
    killer = GOOD.replace(num_stages=5)
    pool.submit(MATMUL_PROBLEM, killer)
    pool.submit(MATMUL_PROBLEM, GOOD)
    results = dict(pool.next_result() for _ in range(2))
    assert results[killer].status == "crashed" and results[GOOD].status == "ok"


# ------------------------------------------------------------------------------------------ timing worker

def _exit_when_timed_on_stage_5(kernel, problem_key, seed, config_text, *rest):
    """Stands in for the timing worker's function: dies like a kernel that faults only when timed."""
    if "num_stages: 5" in config_text:
        os._exit(1)
    return _REAL_MEASURE(kernel, problem_key, seed, config_text, *rest)


def _hang_when_timed_on_stage_4(kernel, problem_key, seed, config_text, *rest):
    if "num_stages: 4" in config_text:
        time.sleep(600)
    return _REAL_MEASURE(kernel, problem_key, seed, config_text, *rest)


_REAL_MEASURE = workers._measure_in_worker


@pytest.fixture(scope="module")
def timing() -> Iterator[workers.TimingWorker]:
    worker = workers.TimingWorker(timeout_s=60)
    yield worker
    worker.close()


def test_isolated_bench_checks_and_times_in_its_worker(timing) -> None:
    bench = workers.IsolatedBench(timing, "matmul", MATMUL_PROBLEM, None)
    result = bench.measure(GOOD)
    assert result.status == "ok" and result.time_ms > 0 and result.rel_error <= 1.0
    wrong = bench.measure(GOOD.replace(VARIANT="warp-specialized"))
    assert wrong.status == "invalid" and "warp-specialized" in wrong.reason
    assert bench.baseline_ms() > 0
    (ours,), theirs = bench.contest([GOOD])
    assert ours > 0 and theirs > 0
    times, theirs = bench.contest([GOOD, GOOD.replace(num_stages=3)])
    assert len(times) == 2 and all(t > 0 for t in times) and theirs > 0


def test_candidate_that_kills_the_timing_worker_is_crashed_and_the_next_one_is_timed(timing, monkeypatch) -> None:
    monkeypatch.setattr(workers, "_measure_in_worker", _exit_when_timed_on_stage_5)
    bench = workers.IsolatedBench(timing, "matmul", MATMUL_PROBLEM, None)
    crashed = bench.measure(GOOD.replace(num_stages=5))
    assert crashed.status == "crashed" and "timing worker process died" in crashed.reason
    assert bench.measure(GOOD).status == "ok", "a new worker took over"


def test_candidate_that_hangs_the_timing_worker_times_out(timing, monkeypatch) -> None:
    monkeypatch.setattr(workers, "_measure_in_worker", _hang_when_timed_on_stage_4)
    monkeypatch.setattr(timing, "timeout_s", 1.0)
    monkeypatch.setattr(workers, "WORKER_START_S", 10.0)
    bench = workers.IsolatedBench(timing, "matmul", MATMUL_PROBLEM, None)
    bench.measure(GOOD)  # a warm worker, so the hung call gets the bare timeout
    hung = bench.measure(GOOD.replace(num_stages=4))
    assert hung.status == "timeout" and "no result within 1 s" in hung.reason
    monkeypatch.setattr(timing, "timeout_s", 60.0)
    assert bench.measure(GOOD).status == "ok"
    with pytest.raises(workers.WorkerLost):  # not a candidate's call: the caller decides
        monkeypatch.setattr(workers, "_baseline_in_worker", _die)
        bench.baseline_ms()


def _die(*args):
    os._exit(1)


@pytest.mark.gpu
def test_isolated_bench_times_back_to_back_in_its_worker(timing) -> None:
    """``IsolatedBench.back_to_back`` (the eager winner's fast-host check) runs in the timing worker: CUDA
    graphs of calls, so GPU only."""
    bench = workers.IsolatedBench(timing, "matmul", MATMUL_PROBLEM, None)
    ours, theirs = bench.back_to_back(GOOD)
    assert ours > 0 and theirs > 0


def _exit_on_stage_5_others_slow(kernel: str, problem_key: str, config_text: str, seed: int) -> Precheck:
    """Stands in for the worker function: as _exit_on_stage_5, but every other config takes a while, so a
    bystander is still running when the killer takes the pool down."""
    if "num_stages: 5" in config_text:
        os._exit(1)
    time.sleep(0.5)
    return _REAL_CHECK(kernel, problem_key, config_text, seed)


def test_candidate_submitted_while_bystanders_rerun_alone_gets_its_own_verdict(pool, monkeypatch) -> None:
    # The search's pipeline: after a crash, each verdict taken is followed by a new submit, while the
    # crash's bystanders still wait to be re-run alone. Each candidate must get its own verdict, once.
    monkeypatch.setattr(workers, "_check_in_worker", _exit_on_stage_5_others_slow)
    monkeypatch.setattr(workers, "WORKER_START_S", 30.0)
    killer, bystander, newcomer = GOOD.replace(num_stages=5), SPLITK.replace(num_stages=3), GOOD
    pool.submit(MATMUL_PROBLEM, killer)
    pool.submit(MATMUL_PROBLEM, bystander)
    results = dict([pool.next_result()])
    pool.submit(MATMUL_PROBLEM, newcomer)
    while pool.in_flight:
        config, result = pool.next_result()
        assert config not in results, f"{config} got two verdicts"
        results[config] = result
    assert set(results) == {killer, bystander, newcomer}
    assert results[killer].status == "crashed"
    assert results[bystander].status == "ok" and results[newcomer].status == "ok"


def test_submit_after_a_candidate_in_flight_broke_the_pool_does_not_end_the_search(pool, monkeypatch) -> None:
    # The search takes one verdict, times that candidate (seconds), then submits a new one: meanwhile another
    # candidate in flight can kill its worker, which breaks the whole executor. The submit must not raise.
    monkeypatch.setattr(workers, "_check_in_worker", _exit_on_stage_5)
    monkeypatch.setattr(workers, "WORKER_START_S", 30.0)
    killer = GOOD.replace(num_stages=5)
    pool.submit(MATMUL_PROBLEM, killer)
    (killer_future,) = pool._pending  # white box: wait until the executor has failed it, so it is broken
    assert isinstance(killer_future.exception(timeout=60), BrokenProcessPool)
    pool.submit(MATMUL_PROBLEM, GOOD)
    results = dict(pool.next_result() for _ in range(2))
    assert results[killer].status == "crashed" and results[GOOD].status == "ok"
    assert pool.in_flight == 0


def test_a_timing_worker_that_died_between_calls_is_replaced_for_the_next_candidate(timing) -> None:
    # Its process dies while idle (here killed by the test; on a box, say, the OOM killer): no candidate was
    # in it, so the next one is timed in a new worker, neither blamed nor allowed to end the search.
    bench = workers.IsolatedBench(timing, "matmul", MATMUL_PROBLEM, None)
    assert bench.measure(GOOD).status == "ok"
    (process,) = timing._pool._processes.values()  # white box: the worker's process, started by this test
    os.kill(process.pid, signal.SIGKILL)
    process.join(30)
    deadline = time.monotonic() + 30
    while not timing._pool._broken and time.monotonic() < deadline:  # its executor notices the death
        time.sleep(0.05)
    assert bench.measure(GOOD).status == "ok"


def _exit_on_stage_5_raise_on_stage_4(kernel: str, problem_key: str, config_text: str, seed: int) -> Precheck:
    """Stands in for the worker function: one config kills its worker, another's call fails in the worker
    (raises instead of returning a verdict, as a failing cleanup after the check would)."""
    if "num_stages: 4" in config_text:
        time.sleep(0.5)  # still running when the other one takes the pool down
        raise RuntimeError("the call failed in the worker")
    return _exit_on_stage_5(kernel, problem_key, config_text, seed)


def test_a_call_that_fails_in_a_bystander_run_alone_is_its_error_not_the_searchs_end(pool, monkeypatch) -> None:
    # Run with the others, such a call is an "error" verdict; run alone after a crash, it raised out of
    # next_result and ended the search.
    monkeypatch.setattr(workers, "_check_in_worker", _exit_on_stage_5_raise_on_stage_4)
    monkeypatch.setattr(workers, "WORKER_START_S", 30.0)
    killer, failing = GOOD.replace(num_stages=5), GOOD.replace(num_stages=4)
    results = pool.check(MATMUL_PROBLEM, [killer, failing])
    assert results[killer].status == "crashed"
    assert results[failing].status == "error" and "the call failed in the worker" in results[failing].reason


# ------------------------------------------------------------------------------------------ device faults

def _fault_the_device() -> None:
    """A sticky device fault, as a candidate's illegal address leaves one: an out-of-bounds gather's device-side
    assert. The process lives on, but every later CUDA call in it fails."""
    import torch

    try:
        torch.zeros(4, device="cuda")[torch.tensor([1 << 20], device="cuda")]
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the fault is the point; the real worker function runs into it next
        pass


def _fault_when_timed_on_stage_5(kernel, problem_key, seed, config_text, *rest):
    """Stands in for the timing worker's function: for one config the device faults first, then the real
    function measures it (and meets the fault, as it would meet a faulting kernel's)."""
    if "num_stages: 5" in config_text:
        _fault_the_device()
    return _REAL_MEASURE(kernel, problem_key, seed, config_text, *rest)


def _fault_when_checked_on_stage_5(kernel: str, problem_key: str, config_text: str, seed: int) -> Precheck:
    """As _fault_when_timed_on_stage_5, for the compile workers' check."""
    if "num_stages: 5" in config_text:
        _fault_the_device()
    return _REAL_CHECK(kernel, problem_key, config_text, seed)


@pytest.mark.gpu
def test_a_candidate_that_faults_the_device_while_timed_is_crashed_and_the_next_is_timed_in_a_sound_worker(
        timing, monkeypatch) -> None:
    # Before: Bench.measure caught the CUDA error as a plain "error" and the worker lived on with a faulted
    # context, so every later candidate of the search (and its contests) failed there too.
    monkeypatch.setattr(workers, "_measure_in_worker", _fault_when_timed_on_stage_5)
    bench = workers.IsolatedBench(timing, "matmul", MATMUL_PROBLEM, None)
    faulted = bench.measure(GOOD.replace(num_stages=5))
    assert faulted.status == "crashed", faulted
    after = bench.measure(GOOD)
    assert after.status == "ok", after


@pytest.mark.gpu
def test_a_candidate_that_faults_the_device_while_checked_is_crashed_and_the_worker_replaced(monkeypatch) -> None:
    monkeypatch.setattr(workers, "_check_in_worker", _fault_when_checked_on_stage_5)
    faulty = GOOD.replace(num_stages=5)
    with CheckPool(workers=1, timeout_s=120) as one:  # one worker: the next candidate is checked where the fault was
        results = one.check(MATMUL_PROBLEM, [faulty, GOOD, SPLITK])
    assert results[faulty].status == "crashed", results[faulty]
    assert results[GOOD].status == "ok" and results[SPLITK].status == "ok", results
