"""Scaling of the fleet on one host: tune the same problems with 1 and with N GPU workers, each from an
empty database with the same budget per problem, and report the wall-time ratio; then a run where one
worker is killed with SIGKILL mid-run, checked for lost or duplicated jobs and trials counted twice.

Phases (each fits one 10-minute GPU command; results accumulate as JSON under --out):
    one     `python -m tuner search --problems FILE --gpus 0` on a fresh database
    many    the same with `--gpus 0,1,...` (--gpus, default all visible)
    kill    as `many`, and SIGKILL to one busy worker once --kill-after jobs are done (lease --lease s)
    report  print the table: wall times, ratio, and the kill check
The problems are the first --count fp16 problems of the model corpus (benchmarks/corpus/models.json),
spread over its models and token counts; the file used is written to --out/problems.txt.

GPU command (2 GPUs):
    OUT=/tmp/fleet python scripts/fleet_bench.py --phase one && python scripts/fleet_bench.py --phase many \
        && python scripts/fleet_bench.py --phase kill && python scripts/fleet_bench.py --phase report
CPU dry run (tiny shapes under the interpreter, to check the script): add --cpu-dry-run.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CPU_SHAPES = ("16x32x32", "32x16x32", "16x16x32", "32x32x16", "16x32x16", "32x16x16")


def write_problems(out: Path, count: int, cpu: bool) -> Path:
    if cpu:
        lines = [f"matmul fp16:nn:{shape}" for shape in CPU_SHAPES[:count]]
    else:
        from tuner.corpus import corpus_problems

        fp16 = [p for p in corpus_problems("all") if p.dtype == "fp16"]
        step = max(1, len(fp16) // count)
        lines = [f"matmul {p.key}" for p in fp16[::step][:count]]
    path = out / "problems.txt"
    path.write_text("# fleet_bench problems: kernel problem-key\n" + "\n".join(lines) + "\n")
    return path


def search(out: Path, name: str, problems: Path, gpus: str, args: argparse.Namespace,
           kill_after: int | None = None) -> dict:
    """One `search` run on a fresh SQLite database; returns its wall time and the queue at the end."""
    db = out / f"{name}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    url = args.db_prefix + str(db) if not args.pg_url else args.pg_url
    argv = [sys.executable, "-m", "tuner", "search", "--problems", str(problems), "--budget", str(args.trials),
            "--gpus", gpus, "--lease", str(args.lease), "--seed", "0", "--db", url]
    if args.cpu_dry_run:
        argv += ["--device", "cpu"]
    env = dict(os.environ, PYTHONPATH=str(ROOT), **({"TRITON_INTERPRET": "1"} if args.cpu_dry_run else {}))
    log = open(out / f"{name}.log", "w")
    began = time.perf_counter()
    process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT)
    killed: dict = {}
    if kill_after is not None:
        threading.Thread(target=_kill_one, args=(url, kill_after, killed), daemon=True).start()
    code = process.wait()
    wall = time.perf_counter() - began
    return {"name": name, "gpus": gpus, "returncode": code, "wall_s": wall, "url": url, "killed": killed,
            **check(url, args)}


def _kill_one(url: str, after: int, killed: dict) -> None:
    """SIGKILL one busy worker once ``after`` jobs are done."""
    from db import Store
    from db.queue import JobQueue

    while True:
        time.sleep(1.0)
        try:
            with Store(url) as store:
                queue = JobQueue(store)
                if queue.counts()["done"] < after:
                    continue
                busy = [w for w in queue.workers() if w.state == "busy" and w.job_id is not None]
        except Exception:  # noqa: BLE001 - the database may not exist yet
            continue
        if busy:
            victim = busy[0]
            os.kill(victim.pid, signal.SIGKILL)
            killed.update(worker=victim.name, pid=victim.pid, job_id=victim.job_id, at=time.time())
            return


def check(url: str, args: argparse.Namespace) -> dict:
    """Every job finished once: states, attempts, records per problem, measured trials per study."""
    import optuna

    import kernels
    from db import Store
    from db.queue import JobQueue
    from tuner.search import measured_trials, study_name

    device = kernels.resolve_device("cpu") if args.cpu_dry_run else kernels.current_device()
    storage = optuna.storages.RDBStorage(url)
    with Store(url) as store:
        jobs = JobQueue(store).jobs()
        records = store.records()
    per_problem: dict[str, int] = {}
    for record in records:
        per_problem[record.problem_key] = per_problem.get(record.problem_key, 0) + 1
    trials = {}
    for job in jobs:
        problem = kernels.Problem.from_key(job.spec.kernel, job.spec.problem_key)
        study = optuna.load_study(study_name=study_name(device, problem), storage=storage)
        trials[job.spec.problem_key] = len(measured_trials(study))
    return {"states": {s: sum(j.state == s for j in jobs) for s in ("queued", "running", "done", "failed")},
            "attempts": {j.spec.problem_key: j.attempts for j in jobs if j.attempts != 1},
            "records_per_problem_not_2": {k: v for k, v in per_problem.items() if v != len(kernels.MODES)},
            "problems_without_records": sorted(j.spec.problem_key for j in jobs if j.spec.problem_key not in per_problem),
            "studies_not_at_budget": {k: v for k, v in trials.items() if v != args.trials}}


def report(out: Path) -> None:
    runs = {name: json.loads((out / f"{name}.json").read_text()) for name in ("one", "many", "kill")
            if (out / f"{name}.json").exists()}
    print(f"{'run':<6} {'gpus':<10} {'wall s':>8}  states")
    for name, run in runs.items():
        print(f"{name:<6} {run['gpus']:<10} {run['wall_s']:8.1f}  {run['states']}")
    if "one" in runs and "many" in runs:
        print(f"speed-up {runs['one']['wall_s'] / runs['many']['wall_s']:.2f}x with "
              f"{len(runs['many']['gpus'].split(','))} GPUs")
    if "kill" in runs:
        k = runs["kill"]
        clean = (not k["attempts"] or set(k["attempts"].values()) == {2}) and not k["records_per_problem_not_2"] \
            and not k["problems_without_records"] and not k["studies_not_at_budget"] and k["states"]["queued"] == 0 \
            and k["states"]["running"] == 0
        print(f"kill: {k['killed']}; jobs run twice {k['attempts']}; records not 2 per problem "
              f"{k['records_per_problem_not_2']}; missing {k['problems_without_records']}; studies not at budget "
              f"{k['studies_not_at_budget']} -> {'PASS' if clean else 'FAIL'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", required=True, choices=("one", "many", "kill", "report"))
    parser.add_argument("--count", type=int, default=40, help="problems (default 40)")
    parser.add_argument("--trials", type=int, default=8, help="measured trials per problem (default 8)")
    parser.add_argument("--gpus", default="all", help="GPUs of the many/kill runs (default all)")
    parser.add_argument("--lease", type=float, default=30.0, help="job lease in seconds (default 30)")
    parser.add_argument("--kill-after", type=int, default=5, help="kill a worker once this many jobs are done")
    parser.add_argument("--pg-url", default=None, help="run against this (empty) PostgreSQL database instead")
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes under the interpreter")
    parser.add_argument("--out", default=os.environ.get("OUT", "fleet_bench_out"))
    args = parser.parse_args()
    args.db_prefix = "sqlite:///"
    if args.cpu_dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before this process imports triton (check() reads the studies)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.phase == "report":
        report(out)
        return 0
    if args.cpu_dry_run:
        args.count = min(args.count, len(CPU_SHAPES))
    problems = write_problems(out, args.count, args.cpu_dry_run)
    if args.gpus == "all" and not args.cpu_dry_run:
        import torch

        args.gpus = ",".join(str(i) for i in range(torch.cuda.device_count()))
    elif args.gpus == "all":
        args.gpus = "0,1"
    gpus = "0" if args.phase == "one" else args.gpus
    result = search(out, args.phase, problems, gpus, args, args.kill_after if args.phase == "kill" else None)
    (out / f"{args.phase}.json").write_text(json.dumps(result, indent=1, default=str))
    print(json.dumps({k: v for k, v in result.items() if k != "url"}, default=str))
    return 0 if result["returncode"] in (0, 1) else 1


if __name__ == "__main__":
    sys.exit(main())
