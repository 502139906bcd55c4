"""The job queue on SQLite and PostgreSQL: atomic claims, leases, device kinds, requeues."""

from __future__ import annotations

import multiprocessing
import time
from typing import Any

import pytest

from db import Store
from db.queue import MAX_ATTEMPTS, JobQueue, JobSpec

H100 = "NVIDIA H100 80GB HBM3"
A100 = "NVIDIA A100-SXM4-80GB"


def spec(m: int, device: str = H100, priority: float = 0.0) -> JobSpec:
    return JobSpec(device, "matmul", f"fp16:nn:{m}x64x64", budget_trials=8, options={"sampler": "tpe"},
                   priority=priority)


@pytest.fixture
def queue(store: Store) -> JobQueue:
    return JobQueue(store)


def test_claims_go_highest_priority_first_and_each_job_once(queue: JobQueue) -> None:
    queue.enqueue([spec(1, priority=1.0), spec(2, priority=5.0), spec(3, priority=3.0)])
    claimed = [queue.claim(f"w{i}", H100) for i in range(4)]
    assert [job.spec.problem_key for job in claimed[:3]] == ["fp16:nn:2x64x64", "fp16:nn:3x64x64",
                                                             "fp16:nn:1x64x64"]
    assert claimed[3] is None
    assert claimed[0].spec.options == {"sampler": "tpe"} and claimed[0].attempts == 1
    assert queue.counts() == {"queued": 0, "running": 3, "done": 0, "failed": 0}


def _job(kernel: str, m: int, priority: float) -> JobSpec:
    return JobSpec(H100, kernel, f"bf16:nt:{m}x64x64", budget_trials=8, priority=priority)


def test_within_a_weight_the_kernel_whose_jobs_ran_longest_is_claimed_first(queue: JobQueue) -> None:
    # One weight (integer part 1), largest problem first below it: 4 rows of matmul, then of matmul_bias, ...
    queue.enqueue([_job("matmul", 4, 1.9), _job("matmul_bias", 4, 1.8), _job("matmul", 2, 1.7),
                   _job("matmul_bias", 2, 1.6), _job("matmul", 1, 1.5), _job("matmul_bias", 1, 1.4)])
    first = queue.claim("w", H100)
    assert first.spec.kernel == "matmul"  # nothing known yet: priority
    time.sleep(0.5)  # a real duration: the matmul job runs long
    assert queue.finish(first.id, "w")
    second = queue.claim("w", H100)
    assert second.spec.kernel == "matmul_bias"  # no matmul_bias job finished yet: its first one tells
    assert queue.finish(second.id, "w")  # at once: the matmul_bias job is short
    rest = [queue.claim("w", H100) for _ in range(4)]
    assert [(job.spec.kernel, job.spec.problem_key) for job in rest] == [
        ("matmul", "bf16:nt:2x64x64"), ("matmul", "bf16:nt:1x64x64"),
        ("matmul_bias", "bf16:nt:2x64x64"), ("matmul_bias", "bf16:nt:1x64x64")]


def test_a_kernel_with_no_finished_job_goes_first_and_weights_stay_above_durations(queue: JobQueue) -> None:
    queue.enqueue([_job("matmul", 8, 2.5), _job("matmul", 4, 1.9), _job("gated_matmul", 4, 1.5),
                   _job("matmul_bias", 4, 0.5)])
    heavy = queue.claim("w", H100)
    assert heavy.spec.problem_key == "bf16:nt:8x64x64"  # the higher weight (integer part 2) first
    time.sleep(0.2)
    assert queue.finish(heavy.id, "w")
    # matmul has a finished job now, gated_matmul none: gated_matmul's first job comes before matmul's next
    assert [queue.claim("w", H100).spec.kernel for _ in range(3)] == ["gated_matmul", "matmul", "matmul_bias"]


def test_claim_order_keeps_integer_priorities_in_order() -> None:
    from db.queue import claim_order

    # `search --shape a --shape b`: priorities 3, 2, 1, each its own weight: the order given, whatever ran long
    assert claim_order([(1, "matmul_bias", 3.0), (2, "matmul", 2.0), (3, "matmul", 1.0)],
                       {"matmul": 9.0, "matmul_bias": 1.0}) == [1, 2, 3]
    # equal priorities: the job id (enqueue order) decides last
    assert claim_order([(5, "matmul", 1.5), (4, "matmul", 1.5)], {}) == [4, 5]


def test_a_job_whose_worker_was_lost_is_claimed_before_the_queued_ones_of_its_weight(queue: JobQueue) -> None:
    """A killed worker's job has waited out a lease already: the next claim of its weight takes it, before a
    larger problem of that weight enqueued since, but not before a job of a higher weight."""
    queue.enqueue([_job("matmul", 8, 1.9), _job("gated_matmul", 4, 1.5)])
    lost = queue.claim("dead", H100, lease_s=1.0)
    assert lost.spec.problem_key == "bf16:nt:8x64x64"
    queue.enqueue([_job("gated_matmul", 16, 1.95), _job("matmul_bias", 4, 3.0)])  # since: larger; a higher weight
    time.sleep(1.1)  # its worker is gone: no renewal, and the lease runs out
    assert queue.claim("alive", H100).spec.kernel == "matmul_bias"
    again = queue.claim("alive", H100)
    assert again.id == lost.id and again.attempts == 2, "the lost job before the larger queued problem"
    assert [queue.claim("alive", H100).spec.problem_key for _ in range(2)] == ["bf16:nt:16x64x64", "bf16:nt:4x64x64"]


def test_claim_order_puts_lost_jobs_first_within_their_weight() -> None:
    from db.queue import claim_order

    candidates = [(1, "matmul", 2.5), (2, "gated_matmul", 1.9), (3, "matmul", 1.5)]
    assert claim_order(candidates, {"matmul": 1.0}) == [1, 2, 3]
    assert claim_order(candidates, {"matmul": 1.0}, lost={3}) == [1, 3, 2], "within weight 1, the lost job first"
    assert claim_order(candidates, {"matmul": 1.0}, lost={2, 3}) == [1, 2, 3]


def test_worker_takes_only_jobs_of_its_device_kind(queue: JobQueue) -> None:
    queue.enqueue([spec(1, device=A100), spec(2)])
    job = queue.claim("w", H100)
    assert job is not None and job.spec.device_name == H100
    assert queue.claim("w", H100) is None  # the A100 job stays queued for an A100 worker
    assert [j.spec.device_name for j in queue.jobs("queued")] == [A100]


def test_expired_lease_hands_the_job_to_another_worker_and_the_first_cannot_finish_it(queue: JobQueue) -> None:
    queue.enqueue([spec(1)])
    # A lease long enough that a loaded CI machine's next claim comes inside it (0.2 s failed once on
    # PostgreSQL while the machine ran other work), short enough to wait out.
    first = queue.claim("dead", H100, lease_s=1.0)
    assert queue.claim("alive", H100) is None  # the lease still holds
    time.sleep(1.1)
    second = queue.claim("alive", H100)
    assert second is not None and second.id == first.id and second.attempts == 2
    assert not queue.renew(first.id, "dead") and not queue.finish(first.id, "dead")
    assert queue.renew(second.id, "alive") and queue.finish(second.id, "alive")
    assert [(j.state, j.worker) for j in queue.jobs()] == [("done", "alive")]


def test_renewed_lease_keeps_the_job(queue: JobQueue) -> None:
    queue.enqueue([spec(1)])
    job = queue.claim("w", H100, lease_s=1.0)
    for _ in range(3):  # 1.5 s in all, past the first lease: the renewals kept it (each with 0.5 s to spare)
        time.sleep(0.5)
        assert queue.renew(job.id, "w", lease_s=1.0)
    assert queue.claim("other", H100) is None


def test_job_lost_too_often_fails_instead_of_killing_more_workers(queue: JobQueue) -> None:
    queue.enqueue([spec(1)])
    for attempt in range(MAX_ATTEMPTS):
        assert queue.claim(f"w{attempt}", H100, lease_s=0.05) is not None
        time.sleep(0.1)
    assert queue.claim("last", H100) is None
    (job,) = queue.jobs()
    assert job.state == "failed" and "lost 3 times" in (job.error or "")


def test_enqueue_again_requeues_done_jobs_but_leaves_running_ones(queue: JobQueue) -> None:
    ids = queue.enqueue([spec(1), spec(2)])
    done = queue.claim("w", H100)
    queue.finish(done.id, "w")
    running = queue.claim("w", H100)
    assert queue.enqueue([spec(1), spec(2)]) == ids
    states = {j.id: (j.state, j.worker) for j in queue.jobs()}
    assert states[done.id] == ("queued", None) and states[running.id] == ("running", "w")
    assert queue.enqueue([spec(1)], again=False) == [ids[0]]


def test_failed_job_keeps_its_error_and_release_requeues(queue: JobQueue) -> None:
    queue.enqueue([spec(1), spec(2)])
    first, second = queue.claim("w", H100), queue.claim("w", H100)
    assert queue.finish(first.id, "w", error="no config ran correctly")
    assert queue.release(second.id, "w")
    assert {j.id: (j.state, j.error) for j in queue.jobs()} == {
        first.id: ("failed", "no config ran correctly"), second.id: ("queued", None)}


def test_worker_heartbeats_are_listed(queue: JobQueue) -> None:
    queue.beat("host:0", H100, "host", 123, "busy", job_id=7, done=2)
    queue.beat("host:0", H100, "host", 123, "idle", done=3)
    (worker,) = queue.workers()
    assert (worker.name, worker.state, worker.job_id, worker.jobs_done) == ("host:0", "idle", None, 3)
    assert worker.heartbeat_at >= worker.started_at


def claim_all(url: str, name: str, barrier: Any, results: Any) -> None:
    with Store(url) as store:
        queue = JobQueue(store)
        barrier.wait(timeout=60)
        while (job := queue.claim(name, H100)) is not None:
            results.put((name, job.id))
            queue.finish(job.id, name)


CLAIMERS = 4
JOBS = 40


def test_concurrent_claimers_take_every_job_exactly_once(db_url: str) -> None:
    with Store(db_url) as store:
        ids = JobQueue(store).enqueue([spec(m) for m in range(1, JOBS + 1)])
    context = multiprocessing.get_context("spawn")
    barrier, results = context.Barrier(CLAIMERS), context.Queue()
    processes = [context.Process(target=claim_all, args=(db_url, f"w{i}", barrier, results))
                 for i in range(CLAIMERS)]
    for process in processes:
        process.start()
    claims = [results.get(timeout=120) for _ in range(JOBS)]
    for process in processes:
        process.join(timeout=60)
    assert [process.exitcode for process in processes] == [0] * CLAIMERS
    assert sorted(job_id for _, job_id in claims) == sorted(ids)
    with Store(db_url) as store:
        assert JobQueue(store).counts()["done"] == JOBS


def _with(m: int, trials: int, seconds: float | None, options: dict, priority: float = 0.0) -> JobSpec:
    return JobSpec(H100, "matmul", f"fp16:nn:{m}x64x64", budget_trials=trials, budget_seconds=seconds,
                   options=options, priority=priority)


def test_enqueue_again_gives_a_queued_job_the_new_budget_and_options(queue: JobQueue) -> None:
    [job_id] = queue.enqueue([_with(1, 500, None, {"sampler": "tpe", "seed": 1})])
    assert queue.enqueue([_with(1, 3, 2.5, {"sampler": "random", "seed": 7, "eager_passes": 1}, 4.0)]) == [job_id]
    [job] = queue.jobs()
    assert (job.id, job.state, job.attempts) == (job_id, "queued", 0)
    assert (job.spec.budget_trials, job.spec.budget_seconds, job.spec.priority) == (3, 2.5, 4.0)
    assert job.spec.options == {"sampler": "random", "seed": 7, "eager_passes": 1}


def test_enqueue_again_gives_a_running_job_whose_lease_ran_out_the_new_budget(queue: JobQueue) -> None:
    queue.enqueue([_with(1, 500, None, {"seed": 1})])
    lost = queue.claim("dead", H100, lease_s=0.05)
    time.sleep(0.2)
    queue.enqueue([_with(1, 3, None, {"seed": 2})])
    taken = queue.claim("alive", H100)  # handed on as a lost job: the loss still counts
    assert taken is not None and taken.id == lost.id and taken.attempts == 2
    assert (taken.spec.budget_trials, taken.spec.options) == (3, {"seed": 2})


def test_enqueue_again_leaves_a_running_job_under_a_live_lease_as_it_is(queue: JobQueue) -> None:
    queue.enqueue([_with(1, 500, None, {"seed": 1})])
    running = queue.claim("w", H100, lease_s=600)
    queue.enqueue([_with(1, 3, None, {"seed": 2})])
    [job] = queue.jobs()
    assert (job.state, job.worker, job.lease_until) == ("running", "w", running.lease_until)
    assert (job.spec.budget_trials, job.spec.options) == (500, {"seed": 1})
