"""The fleet on one multi-GPU host: how `search --problems FILE --gpus ...` scales with 1, 2 and 4 GPUs, where
the time goes, and what a worker killed mid-job costs.

Phases (each fits one 10-minute GPU command; results accumulate as JSON under --out):
    scale   one `search` run per GPU count of --counts, in the order given (pass 1,2,4 once and 4,2,1 once:
            alternating the order shows what the order costs). Each run starts from an empty database and an
            empty Triton compile cache (one cache shared by that run's workers), so no run profits from another;
            an untimed one-problem run first warms the machine once (--no-warm-up: measure a fresh machine).
    kill    `search` on --gpus (default 0,1), and SIGKILL to one busy worker once --kill-after jobs are done:
            the other finishes everything, the killed job resumes its study, nothing is stored twice.
    report  the table: wall time and speed-up per GPU count (each run and the median), where the time went
            (start-up to the first claim, jobs, idle workers, the last job running alone, exit), the order of
            the jobs replayed from their measured durations (file order against largest first), and the kill
            check. Writes --out/report.json.

The problems are the GEMMs a patched --model runs per decoder layer (query/key/value, output, gated MLP, down
projection; benchmarks/corpus/models.json), at each --tokens row count: what record mode sees when the model
serves decode batches and prompts. Qwen2.5-7B at the 8 default row counts gives 32 problems.

--pg starts a PostgreSQL server on loopback (tests/pg_server.py; PG_BIN names its binaries' folder) and gives
each run a fresh database on it; without it each run has a fresh SQLite file.

GPU command (4 GPUs, PostgreSQL):
    python scripts/fleet_bench.py --phase scale --counts 1,2,4 --pg --out $OUT/fleet
    python scripts/fleet_bench.py --phase report --out $OUT/fleet
CPU dry run (tiny shapes under the interpreter, to check the script): add --cpu-dry-run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import threading
import time
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

CPU_SHAPES = ("16x32x32", "32x16x32", "16x16x32", "32x32x16", "16x32x16", "32x16x16")
DEFAULT_TOKENS = "1,4,8,16,32,64,128,512"
READY = re.compile(r"ready ([\d.]+) s after its start")
PHASES = re.compile(r"ready [\d.]+ s after its start \(([^)]*)\)")
PHASE = re.compile(r"([a-z ]+?) ([\d.]+) s")
STATS = re.compile(r"sampler ([\d.]+) s, waiting for compiles ([\d.]+) s, timing ([\d.]+) s, head-to-head ([\d.]+) s")


# ---------------------------------------------------------------------------------------------- problems

def model_problems(model: str, tokens: list[int]) -> list[str]:
    """'kernel key' lines: the GEMMs a patched ``model`` runs per decoder layer, at each row count."""
    from tuner import corpus

    def of(entries, layers: set[str] | None = None) -> list[tuple[str, int, int]]:
        found = {}
        for entry in entries:
            if entry.model == model and (layers is None or layers & set(entry.layers)):
                (_, n, k), = entry.problem.shapes
                found[(entry.problem.kernel, n, k)] = None
        return list(found)

    biased = of(corpus.bias_entries("all"))
    shapes = (biased or of(corpus.qkv_entries("all"))) + of(corpus.entries("all"), {"o_proj", "down_proj"}) \
        + of(corpus.gated_entries("all"))
    if not shapes:
        raise SystemExit(f"--model {model}: not in benchmarks/corpus/models.json")
    return [f"{kernel} bf16:nt:{m}x{n}x{k}" for m in tokens for kernel, n, k in shapes]


def write_problems(out: Path, args: argparse.Namespace) -> Path:
    if args.cpu_dry_run:
        lines = [f"matmul fp16:nn:{shape}" for shape in CPU_SHAPES]
    else:
        lines = model_problems(args.model, [int(t) for t in args.tokens.split(",")])
    path = out / "problems.txt"
    path.write_text(f"# fleet_bench problems: {args.model} per decoder layer at {args.tokens} rows\n"
                    + "\n".join(lines) + "\n")
    return path


# ---------------------------------------------------------------------------------------------- databases

class Databases:
    """A fresh database URL per run: SQLite files under --out, or databases on one PostgreSQL server."""

    def __init__(self, out: Path, pg: bool) -> None:
        self.out, self.server = out, None
        if pg:
            from tests.pg_server import PgServer, find_bin

            folder = find_bin()
            if folder is None:
                raise SystemExit("--pg: no initdb/pg_ctl found; set PG_BIN to their folder (docs/FLEET.md)")
            self.server = PgServer(folder).start()

    def fresh(self, name: str) -> str:
        if self.server is not None:
            return self.server.fresh_url()
        db = self.out / f"{name}.db"
        for suffix in ("", "-wal", "-shm"):
            Path(f"{db}{suffix}").unlink(missing_ok=True)
        return f"sqlite:///{db}"

    def close(self) -> None:
        if self.server is not None:
            self.server.stop()


# ---------------------------------------------------------------------------------------------- runs

def search(out: Path, name: str, problems: Path, gpus: str, url: str, args: argparse.Namespace,
           kill_after: int | None = None) -> dict:
    """One `search` run with an empty compile cache; its wall time, the queue's account and the checks."""
    cache = out / f"triton-cache-{name}"
    shutil.rmtree(cache, ignore_errors=True)
    argv = [sys.executable, "-m", "tuner", "search", "--problems", str(problems), "--budget", str(args.trials),
            "--gpus", gpus, "--lease", str(args.lease), "--seed", "0", "--db", url]
    if args.cpu_dry_run:
        argv += ["--device", "cpu"]
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, TRITON_CACHE_DIR=str(cache),
               **({"TRITON_INTERPRET": "1"} if args.cpu_dry_run else {}))
    log_path = out / f"{name}.log"
    killed: dict = {}
    with log_path.open("w") as log:
        launched = time.time()
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        # Each line of the run and its workers stamped with the seconds since launch: where the time goes.
        stamping = threading.Thread(target=_stamp_lines, args=(process.stdout, log, launched), daemon=True)
        stamping.start()
        if kill_after is not None:
            threading.Thread(target=_kill_one, args=(url, kill_after, killed), daemon=True).start()
        code = process.wait()
        ended = time.time()
        stamping.join(timeout=30)
    shutil.rmtree(cache, ignore_errors=True)
    return {"name": name, "gpus": gpus, "workers": len(gpus.split(",")), "returncode": code,
            "wall_s": ended - launched, "killed": killed,
            "timeline": timeline(url, launched, ended, log_path.read_text()), **check(url, args)}


def _stamp_lines(lines, log, launched: float) -> None:
    for line in lines:
        log.write(f"{time.time() - launched:8.2f} {line}")
        log.flush()


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
        except Exception:  # noqa: BLE001 - the database may not be set up yet
            continue
        if busy:
            victim = busy[0]
            os.kill(victim.pid, signal.SIGKILL)
            killed.update(worker=victim.name, pid=victim.pid, job_id=victim.job_id, at=time.time())
            return


def _seconds(when: datetime | None, since: float) -> float | None:
    if when is None:
        return None
    if when.tzinfo is None:  # SQLite gives the stored UTC time back naive
        when = when.replace(tzinfo=timezone.utc)
    return when.timestamp() - since


def timeline(url: str, launched: float, ended: float, log_text: str) -> dict:
    """Where the run's wall time went, from the queue's timestamps (seconds after launch) and the workers' log."""
    from db import Store
    from db.queue import JobQueue

    with Store(url) as store:
        jobs = JobQueue(store).jobs()
    spans = [(job.worker or "?", _seconds(job.started_at, launched), _seconds(job.finished_at, launched),
              job.spec.kernel + " " + job.spec.problem_key) for job in jobs]
    spans = [s for s in spans if s[1] is not None and s[2] is not None]
    if not spans:
        return {}
    workers = sorted({s[0] for s in spans})
    last_finish = {w: max(s[2] for s in spans if s[0] == w) for w in workers}
    end_of_jobs = max(last_finish.values())
    first_claim = min(s[1] for s in spans)
    # With one worker nothing runs beside the last job: "alone" is the time the others sat idle waiting for it.
    others_done = max([t for w, t in last_finish.items() if t < end_of_jobs] or [end_of_jobs])
    busy = sum(s[2] - s[1] for s in spans)
    stats = [tuple(map(float, m)) for m in STATS.findall(log_text)]
    return {
        "first_claim_s": first_claim,  # process start, imports, CUDA, the database: before any job runs
        "end_of_jobs_s": end_of_jobs,
        "exit_s": (ended - launched) - end_of_jobs,
        "job_seconds": busy,  # summed over workers
        "idle_worker_s": len(workers) * (end_of_jobs - first_claim) - busy,
        "last_job_alone_s": end_of_jobs - others_done,
        "per_worker_first_claim_s": {w: min(s[1] for s in spans if s[0] == w) for w in workers},
        "jobs": [{"problem": s[3], "worker": s[0], "start_s": round(s[1], 2), "end_s": round(s[2], 2)}
                 for s in sorted(spans, key=lambda s: s[1])],
        # Each worker's start-up (spawned to taking jobs), as it printed it: the part of first_claim_s that is
        # the worker's own; the rest is the run opening the database and enqueueing.
        "worker_ready_s": [float(m) for m in READY.findall(log_text)],
        # and phase by phase (imports, device, waiting for the run, database), the longest worker's of each
        "worker_phases_s": start_phases(log_text),
        "log_sums_s": {"sampler": sum(s[0] for s in stats), "compile_wait": sum(s[1] for s in stats),
                       "timing": sum(s[2] for s in stats), "head_to_head": sum(s[3] for s in stats)},
    }


def outside_the_clocks(timeline: dict) -> float:
    """A run's job-seconds that no search's own clock counted: between a claim and its search's first ask (the
    search space narrowed to the problem, the study opened, warm starts read) and after its contests (the
    winners stored, the job finished)."""
    return timeline["job_seconds"] - sum(timeline["log_sums_s"].values())


def start_phases(log_text: str) -> dict[str, float]:
    """Each start-up phase's seconds, the most any worker of the run spent in it."""
    found: dict[str, float] = {}
    for line in PHASES.findall(log_text):
        for name, seconds in PHASE.findall(line):
            name = name.strip(", ")
            found[name] = max(found.get(name, 0.0), float(seconds))
    return found


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
        name = f"{record.kernel} {record.problem_key}"
        per_problem[name] = per_problem.get(name, 0) + 1
    trials = {}
    for job in jobs:
        problem = kernels.Problem.from_key(job.spec.kernel, job.spec.problem_key)
        study = optuna.load_study(study_name=study_name(device, problem), storage=storage)
        trials[f"{job.spec.kernel} {job.spec.problem_key}"] = len(measured_trials(study))
    names = [f"{j.spec.kernel} {j.spec.problem_key}" for j in jobs]
    return {"states": {s: sum(j.state == s for j in jobs) for s in ("queued", "running", "done", "failed")},
            "errors": {n: j.error for n, j in zip(names, jobs) if j.state == "failed"},
            "attempts": {n: j.attempts for n, j in zip(names, jobs) if j.attempts != 1},
            "records_per_problem_not_2": {k: v for k, v in per_problem.items() if v != len(kernels.MODES)},
            "problems_without_records": sorted(n for n in names if n not in per_problem),
            "studies_not_at_budget": {k: v for k, v in trials.items() if v != args.trials}}


def warm_up(out: Path, problems: Path, databases: Databases, args: argparse.Namespace) -> None:
    """One untimed `search` of the first problem on one GPU: what a machine does once and caches for every later
    run (the C++ cuBLAS path's build: a fresh H200 machine's first job timed for 24.5-26 s, 0.5-1.4 s later on 2026-11-28, docs/FLEET.md;
    the disk cache of torch's libraries) would otherwise fall on whichever timed run comes first, and the order
    of the runs would set their ratio."""
    first = next(line for line in problems.read_text().splitlines() if line and not line.startswith("#"))
    one = out / "warm-up-problem.txt"
    one.write_text(first + "\n")
    began = time.perf_counter()
    result = search(out, "warm-up", one, "0", databases.fresh("warm-up"),
                    argparse.Namespace(**{**vars(args), "trials": 2}))
    print(f"warm-up ({first}): {time.perf_counter() - began:.1f} s, {result['states']}", flush=True)


# ---------------------------------------------------------------------------------------------- report

def replay(durations: list[float], workers: int) -> float:
    """The makespan of jobs taken in this order by ``workers`` workers, each taking the next when free."""
    free = [0.0] * workers
    for duration in durations:
        free.sort()
        free[0] += duration
    return max(free)


def replay_by_kernel(jobs: list[tuple[str, float]], workers: int) -> float:
    """The makespan of ``jobs`` (problem, seconds; in claim order, one weight) under the queue's own claim rule
    (db/queue.py ``claim_order``): the jobs of the kernel whose finished jobs took longest first, a kernel with none
    finished before them, the claim order deciding within a kernel."""
    from db.queue import claim_order

    free = [0.0] * workers
    count = len(jobs)
    # The claim order as priorities of one weight: all below 1, the first highest.
    left = [(index, problem.split()[0], (count - index) / (count + 1)) for index, (problem, _) in enumerate(jobs)]
    finished: list[tuple[float, str, float]] = []  # (end, kernel, seconds)
    while left:
        worker = min(range(workers), key=free.__getitem__)
        now = free[worker]
        done: dict[str, list[float]] = {}
        for end, kernel, seconds in finished:
            if end <= now:
                done.setdefault(kernel, []).append(seconds)
        chosen = claim_order(left, {kernel: statistics.mean(times) for kernel, times in done.items()})[0]
        index, kernel, _ = next(item for item in left if item[0] == chosen)
        left = [item for item in left if item[0] != chosen]
        free[worker] = now + jobs[index][1]
        finished.append((free[worker], kernel, jobs[index][1]))
    return max(free)


def report(out: Path) -> dict:
    runs = [json.loads(p.read_text()) for p in sorted(out.glob("scale-*.json"))]
    runs.sort(key=lambda r: r["started"])
    print(f"{'run':<22} {'GPUs':>4} {'wall s':>7} {'to 1st claim':>12} {'ready':>5} {'jobs s':>7} {'idle s':>7} "
          f"{'alone s':>7} {'exit s':>6}  states")
    for run in runs:
        t = run["timeline"]
        ready = max(t.get("worker_ready_s") or [0.0])
        print(f"{run['name']:<22} {run['workers']:>4} {run['wall_s']:7.1f} {t.get('first_claim_s', 0):12.1f} {ready:5.1f} "
              f"{t.get('job_seconds', 0):7.1f} {t.get('idle_worker_s', 0):7.1f} {t.get('last_job_alone_s', 0):7.1f} "
              f"{t.get('exit_s', 0):6.1f}  {run['states']}")
        if t.get("worker_phases_s"):
            print(f"{'':<22} worker start-up: " + ", ".join(f"{name} {seconds:.1f} s"
                                                          for name, seconds in t["worker_phases_s"].items()))
        if t.get("log_sums_s") and t.get("job_seconds"):
            print(f"{'':<22} job-seconds: " + ", ".join(f"{name} {seconds:.1f} s" for name, seconds in t["log_sums_s"].items())
                  + f", outside the searches' clocks {outside_the_clocks(t):.1f} s")
    by_count: dict[int, list[float]] = {}
    for run in runs:
        by_count.setdefault(run["workers"], []).append(run["wall_s"])
    result: dict = {"runs": [{k: v for k, v in r.items() if k != "timeline"} | {"timeline": {
        k: v for k, v in r["timeline"].items() if k != "jobs"}} for r in runs]}
    if 1 in by_count:
        one = statistics.median(by_count[1])
        result["speedup"] = {}
        for count, walls in sorted(by_count.items()):
            ratios = [round(one / w, 2) for w in walls]
            result["speedup"][count] = {"median_wall_s": statistics.median(walls), "speedup": round(one / statistics.median(walls), 2),
                                        "each": ratios}
            print(f"{count} GPU(s): median wall {statistics.median(walls):.1f} s, speed-up {one / statistics.median(walls):.2f}x "
                  f"(each run against the median 1-GPU wall: {ratios})")
        single = [r for r in runs if r["workers"] == 1 and r["timeline"].get("jobs")]
        if single:
            jobs = single[0]["timeline"]["jobs"]
            file_order = [j["end_s"] - j["start_s"] for j in jobs]
            largest = sorted(file_order, reverse=True)
            result["replay"] = {}
            for count in sorted(by_count):
                if count > 1:
                    result["replay"][count] = {"claim_order": round(replay(file_order, count), 1),
                                               "kernel_longest_first": round(replay_by_kernel(
                                                   [(j["problem"], j["end_s"] - j["start_s"]) for j in jobs], count), 1),
                                               "longest_first": round(replay(largest, count), 1),
                                               "perfect": round(sum(file_order) / count, 1)}
                    print(f"replayed on {count} workers from the 1-GPU run's job times: claim order "
                          f"{result['replay'][count]['claim_order']} s, the kernel that ran longest first "
                          f"{result['replay'][count]['kernel_longest_first']} s, longest first "
                          f"{result['replay'][count]['longest_first']} s, perfectly even {result['replay'][count]['perfect']} s")
    kill_path = out / "kill.json"
    if kill_path.exists():
        k = json.loads(kill_path.read_text())
        clean = (not k["attempts"] or set(k["attempts"].values()) == {2}) and not k["records_per_problem_not_2"] \
            and not k["problems_without_records"] and not k["studies_not_at_budget"] and k["states"]["queued"] == 0 \
            and k["states"]["running"] == 0 and k["states"]["failed"] == 0 and bool(k["killed"])
        result["kill"] = {**{key: k[key] for key in ("killed", "states", "attempts", "records_per_problem_not_2",
                                                   "problems_without_records", "studies_not_at_budget", "wall_s")},
                          "passed": clean}
        print(f"kill: {k['killed']}; jobs run twice {k['attempts']}; records not 2 per problem "
              f"{k['records_per_problem_not_2']}; missing {k['problems_without_records']}; studies not at budget "
              f"{k['studies_not_at_budget']}; states {k['states']} -> {'PASS' if clean else 'FAIL'}")
    (out / "report.json").write_text(json.dumps(result, indent=1, default=str))
    return result


# ---------------------------------------------------------------------------------------------- main

def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    parser.add_argument("--phase", required=True, choices=("scale", "kill", "report"))
    parser.add_argument("--counts", default="1,2,4", help="GPU counts of the scale phase, in order (default 1,2,4)")
    parser.add_argument("--model", default="Qwen2.5-7B", help="the model whose layers are the problems")
    parser.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"row counts (default {DEFAULT_TOKENS})")
    parser.add_argument("--trials", type=int, default=8, help="measured trials per problem (default 8)")
    parser.add_argument("--gpus", default="0,1", help="GPUs of the kill phase (default 0,1)")
    parser.add_argument("--lease", type=float, default=30.0, help="job lease in seconds (default 30)")
    parser.add_argument("--kill-after", type=int, default=4, help="kill a worker once this many jobs are done")
    parser.add_argument("--no-warm-up", action="store_true",
                        help="no untimed run first: measure what a fresh machine's first run pays as well")
    parser.add_argument("--pg", action="store_true", help="a PostgreSQL server on loopback (PG_BIN), not SQLite")
    parser.add_argument("--cpu-dry-run", action="store_true", help="tiny shapes under the interpreter")
    parser.add_argument("--out", default=os.environ.get("OUT", "fleet_bench_out"))
    args = parser.parse_args()
    if args.cpu_dry_run:
        os.environ["TRITON_INTERPRET"] = "1"  # before this process imports triton (check() reads the studies)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.phase == "report":
        report(out)
        return 0
    problems = write_problems(out, args)
    databases = Databases(out, args.pg)
    try:
        if args.phase == "kill":
            result = search(out, "kill", problems, args.gpus, databases.fresh("kill"), args, args.kill_after)
            (out / "kill.json").write_text(json.dumps(result, indent=1, default=str))
            print(json.dumps({k: v for k, v in result.items() if k != "timeline"}, default=str), flush=True)
            return 0
        if not args.no_warm_up:
            warm_up(out, problems, databases, args)
        for count in (int(c) for c in args.counts.split(",")):
            name = f"scale-{time.strftime('%H%M%S')}-{count}gpu"
            started = time.time()
            result = search(out, name, problems, ",".join(str(i) for i in range(count)), databases.fresh(name), args)
            result["started"] = started
            (out / f"{name}.json").write_text(json.dumps(result, indent=1, default=str))
            t = result["timeline"]
            print(f"{name}: {result['wall_s']:.1f} s, first claim {t.get('first_claim_s', 0):.1f} s, last job alone "
                  f"{t.get('last_job_alone_s', 0):.1f} s, {result['states']}", flush=True)
    finally:
        databases.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
