"""Load test of the fleet's database path: many simulated workers with instant fake timings, against a
real PostgreSQL (or any --db URL), counting claims, trials and SQL statements per second.

Each simulated worker is a process doing what ``python -m tuner worker`` does to the database, with the
GPU work removed: claim a job under a lease, open the job's Optuna study in the same database, run
``--trials`` ask/tell trials whose objective returns at once, renew the lease (a heartbeat) every
``--beat-every`` trials, store the winner (``Store.put``), finish the job. The sampler is Optuna's
RandomSampler so that the sampler's own CPU time (TPE grows with the trials) does not hide the
database's cost. Every SQL statement is counted (SQLAlchemy ``before_cursor_execute``), so the report
gives round trips per trial and per job, which the model in docs/FLEET.md uses.

Run (CPU only; starts a throw-away PostgreSQL on loopback when --db is not given):
    .venv/bin/python scripts/fleet_load.py --workers 1,4,16,64 --jobs 128 --trials 20 --out /tmp/fleet_load
Prints one row per worker count; writes fleet_load.json under --out.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import sys
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEVICE = "Simulated GPU"
SPACE = {"BLOCK_M": [16, 32, 64, 128, 256], "BLOCK_N": [16, 32, 64, 128, 256], "BLOCK_K": [32, 64, 128],
         "GROUP_SIZE_M": [1, 4, 8], "num_warps": [2, 4, 8], "num_stages": [2, 3, 4, 5]}


def _count_statements(engine, counter: list[int]) -> None:
    from sqlalchemy import event

    def count(*_args) -> None:
        counter[0] += 1

    event.listen(engine, "before_cursor_execute", count)


def _record(problem_key: str, config: dict, time_ms: float, trials: int):
    from db import Record

    return Record(device_name=DEVICE, device_alias="sim", compute_capability="0.0", sm_count=1, kernel="matmul",
                  problem_key=problem_key, dtype="fp16", layout="nn", shapes=((16, 16, 16),), config=config,
                  time_ms=time_ms, tflops=1.0, cublas_ms=1.0, triton_config=config, triton_ms=time_ms,
                  torch_version="sim", triton_version="sim", cuda_version="sim", trials=trials)


def simulated_worker(url: str, name: str, trials: int, beat_every: int, start: object, out: object) -> None:
    import optuna

    from db import Store
    from db.queue import JobQueue

    optuna.logging.set_verbosity(optuna.logging.ERROR)
    counter = [0]
    store = Store(url)
    _count_statements(store._engine, counter)
    storage = optuna.storages.RDBStorage(url)
    _count_statements(storage.engine, counter)
    queue = JobQueue(store)
    start.wait()
    jobs = trials_done = 0
    claim_s = study_s = finish_s = 0.0
    began = time.perf_counter()
    while True:
        t0 = time.perf_counter()
        job = queue.claim(name, DEVICE, lease_s=60)
        claim_s += time.perf_counter() - t0
        if job is None:
            break
        t0 = time.perf_counter()
        study = optuna.create_study(study_name=f"{DEVICE}|matmul|{job.spec.problem_key}", storage=storage,
                                    sampler=optuna.samplers.RandomSampler(seed=job.id), load_if_exists=True)
        best = (float("inf"), {})
        for index in range(trials):
            trial = study.ask()
            config = {name_: trial.suggest_categorical(name_, values) for name_, values in SPACE.items()}
            value = 1.0 + (config["BLOCK_M"] * 7 + config["BLOCK_N"] * 3 + index) % 97 / 100.0  # instant "timing"
            study.tell(trial, value)
            best = min(best, (value, config), key=lambda pair: pair[0])
            if (index + 1) % beat_every == 0:
                queue.renew(job.id, name, 60)
        study_s += time.perf_counter() - t0
        t0 = time.perf_counter()
        store.put(_record(job.spec.problem_key, best[1], best[0], trials), on_conflict="replace")
        queue.finish(job.id, name)
        finish_s += time.perf_counter() - t0
        jobs += 1
        trials_done += trials
    out.put({"name": name, "jobs": jobs, "trials": trials_done, "statements": counter[0],
             "seconds": time.perf_counter() - began, "claim_s": claim_s, "study_s": study_s, "finish_s": finish_s})


def run_once(url: str, workers: int, jobs: int, trials: int, beat_every: int, server_cpu=None) -> dict:
    from db import Store
    from db.queue import JobQueue, JobSpec

    import optuna

    optuna.storages.RDBStorage(url).engine.dispose()  # Optuna's tables first: workers would race to make them
    with Store(url) as store:  # a fresh queue of `jobs` problems
        JobQueue(store).enqueue([JobSpec(DEVICE, "matmul", f"fp16:nn:{workers}w{i}x16x16", trials)
                                 for i in range(jobs)])
    context = multiprocessing.get_context("spawn")
    start, out = context.Event(), context.Queue()
    processes = [context.Process(target=simulated_worker, args=(url, f"sim{i}", trials, beat_every, start, out))
                 for i in range(workers)]
    for process in processes:
        process.start()
    time.sleep(2.0 + 0.05 * workers)  # let every worker import and connect before the clock starts
    cpu_before = server_cpu() if server_cpu else None
    began = time.perf_counter()
    start.set()
    results = [out.get(timeout=1800) for _ in processes]
    wall = time.perf_counter() - began
    for process in processes:
        process.join()
    time.sleep(0.5)  # the backends of the closed connections exit and are reaped
    server_s = server_cpu() - cpu_before if server_cpu else None
    done_jobs = sum(r["jobs"] for r in results)
    statements = sum(r["statements"] for r in results)
    total_trials = sum(r["trials"] for r in results)
    busy = sum(r["seconds"] for r in results)
    return {"workers": workers, "jobs": done_jobs, "trials": total_trials, "wall_s": wall,
            "claims_per_s": done_jobs / wall, "trials_per_s": total_trials / wall,
            "statements_per_s": statements / wall, "statements_per_trial": statements / max(total_trials, 1),
            "ms_per_trial_in_worker": 1000 * sum(r["study_s"] for r in results) / max(total_trials, 1),
            "ms_per_job_overhead": 1000 * sum(r["claim_s"] + r["finish_s"] for r in results) / max(done_jobs, 1),
            "worker_busy_s": busy, "server_cpu_s": server_s,
            "server_cpu_ms_per_trial": None if server_s is None else 1000 * server_s / max(total_trials, 1),
            "per_worker": results}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=None, help="database URL (default: a throw-away PostgreSQL on loopback)")
    parser.add_argument("--workers", default="1,4,16", help="comma-separated simulated worker counts")
    parser.add_argument("--jobs", type=int, default=64, help="jobs per run")
    parser.add_argument("--trials", type=int, default=20, help="trials per job")
    parser.add_argument("--beat-every", type=int, default=5, help="lease renewals: one per this many trials")
    parser.add_argument("--out", default=os.environ.get("OUT", "."), help="folder for fleet_load.json")
    args = parser.parse_args()
    server = None
    if args.db is None:
        from tests.pg_server import server_cpu_s, start_server

        server = start_server()
    rows = []
    try:
        for workers in [int(w) for w in args.workers.split(",")]:
            url = args.db or server.fresh_url()
            cpu = (lambda: server_cpu_s(server)) if server is not None else None
            rows.append(run_once(url, workers, args.jobs, args.trials, args.beat_every, cpu))
            r = rows[-1]
            print(f"workers {workers:>3}  jobs {r['jobs']:>4}  wall {r['wall_s']:7.2f} s  claims/s {r['claims_per_s']:7.2f}  "
                  f"trials/s {r['trials_per_s']:8.1f}  SQL/s {r['statements_per_s']:8.0f}  SQL/trial "
                  f"{r['statements_per_trial']:5.1f}  ms/trial in worker {r['ms_per_trial_in_worker']:6.1f}  "
                  f"ms/job overhead {r['ms_per_job_overhead']:6.1f}  server CPU ms/trial "
                  f"{r['server_cpu_ms_per_trial'] or float('nan'):5.2f}", flush=True)
    finally:
        if server is not None:
            server.stop()
    Path(args.out).mkdir(parents=True, exist_ok=True)
    report = {"command": " ".join(sys.argv), "date": datetime.now(timezone.utc).isoformat(),
              "host": os.uname().nodename, "cpus": os.cpu_count(), "rows": rows}
    (Path(args.out) / "fleet_load.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
