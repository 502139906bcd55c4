"""The CLI's subcommands, one library call each; imported only after the device is set up."""

from __future__ import annotations

import argparse
import itertools
import math

import optuna

import kernels
from db import Record, Store, StoreError, export_records, load_document
from db.store import check_on_conflict

from . import suites
from .errors import UserError
from .search import SAMPLERS, Budget, Progress, SearchStats, make_sampler
from . import fleet_commands
from .fleet import WorkerHooks
from .fleet_commands import (check_size, problems_from_file, recorded_problems, search_through_queue,
                             start_gpu_workers)
from .gpu_workers import gpu_list, lease_seconds, phase_done, wait_for_go
from .workers import DEFAULT_AHEAD, search_workers, take_pool
from db.queue import Job, JobQueue, JobSpec


def cmd_devices(args: argparse.Namespace) -> int:
    import torch

    if not torch.cuda.is_available():
        print("no GPU visible; `--device cpu` runs the pipeline under Triton's interpreter")
        return 0
    for index in range(torch.cuda.device_count()):
        info = kernels.current_device(f"cuda:{index}")
        print(f"cuda:{index}  {info.name}  alias={info.alias}  sm_{info.compute_capability.replace('.', '')}  "
              f"{info.sm_count} SMs  {info.shared_memory_bytes // 1024} KiB shared memory per block")
    return 0


def _problems(args: argparse.Namespace, device: kernels.DeviceInfo) -> list[kernels.Problem]:
    spec = kernels.get_kernel(args.kernel or "matmul")
    if getattr(args, "corpus", None):
        if spec.name != "matmul" or args.shape or args.layout:
            raise UserError("--corpus names matmul problems of its own (layout nt); drop --kernel, --shape and --layout")
        from .corpus import corpus_problems
        try:
            found = corpus_problems(args.corpus)
        except ValueError as exc:
            raise UserError(f"--corpus {args.corpus}: {exc}") from None
        chosen = [p for p in found if not args.dtype or p.dtype in args.dtype]
        if not chosen:
            raise UserError(f"--corpus {args.corpus} has no problem of --dtype {', '.join(args.dtype)}; its dtypes "
                            f"are {', '.join(sorted({p.dtype for p in found})) or 'none'}")
        return chosen
    dtypes = args.dtype or ["fp16"]
    layouts = args.layout or ["nn"]
    if args.shape:
        shapes = args.shape
    elif spec.name == "grouped_matmul":
        shapes = tuple((suites.GROUPS_CPU if device.is_cpu else suites.GROUPS_GPU).values())
    elif spec.name in ("moe_matmul", "moe_gated_matmul"):  # the gated one's N: the output's width
        shapes = tuple((suites.MOE_CPU if device.is_cpu else suites.MOE_GPU).values())
    else:
        shapes = suites.DENSE_CPU if device.is_cpu else suites.DENSE_GPU
    problems = []
    for dtype, layout, text in itertools.product(dtypes, layouts, shapes):
        if dtype not in spec.dtypes:
            raise UserError(f"{spec.name} does not take --dtype {dtype}; it takes {', '.join(spec.dtypes)}")
        key = f"{dtype}:{layout}:{text}"
        try:
            problem = kernels.Problem.from_key(spec.name, key)
        except ValueError:
            raise UserError(f"--shape {text!r} must be MxNxK with integers >= 0 (groups: join with '+'), "
                            f"--layout one of nn, nt, tn, tt; got {key!r}") from None
        try:
            spec.check_problem(problem)
            check_size(problem)
        except ValueError as exc:
            raise UserError(f"--shape {_short_key(text)}: {exc}") from None
        problems.append(problem)
    return problems


def _check_search_args(args: argparse.Namespace) -> Budget:
    """Every flag of ``search`` that can be checked alone, before anything is opened; returns the budget."""
    if args.sampler not in SAMPLERS:
        raise UserError(f"--sampler {args.sampler} is not one of {', '.join(SAMPLERS)}")
    if args.seed is not None and not 0 <= args.seed < 2 ** 32:
        raise UserError(f"--seed {args.seed} must be an integer from 0 to {2 ** 32 - 1}")
    try:
        make_sampler(args.sampler, args.seed)  # a sampler's missing package, before any problem is queued
    except (ValueError, ImportError) as exc:
        raise UserError(str(exc) if str(exc).startswith("--sampler") else f"--sampler {args.sampler}: {exc}") from None
    if args.trials < 1:
        raise UserError(f"--trials {args.trials} must be at least 1")
    if args.timeout is not None and not (math.isfinite(args.timeout) and args.timeout > 0):
        raise UserError(f"--timeout {args.timeout:g} must be a finite number of seconds above 0 "
                        "(leave it out for no time limit)")
    if args.ahead < 1:
        raise UserError(f"--ahead {args.ahead} must be at least 1")
    if args.eager_passes < 1:
        raise UserError(f"--eager-passes {args.eager_passes} must be at least 1 (the deciding contest counts)")
    lease_seconds(args)
    chooser = "--recorded" if args.recorded else "--problems" if args.problems else None
    if args.recorded and args.problems:
        raise UserError("--recorded and --problems each name the problems to tune; pass one of them")
    given = [flag for flag, value in (("--shape", args.shape), ("--corpus", args.corpus), ("--kernel", args.kernel),
                                      ("--dtype", args.dtype), ("--layout", args.layout)) if value]
    if chooser and given:
        raise UserError(f"{chooser} names the problems to tune, and {', '.join(given)} would be ignored; "
                        f"drop {' and '.join(given)} or {chooser}")
    gpu_list(args)
    return parse_budget(args.budget) if args.budget else Budget(args.trials, args.timeout)


def cmd_search(args: argparse.Namespace) -> int:
    if args.kernel and ":" in args.kernel:  # a user kernel, MODULE:NAME (kernels.autotune)
        return _search_user_kernel(args)
    budget = _check_search_args(args)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = kernels.resolve_device("cpu" if args.device == "auto" and _no_gpu() else args.device)
    spec = kernels.get_kernel(args.kernel or "matmul")
    # Named problems are checked before the database is opened: a typo creates no file.
    named = (problems_from_file(args.problems) if args.problems
             else _recorded(args.db, device) if args.recorded else (_problems(args, device), None))
    if not named[0]:
        return 0
    in_process = device.is_cpu or args.workers == 0 or args.gpus
    pool = take_pool(getattr(args, "early_pool", None), not in_process, args.workers or search_workers(args.ahead))
    workers = start_gpu_workers(args)  # likewise: each GPU's worker starts up while this run enqueues
    try:
        with _open_store(args.db) as store:
            problems, priorities = named
            kinds = sorted({p.kernel for p in problems})
            print(f"tuning {len(problems)} {'/'.join(kinds) or spec.name} problem(s) on {device.name} "
                  f"({device.alias}) into {store.url}", flush=True)
            hooks = _print_hooks(store)
            hooks.tune_options["pool"] = pool
            jobs = search_through_queue(args, store, device, problems, priorities, budget, hooks, workers)
    finally:
        if pool:
            pool.close()
        if workers:
            workers.stop()
    kernels.clear_cache()
    failed = [job for job in jobs if job.state == "failed"]
    unfinished = [job for job in jobs if job.state in ("queued", "running")]
    if unfinished:
        print(f"{len(unfinished)} problem(s) are still queued or running on other workers: "
              "`python -m tuner status` shows them")
    if failed:
        # Each job's own error: no correct config, or what else stopped it (an unknown kernel, a crash).
        print(f"{len(failed)} problem(s) failed:")
        for job in failed:
            print(f"  {job.spec.kernel} {job.spec.problem_key}: {job.error or 'no error recorded'}")
        # A lost timing worker or a crash mid-contest says nothing of what is kept: the studies are, and a rerun
        # queues the failed jobs again.
        print("each study keeps every trial measured: where a search stopped on a crash or a lost worker, run the "
              "same command again to resume them (a 'no config ran correctly' says its own way out)")
        return 1
    return 0


def _search_user_kernel(args: argparse.Namespace) -> int:
    """``search --kernel MODULE:NAME --recorded | --problems FILE``: the keys of a ``kernels.autotune`` kernel."""
    from .autotune_search import keys_from_file, load_kernel, recorded_keys, search_kernel

    given = [flag for flag, value in (("--shape", args.shape), ("--dtype", args.dtype), ("--layout", args.layout),
                                      ("--corpus", args.corpus)) if value]
    if given:
        raise UserError(f"{' and '.join(given)} apply to the tuner's own kernels; a user kernel ({args.kernel}) takes "
                        "its keys from --recorded or --problems FILE")
    if bool(args.recorded) == bool(args.problems):
        raise UserError(f"--kernel {args.kernel}: give --recorded or --problems FILE (a JSON list of key objects)")
    tuner = load_kernel(args.kernel)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = kernels.resolve_device("cpu" if args.device == "auto" and _no_gpu() else args.device)
    if args.problems:
        keys = keys_from_file(args.problems)
    else:
        try:
            with Store(args.db, create=False) as reader:
                keys = recorded_keys(reader, tuner, device)
        except StoreError as exc:
            raise UserError(str(exc)) from None
    if not keys:
        print(f"nothing recorded for {tuner.name} on {device.alias} is left untuned; record with TUNER_AUTOTUNE=record")
        return 0
    if args.gpus:
        return _search_user_kernel_on_gpus(args, tuner.name, keys, device)
    with _open_store(args.db) as store:
        print(f"tuning {len(keys)} key(s) of {tuner.name} on {device.name} ({device.alias}) into {store.url}")

        def done(outcome) -> None:
            if outcome.record is not None:
                print(f"  {outcome.key.text}: {outcome.record.time_ms:.4f} ms, "
                      f"{kernels.Config.from_dict(outcome.record.config)} ({outcome.record.trials} trials)")
            else:
                print(f"  {outcome.key.text}: failed: {outcome.error}")

        outcomes = search_kernel(tuner, args.kernel, keys, store, device, trials=args.trials, seed=args.seed,
                                 isolated=args.workers != 0, on_done=done)
    return 1 if any(o.record is None for o in outcomes) else 0


def _search_user_kernel_on_gpus(args: argparse.Namespace, name: str, keys: list, device: kernels.DeviceInfo) -> int:
    """A user kernel's keys as the fleet's jobs (kernel MODULE:NAME, problem the key's text), worked off by one
    worker per GPU, as the tuner's own problems are: a killed worker's key resumes its study elsewhere."""
    lease_seconds(args)
    workers = start_gpu_workers(args)
    try:
        with _open_store(args.db) as store:
            print(f"tuning {len(keys)} key(s) of {name} on {device.name} ({device.alias}) into {store.url}", flush=True)
            queue = JobQueue(store)
            specs = [JobSpec(device.name, args.kernel, key.text, args.trials, None, {"seed": args.seed},
                             float(len(keys) - index)) for index, key in enumerate(keys)]
            ids = set(queue.enqueue(specs))
            workers.watch(queue, ids)
            jobs = [job for job in queue.jobs() if job.id in ids]
    finally:
        workers.stop()
    for job in jobs:
        print(f"  {job.spec.problem_key}: {job.state}" + (f": {job.error}" if job.error else ""))
    return 0 if all(job.state == "done" for job in jobs) else 1


def _recorded(url: str | None, device: kernels.DeviceInfo) -> tuple[list[kernels.Problem], list[float]]:
    """What record mode left untuned, read without creating the database (nothing to tune creates nothing)."""
    try:
        with Store(url, create=False) as store:
            problems, priorities = recorded_problems(store, device)
    except StoreError as exc:
        raise UserError(str(exc)) from None
    if not problems:
        print(f"nothing recorded on {device.alias} is left untuned; record a workload with TUNER_RECORD=1")
    return problems, priorities


def _print_hooks(store: Store) -> WorkerHooks:
    """The CLI's view of a worker: a line per job, its trials, and its winners."""
    claimed = [0]

    def on_claim(job: Job) -> None:
        claimed[0] += 1
        again = f" (attempt {job.attempts}, resuming its study)" if job.attempts > 1 else ""
        print(f"[{claimed[0]}] {job.spec.kernel} {job.spec.problem_key}{again}", flush=True)

    def on_done(job: Job, record: Record) -> None:
        print(f"  graph winner: {_winner_text(record)}", flush=True)
        eager = store.get(record.device_name, record.kernel, record.problem_key, "eager")
        if eager is not None:
            print(f"  eager winner: {_winner_text(eager)}", flush=True)

    def on_fail(job: Job, error: str) -> None:
        print(f"  no winner: {error}", flush=True)

    return WorkerHooks(on_claim, on_done, on_fail,
                       tune_options={"on_trial": _print_progress, "on_finish": _print_stats})


def cmd_worker(args: argparse.Namespace) -> int:
    phase_done("imports")
    lease_seconds(args)  # before the database is opened: a bad flag creates nothing
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    device = kernels.resolve_device("cpu" if args.device == "auto" and _no_gpu() else args.device)
    phase_done("device")
    # A job may carry a larger --ahead than the default; `search --gpus` passes its own as --workers.
    pool = take_pool(getattr(args, "early_pool", None), not (device.is_cpu or args.workers == 0),
                     args.workers or search_workers(DEFAULT_AHEAD))
    try:
        if args.after_go:
            if not wait_for_go():
                return 0  # the run that started this worker stopped before it needed it
            phase_done("waiting for the run")
        with _open_store(args.db) as store:
            phase_done("database")
            hooks = _print_hooks(store)
            hooks.tune_options["pool"] = pool
            return fleet_commands.cmd_worker(args, device, store, hooks)
    finally:
        if pool:
            pool.close()


def cmd_status(args: argparse.Namespace) -> int:
    # Reads only: a missing database is an error and an old one is left unmigrated (no jobs in it).
    with _open_reader(args.db) as store:
        return fleet_commands.cmd_status(args, store)


def parse_budget(values: list[str]) -> Budget:
    """``--budget 40`` (trials), ``--budget 30s`` (seconds), or both; a seconds-only budget has no trial cap."""
    trials, seconds = None, None
    for text in values:
        number = text[:-1] if text.endswith("s") else text
        try:
            value = float(number) if text.endswith("s") else int(number)
        except ValueError:
            value = 0
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"--budget {text!r} must be a positive number of trials (40) or seconds (30s)")
        if text.endswith("s"):
            seconds = float(value)
        else:
            trials = int(value)
    return Budget(trials if trials is not None else 1_000_000, seconds)


def _no_gpu() -> bool:
    import torch

    return not torch.cuda.is_available()


def _print_progress(p: Progress) -> None:
    best = f"{p.best_ms:.4f} ms" if p.best_ms is not None else "-"
    print(f"  trial {p.trial}/{p.budget}  {p.status:<13} best {best}", flush=True)


def _print_stats(stats: SearchStats) -> None:
    print(f"  {stats.summary()}", flush=True)


def _winner_text(record: Record) -> str:
    config = kernels.Config.from_dict(record.config)
    speedup = f"  {record.speedup:.2f}x vs cuBLAS" if record.speedup and record.device_name != "cpu" else ""
    return f"{config}  {record.time_ms:.4f} ms  {record.tflops:.1f} TFLOP/s{speedup}"


def _open_store(url: str | None) -> Store:
    try:
        return Store(url)
    except StoreError as exc:
        raise UserError(str(exc)) from None


def _open_reader(url: str | None) -> Store:
    """The store for a command that only reads: refuses a database that is not there, creating nothing."""
    try:
        store = Store(url, create=False)
        if not store.exists():
            store.close()
            raise UserError(f"database {store.url} does not exist (no tuner_records table there); check "
                            "--db or TUNER_DB, or create it with `python -m tuner search` or `import`")
    except StoreError as exc:
        raise UserError(str(exc)) from None
    return store


def _print_table(rows: list[tuple[str, ...]]) -> None:
    """Rows in aligned columns, the last one (a config, of any length) left ragged."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths)) + "  " + row[-1])


def cmd_explain(args: argparse.Namespace) -> int:
    """What ``kernels.matmul`` (or the kernel named) would run for each problem on a GPU, and why: the record,
    a near one, the class's consensus or cuBLAS (docs/MODES.md, "How dispatch picks"). Reads only."""
    if ":" in args.kernel:
        return _explain_user_kernel(args)
    problems = _explain_problems(args)
    if args.db is not None:
        _open_reader(args.db).close()  # a mistyped --db is an error here, not a silent "no records"
    device = _explain_device(args)
    dispatcher = kernels.dispatch.Dispatcher(args.db, use_shipped=not args.no_shipped)
    modes = (kernels.EAGER, kernels.GRAPH) if args.mode == "both" else (args.mode,)
    print(f"# {device.name} ({device.alias}, {device.sm_count} SMs); records: "
          f"{'--db and ' if args.db else 'the default database (if any) and '}"
          f"{'no shipped table' if args.no_shipped else 'the shipped tables'}")
    rows = [("kernel", "problem", "mode", "source", "config")]
    for problem in problems:
        spec = kernels.get_kernel(problem.kernel)
        for mode in modes:
            choice = dispatcher.choose(spec, problem, device, mode)
            rows.append((problem.kernel, problem.key, mode, choice.source, str(choice.config)))
    _print_table(rows)
    return 0


def _explain_user_kernel(args: argparse.Namespace) -> int:
    """``explain --kernel MODULE:NAME KEY...``: which config a ``kernels.autotune`` kernel runs for each key, and why."""
    from .autotune_search import keys_from_file, load_kernel

    tuner = load_kernel(args.kernel)
    if args.db is not None:
        _open_reader(args.db).close()
        tuner.db = args.db
    keys = keys_from_file(args.problems) if args.problems else [kernels.Key.parse(k) for k in args.keys]
    if not keys:
        raise UserError("name the keys: KEY arguments such as 'n_cols=781;float32,float32', or --problems FILE")
    # A user kernel runs where its caller runs: auto is this process's device, the interpreter's "cpu" included.
    device = kernels.current_device() if args.device.strip().lower() == "auto" else _explain_device(args)
    print(f"# {tuner.name} on {device.name} ({device.alias}); source hash and triton {tuner.stamp}")
    rows = [("kernel", "key", "source", "config")]
    for key in keys:
        source, config = tuner.explain(key, device)
        rows.append((tuner.name, key.text, source, str(config)))
    _print_table(rows)
    return 0


def _explain_problems(args: argparse.Namespace) -> list[kernels.Problem]:
    if not (args.keys or args.corpus or args.problems):
        raise UserError("name the problems: KEYs (e.g. bf16:nt:8x4096x4096), --corpus PART or --problems FILE")
    try:
        spec = kernels.get_kernel(args.kernel)
    except (KeyError, ValueError) as exc:
        raise UserError(f"--kernel {args.kernel}: {exc}") from None
    problems = []
    for key in args.keys:
        try:
            problem = kernels.Problem.from_key(spec.name, key)
            spec.check_problem(problem)
        except ValueError as exc:
            raise UserError(f"{key!r} is not a {spec.name} problem key (dtype:layout:MxNxK, e.g. "
                            f"bf16:nt:8x4096x4096): {exc}") from None
        try:
            check_size(problem, limits=False)  # dispatch runs any size, but a call with no work runs nothing
        except ValueError as exc:
            raise UserError(str(exc)) from None
        problems.append(problem)
    if args.corpus:
        from .corpus import corpus_problems
        try:
            problems += corpus_problems(args.corpus, spec.name, qkv=args.qkv)
        except ValueError as exc:
            raise UserError(f"--corpus {args.corpus} --kernel {spec.name}: {exc}") from None
    if args.problems:
        problems += problems_from_file(args.problems)[0]
    return problems


def _explain_device(args: argparse.Namespace) -> kernels.DeviceInfo:
    """This GPU for ``auto``; otherwise the GPU the shipped tables or the database have records of, by alias or
    canonical name."""
    import torch

    wanted = args.device.strip().lower()
    here = kernels.current_device() if torch.cuda.is_available() and not kernels.interpreter_enabled() else None
    if wanted == "auto" or (here is not None and wanted in (here.alias, here.name.lower())):
        if here is None:
            raise UserError(f"this machine sees no GPU: name one with --device ({_device_list(args)})")
        return here
    for name, (capability, sms) in _known_devices(args).items():
        if wanted in (kernels.alias_of(name), name.lower()):
            return kernels.described_device(name, capability, sms)
    raise UserError(f"--device {args.device}: no records of that GPU in the shipped tables or the database "
                    f"({_device_list(args)})")


def _device_list(args: argparse.Namespace) -> str:
    known = _known_devices(args)
    if not known:
        return "none has records: tune one with `python -m tuner search` or `import` a table"
    return "the GPUs with records: " + ", ".join(f"{kernels.alias_of(name)} ({name})" for name in known)


def _known_devices(args: argparse.Namespace) -> dict[str, tuple[str, int]]:
    """Canonical name -> (compute capability, SMs) of every GPU with records, shipped or in the database."""
    known = {} if args.no_shipped else {d["name"]: (str(d.get("compute_capability", "")), int(d.get("sm_count", 0)))
                                          for d in kernels.dispatch.shipped_devices() if "name" in d}
    try:
        with Store(args.db, create=False) as store:
            for record in store.records():
                known.setdefault(record.device_name, (record.compute_capability, record.sm_count))
    except StoreError:  # no default database: the shipped tables alone
        pass
    return known


def cmd_list(args: argparse.Namespace) -> int:
    if args.untuned:
        return _list_untuned(args)
    with _open_reader(args.db) as store:
        device, kernel = _stored_selection(store, args)
        records = store.records(device=device, kernel=kernel)
    if not records:
        print("no tuned problems" + (f" for {args.device}" if args.device else "")
              + (f" of {args.kernel}" if args.kernel else "")
              + "; run `python -m tuner search` first")
        return 0
    graph_baseline_ms = {r.key[:3]: r.cublas_ms for r in records if r.mode == kernels.GRAPH and r.cublas_ms}
    rows = [("device", "kernel", "problem", "mode", "ms", "TFLOP/s", "cuBLAS ms", "speed-up", "bound", "trials",
             "config")]
    for r in records:
        rows.append((r.device_alias, r.kernel, _short_key(r.problem_key), r.mode,
                     f"{r.time_ms:.4f}", f"{r.tflops:.1f}",
                     f"{r.cublas_ms:.4f}" if r.cublas_ms else "-", f"{r.speedup:.2f}x" if r.speedup else "-",
                     baseline_bound(r, graph_baseline_ms.get(r.key[:3])), str(r.trials),
                     str(kernels.Config.from_dict(r.config))))
    _print_table(rows)
    if any(row[8] == "host" for row in rows[1:]):
        print("bound host: the baseline's eager call is paced by the host, not the GPU, so that speed-up moves with "
              "the host's speed (0.79-1.35x of the stored figure between processes on the lent H100s; docs/BENCHMARKS.md)")
    return 0


def _stored_selection(store: Store, args: argparse.Namespace) -> tuple[str | None, str | None]:
    """--device and --kernel as the database spells them (a device by alias or canonical name, any case);
    UserError naming the known ones where the database has no record of either."""
    device = kernel = None
    if args.device is not None:
        wanted = args.device.strip().lower()
        stored = store.devices()
        device = next((alias for _, alias in stored if alias.lower() == wanted), None) or next(
            (name for name, _ in stored if name.lower() == wanted), None)
        if device is None:
            known = ", ".join(f"{alias} ({name})" for name, alias in stored) or "none: the database has no records"
            raise UserError(f"--device {args.device}: no records of that GPU in {store.url}; the GPUs with records: "
                            f"{known}")
    if args.kernel is not None:
        stored_kernels = sorted({r.kernel for r in store.records()})
        known = sorted(set(stored_kernels) | set(kernels.KERNELS))  # a kernel without records yet is no typo
        kernel = next((k for k in known if k.lower() == args.kernel.strip().lower()), None)
        if kernel is None:
            raise UserError(f"--kernel {args.kernel}: no such kernel; the kernels: {', '.join(known)} (with records "
                            f"in {store.url}: {', '.join(stored_kernels) or 'none'})")
    return device, kernel


def baseline_bound(record: Record, graph_baseline_ms: float | None) -> str:
    """What paces the baseline's call in an eager record (tuner.timing.baseline_paced_by: "host" or "gpu"),
    beside the problem's graph record's baseline time; "-" for a graph record or without the two times.
    Where the host paces it, the stored speed-up is a ratio to the host's speed at the time, and a process
    on a faster or slower host reads another."""
    from .timing import baseline_paced_by

    return baseline_paced_by(record.cublas_ms, graph_baseline_ms) if record.mode == kernels.EAGER else "-"


def _list_untuned(args: argparse.Namespace) -> int:
    from db.recorded import recorded

    device, kernel = (None if value is None else value.strip().lower() for value in (args.device, args.kernel))
    with _open_reader(args.db) as store:  # reads only: creates and migrates nothing
        found = [p for p in recorded(store, untuned=True)
                 if (kernel is None or p.key.kernel.lower() == kernel)
                 and (device is None or device in (p.key.device_name.lower(), _alias(p.key.device_name).lower()))]
    if not found:
        print("no recorded problem is left untuned; record a workload with TUNER_RECORD=1")
        return 0
    total = sum(p.work for p in found) or 1.0
    print(f"{'device':<28}  {'kernel':<14}  {'problem':<40}  {'calls':>10}  share of work")
    for p in found:
        print(f"{p.key.device_name:<28}  {p.key.kernel:<14}  {_short_key(p.key.problem_key):<40}  "
              f"{p.calls:>10}  {100 * p.work / total:5.1f}%")
    return 0


def _alias(device_name: str) -> str:
    try:
        return kernels.resolve_device(device_name).alias
    except ValueError:
        return device_name


def _short_key(key: str, width: int = 48) -> str:
    """Grouped keys list every GEMM (joined by '+'); a table row shows the start and the count."""
    return key if len(key) <= width else f"{key[:width - 16]}... ({key.count('+') + 1} GEMMs)"


def cmd_export(args: argparse.Namespace) -> int:
    with _open_reader(args.db) as store:
        device, kernel = _stored_selection(store, args)
        if not store.records(device=device, kernel=kernel):  # an empty export would replace the file
            raise UserError(f"no record in {store.url} matches" + (f" --device {args.device}" if device else "")
                            + (f" --kernel {args.kernel}" if kernel else "") + f"; {args.output} was not written "
                            "(`python -m tuner list` shows what is stored)")
        count = export_records(store, args.output, device=device, kernel=kernel)
    print(f"exported {count} record(s) to {args.output}")
    return 0


def cmd_import(args: argparse.Namespace) -> int:
    check_on_conflict(args.on_conflict)
    records = load_document(args.file, validate=kernels.validate_record)  # before the database is touched
    with _open_store(args.db) as store:
        summary = store.put_many(records, on_conflict=args.on_conflict)
        print(f"imported {args.file} into {store.url}: {summary.inserted} new, "
              f"{summary.replaced} replaced, {summary.kept} kept")
    return 0


def cmd_stamp(args: argparse.Namespace) -> int:
    from .stamp import STAMP_SETTLE_S, stamp_eager, stampable, store_stamps, summary

    settle_s = STAMP_SETTLE_S if args.settle_s is None else args.settle_s
    if not (math.isfinite(settle_s) and settle_s >= 0):  # nan would compare false and switch waiting off
        raise UserError(f"--settle-s {args.settle_s}: give the seconds a timing may wait for the host, a finite "
                        "number, 0 or more")

    if _no_gpu():
        raise UserError("stamp times the stored winners on the GPU they were tuned for, and this machine has "
                        "none; run it there (nothing was read or written)")
    if args.passes < 1:
        raise UserError(f"--passes {args.passes}: give 1 or more (timings per record, the median is stored)")
    device = kernels.current_device()
    with _open_reader(args.db) as store:
        records = store.records(device=device.name, kernel=args.kernel)
    if args.problem:
        records = [r for r in records if r.problem_key in args.problem]
    chosen = [r for r in records if r.mode == kernels.EAGER and stampable(r) is None]
    if not chosen:
        print(f"no stored eager record to stamp for {device.name}"
              + (f" ({args.kernel})" if args.kernel else "") + "; `python -m tuner list` shows what is stored")
        return 1
    print(f"stamping {len(chosen)} eager record(s) of {device.name}, {args.passes} pass(es)", flush=True)
    if settle_s > 0:
        from .timing import learn_host

        print(learn_host(), flush=True)

    def progress(pass_: int, index: int, stamp, note: str) -> None:
        if pass_ == args.passes:
            record = chosen[index - 1]  # the passes over ``chosen`` (those after them time cuBLAS stand-ins)
            shown = note or f"{record.kernel} {record.problem_key}  {stamp.was or 0:.3f}x stored -> {stamp.speedup:.3f}x"
            print(f"  [{index}/{len(chosen)}] {shown}", flush=True)

    stamps = stamp_eager(records, device, passes=args.passes, settle_s=settle_s, progress=progress)
    print(summary(stamps))
    if args.dry_run or not stamps:
        return 0
    with _open_store(args.db) as store:
        unchanged = store_stamps(store, stamps, records)
    if len(unchanged) < len(stamps):
        print(f"{len(stamps) - len(unchanged)} record(s) changed in the database while they were timed (a search or "
              "a worker stored them): left as they are now; stamp them again to time those")
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    """Check this GPU's stored winners again; name each that fails (docs/RELIABILITY.md, "The check")."""
    from .verify import tally, verify
    from .workers import default_workers

    if args.kernel is not None and args.kernel not in kernels.KERNELS:
        raise UserError(f"--kernel {args.kernel}: no such kernel; the kernels: {', '.join(sorted(kernels.KERNELS))}")
    if args.db is not None:
        _open_reader(args.db).close()  # a mistyped --db is an error, not "nothing stored"
    device = _verify_device(args.device, args.db, not args.no_shipped)
    workers = default_workers() if args.workers is None else args.workers
    print(f"verifying the stored winners of {device.name} ({'--db' if args.db else 'the default database'}"
          f"{'' if args.no_shipped else ' and the shipped tables'})", flush=True)
    verdicts = verify(device, args.db, shipped=not args.no_shipped, kernel=args.kernel, workers=workers)
    if not verdicts:
        print(f"no stored winner for {device.name}; nothing to verify")
        return 0
    failed = [v for v in verdicts if v.failed]
    rows = [("source", "kernel", "ok", "cuBLAS", "failed", "worst (1 = the bound)")]
    rows += [(t.source, t.kernel, str(t.ok), str(t.cublas), str(t.failed), "-" if t.worst is None else f"{t.worst:.3f}")
             for t in tally(verdicts)]
    _print_table(rows)
    for v in failed:
        w = v.winner
        print(f"FAILED {w.source} {w.kernel} {w.problem_key} {w.mode}: {w.config}\n  {v.status}: {v.reason}")
    print(f"{len(verdicts) - len(failed)} of {len(verdicts)} stored winner(s) pass; {len(failed)} fail")
    return 1 if failed else 0


def _verify_device(wanted: str, url: str | None, shipped: bool) -> kernels.DeviceInfo:
    """This machine's GPU, or the interpreter for cpu; or another GPU's stored winners where this GPU has its
    compute capability (the same compiled kernels, so the same numbers: the check holds, timings are not
    checked). Any other GPU is a user error."""
    import torch

    from .verify import stored_devices

    on_gpu = torch.cuda.is_available() and not kernels.interpreter_enabled()
    here = kernels.current_device() if on_gpu else kernels.CPU
    name = wanted.strip().lower()
    if name in ("auto", here.alias, here.name.lower()):
        return here
    stored = stored_devices(url, shipped)
    named = next((d for d in stored if name in (d.alias, d.name.lower())), None)
    if named is not None and on_gpu and named.compute_capability == here.compute_capability:
        print(f"checking the stored winners of {named.name} on this {here.name}: both compute capability "
              f"{here.compute_capability}, so the same compiled kernels compute the same numbers")
        return named
    if named is None:
        known = ", ".join(d.alias for d in stored) or "none"
        raise UserError(f"--device {wanted}: no stored winners of that GPU (GPUs with stored winners: {known}); "
                        "name one of them, or auto for this machine's")
    if on_gpu:
        raise UserError(f"--device {wanted}: its winners are for compute capability {named.compute_capability} "
                        f"and this machine's {here.name} is {here.compute_capability}; run it on that GPU, or on "
                        f"one of compute capability {named.compute_capability}")
    raise UserError(f"--device {wanted}: verify runs the stored winners on the GPU they are for (or one of its "
                    "compute capability), and this machine has no GPU; run it on that GPU, or pass --device cpu "
                    "for the records tuned under the interpreter")
