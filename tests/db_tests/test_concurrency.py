from __future__ import annotations

import multiprocessing
from typing import Any

from db import Store

from .conftest import make_record

WORKERS = 3
OWN_RECORDS = 50
SHARED_RECORDS = 10


def shared_time_ms(worker: int, index: int) -> float:
    """Distinct times per (worker, problem), so exactly one worker holds each shared minimum."""
    return 1.0 + ((worker * 7 + index * 3) % WORKERS) * 0.25 + worker * 0.001


def write_from_process(url: str, worker: int, barrier: Any) -> None:
    """One tuner process: its own problems plus problems every worker also tunes."""
    own = [make_record(m=1000 * (worker + 1) + i, trials=worker) for i in range(OWN_RECORDS)]
    shared = [make_record(m=i + 1, time_ms=shared_time_ms(worker, i), trials=worker)
              for i in range(SHARED_RECORDS)]
    mixed = [record for pair in zip(own, shared) for record in pair] + own[SHARED_RECORDS:]
    with Store(url) as store:
        barrier.wait(timeout=60)  # start together, so the writes really overlap
        if worker % 2:
            for start in range(0, len(mixed), 7):
                store.put_many(mixed[start:start + 7])
        else:
            for record in mixed:
                store.put(record)


def test_concurrent_writers_lose_nothing(db_url: str) -> None:
    Store(db_url).close()  # create the table once, as a tuner's first run would
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(WORKERS)
    processes = [context.Process(target=write_from_process, args=(db_url, worker, barrier))
                 for worker in range(WORKERS)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    assert [process.exitcode for process in processes] == [0] * WORKERS

    with Store.open_readonly(db_url) as store:
        stored = {record.shapes[0][0]: record for record in store.records()}
    assert len(stored) == WORKERS * OWN_RECORDS + SHARED_RECORDS
    for worker in range(WORKERS):
        assert all(stored[1000 * (worker + 1) + i].trials == worker for i in range(OWN_RECORDS))
    for index in range(SHARED_RECORDS):
        fastest = min(range(WORKERS), key=lambda worker: shared_time_ms(worker, index))
        assert stored[index + 1].time_ms == shared_time_ms(fastest, index)
        assert stored[index + 1].trials == fastest
