"""How dispatch's fallback for untuned dense matmul problems does on problems it never saw.

Leave-one-model-out over the tuned part of the corpus (tuner/corpus.py): each problem P of the
database is treated as untuned, with a table of the records of the OTHER corpus models only (P's own
model would leak its other token counts and its fp16/bf16 sibling, which dispatch counts as near).
The real dispatch code (kernels/dispatch.py ``_untuned_choice``, which calls ``_host_bound_choice``
for eager calls) picks a Triton config or cuBLAS, and P's own quick-tune timings score the pick. The
tables shipped in the package are left out: they hold the very records being held out.

- cuBLAS: speed-up 1.0 (cuBLAS against itself);
- a Triton config C: P's ``{mode}_cublas_ms`` (study attr) / C's ``{mode}_ms`` on P, C found among
  P's trials in canonical form on P (records hold the portable form); "unknown" if P never timed C.

Alternative constants run the same code: ``dispatch_constants`` sets the module attributes that the
dispatch functions read at each call, and puts the shipped values back afterwards; no function is
copied or patched. ``HOST_BOUND_MS = 0`` turns ``_host_bound_choice`` off: it skips every record whose
``cublas_ms`` is above it, and a record it could take has ``cublas_ms > 0`` (dispatch._number).
"oracle" is the best of P's own portfolio or cuBLAS (an upper bound; the min over noisy timings
flatters it); "always cublas" is 1.0 everywhere.

The database is only read: a SQLite file is opened with ``mode=ro`` (a missing file is an error, not
a new empty database) and ``immutable=1``, so that SQLite leaves no ``-wal``/``-shm`` side files beside
it either (the file must not change while this runs; it is a finished tuning run's database).

    PYTHONPATH=. python scripts/fallback_eval.py [--db sqlite:///.qdb/h200/h200.db] [--modes eager,graph] \\
        [--device h200] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import math
import statistics
import sys
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import optuna
from sqlalchemy.engine import make_url

from db import Store
from db.store import as_url
from kernels import Config, DeviceInfo, Problem, dispatch, is_baseline
from kernels.gemm import MATMUL
from tuner import corpus

log = logging.getLogger(__name__)

DEFAULT_DB = "sqlite:///.qdb/h200/h200.db"
MODES = ("eager", "graph")
NEARS = (0.35, 0.5, 0.7, 1.0)
MARGINS = (0.02, 0.05, 0.10)
# A pick this far under cuBLAS is a loss beyond the run-to-run spread of a median (1-3%, dispatch.py).
LOSS = 0.97
# Per-block opt-in shared memory by compute capability (torch's shared_memory_per_block_optin on
# H100/H200); records do not store it, and it only prunes configs that would not compile.
SHARED_MEMORY_BYTES = {"9.0": 232_448}


@dataclass(frozen=True)
class Setting:
    """The constants of one simulated dispatch rule."""

    near: float  # the limit on the weight's shape (N, K): UNTUNED_NEAR_WEIGHTS
    margin: float
    host_bound: bool = True  # eager only: whether _host_bound_choice may answer

    @property
    def label(self) -> str:
        host = "" if self.host_bound else ", host-bound off"
        return f"near {self.near:g}, margin {self.margin:.0%}{host}"


SHIPPED = Setting(dispatch.UNTUNED_NEAR_WEIGHTS, dispatch.UNTUNED_WIN_MARGIN)


@dataclass(frozen=True)
class Measured:
    """One problem's own quick-tune timings: what a pick for it would have run at."""

    problem: Problem
    model: str
    cublas_ms: dict[str, float]  # mode -> the study's {mode}_cublas_ms
    times: dict[str, dict[Config, float]]  # mode -> canonical config on this problem -> median time


@dataclass(frozen=True)
class Outcome:
    problem: str
    source: str  # dispatch's Choice.source ("nearest:<key>", "eager-near:<key>", "cublas: ..."), or "own best"
    triton: bool
    speedup: float | None  # None: the pick was never timed on this problem
    config: str = "cublas"


@dataclass(frozen=True)
class Summary:
    mode: str
    label: str
    problems: int
    triton: int
    known: int
    unknown: int
    geomean: float
    under: int  # known outcomes under LOSS
    worst: list[Outcome]


@contextlib.contextmanager
def dispatch_constants(setting: Setting) -> Iterator[None]:
    """Run kernels.dispatch under ``setting``'s constants, restoring the shipped ones on the way out."""
    # The corpus's token counts are 4x apart, so its transfers change N or K only: the weights' limit is
    # the one tried, with the overall limit raised to it where it is wider.
    values = {"UNTUNED_NEAR_WEIGHTS": setting.near, "UNTUNED_NEAR": max(setting.near, dispatch.UNTUNED_NEAR),
              "UNTUNED_WIN_MARGIN": setting.margin,
              "HOST_BOUND_MS": dispatch.HOST_BOUND_MS if setting.host_bound else 0.0}
    saved = {name: getattr(dispatch, name) for name in values}
    try:
        for name, value in values.items():
            setattr(dispatch, name, value)
        yield
    finally:
        for name, value in saved.items():
            setattr(dispatch, name, value)


def readonly_url(url: str) -> str:
    """``url`` opened so that nothing can be written; a SQLite file that does not exist is an error."""
    url = as_url(url)  # a plain path means a SQLite file, as everywhere in the tuner
    parsed = make_url(url)
    database = parsed.database or ""
    if parsed.get_backend_name() != "sqlite" or database.startswith("file:"):
        return url  # a server, or a URI as the caller wants it: this script calls no write API either way
    if database in ("", ":memory:"):
        raise ValueError(f"--db {url} names no file; pass the tuner database, e.g. {DEFAULT_DB}")
    path = Path(database).absolute()
    if not path.is_file():
        raise ValueError(f"--db {url}: no database at {path}; pass an existing tuner database, e.g. {DEFAULT_DB}")
    return f"sqlite:///file:{path}?mode=ro&immutable=1&uri=true"


# The corpus part whose problems are evaluated: "tuned" to choose settings; "held_out" only to check a
# setting chosen on the tuned part (choosing on it would leave no unseen problems to judge by).
PART = {"part": "tuned"}


def tuned_models() -> dict[str, str]:
    """Problem key -> corpus model, for the part evaluated (the tuned part unless ``--part`` says otherwise)."""
    return {e.problem.key: e.model for e in corpus.entries(PART["part"])}


def load_records(url: str, device: str | None) -> tuple[DeviceInfo, list[tuple[str, dispatch._Entry]]]:
    """The device and its matmul records as dispatch loads them (``Dispatcher._load``), with their model."""
    store = Store(url, create=False)
    try:
        records = store.records(device=device, kernel=MATMUL.name)
    finally:
        store.close()
    names = sorted({(r.device_name, r.device_alias, r.compute_capability, r.sm_count) for r in records})
    if len(names) != 1:
        found = "; ".join(f"{n} ({a})" for n, a, _, _ in names) or "none"
        raise ValueError(f"matmul records of {len(names)} devices in the database ({found}); pass --device NAME")
    name, alias, capability, sms = names[0]
    if capability not in SHARED_MEMORY_BYTES:
        raise ValueError(f"{name} has compute capability {capability}; add its shared memory per block to "
                         "SHARED_MEMORY_BYTES in scripts/fallback_eval.py")
    info = DeviceInfo(name, alias, capability, sms, SHARED_MEMORY_BYTES[capability])
    models, entries, outside = tuned_models(), [], 0
    for record in records:
        fields = vars(record)
        if record.problem_key not in models:
            outside += 1  # no model to hold out with it: kept out of every table
            continue
        try:
            dispatch._check_plausible(fields)
            entries.append((models[record.problem_key], dispatch._entry(MATMUL, fields, "database")))
        except (ValueError, TypeError, KeyError) as exc:  # as Dispatcher._load skips them
            log.warning("skipping the %s record of %s: %s", record.mode, record.problem_key, exc)
    if outside:
        log.warning("%d records are of problems outside the corpus's %s part; left out", outside, PART["part"])
    return info, entries


def load_measured(url: str, device: DeviceInfo) -> list[Measured]:
    """Each corpus (tuned part) problem's study on ``device``: cuBLAS per mode and every ok trial's times."""
    storage = optuna.storages.RDBStorage(url, skip_table_creation=True)
    models, found = tuned_models(), []
    for study in storage.get_all_studies():
        parts = study.study_name.split("|")  # tuner.search.study_name: DEVICE|KERNEL|PROBLEM_KEY
        if len(parts) != 3 or parts[0] != device.name or parts[1] != MATMUL.name or parts[2] not in models:
            continue
        problem = Problem.from_key(MATMUL.name, parts[2])
        cublas = {m: float(study.user_attrs[f"{m}_cublas_ms"]) for m in MODES if study.user_attrs.get(f"{m}_cublas_ms")}
        times: dict[str, dict[Config, list[float]]] = {m: {} for m in MODES}
        for trial in storage.get_all_trials(study._study_id, deepcopy=False,
                                            states=(optuna.trial.TrialState.COMPLETE,)):
            attrs = trial.user_attrs  # as tuner/costmodel_data.py from_database reads them
            if attrs.get("status", "ok") != "ok" or attrs.get("repeat") or "config" not in attrs:
                continue
            config = MATMUL.space.canonical(Config.parse(str(attrs["config"])), problem)
            for mode in MODES:
                t = attrs.get(f"{mode}_ms")
                if isinstance(t, (int, float)) and math.isfinite(t) and t > 0:
                    times[mode].setdefault(config, []).append(float(t))
        # Two portfolio configs that fold to one launch on P are one kernel timed twice: take the median.
        medians = {m: {c: statistics.median(ts) for c, ts in by.items()} for m, by in times.items()}
        found.append(Measured(problem, models[parts[2]], cublas, medians))
    return sorted(found, key=lambda m: m.problem.key)


def table_without(entries: Sequence[tuple[str, dispatch._Entry]], model: str) -> dict[tuple[str, str], dispatch._Entry]:
    """Dispatch's table of records, as if ``model`` had never been tuned."""
    return {(e.problem.key, e.mode): e for m, e in entries if m != model}


def score(choice: dispatch.Choice, measured: Measured, mode: str) -> Outcome:
    """What ``choice`` would have run at on the measured problem, against cuBLAS there."""
    key = measured.problem.key
    if is_baseline(choice.config):
        return Outcome(key, choice.source, False, 1.0)
    time_ms = measured.times[mode].get(MATMUL.space.canonical(choice.config, measured.problem))
    return Outcome(key, choice.source, True, None if time_ms is None else measured.cublas_ms[mode] / time_ms,
                   str(choice.config))


def simulate(measured: Sequence[Measured], entries: Sequence[tuple[str, dispatch._Entry]], device: DeviceInfo,
             mode: str, setting: Setting) -> list[Outcome]:
    """Dispatch's pick for each problem in ``mode`` from the other models' records, scored."""
    outcomes = []
    with dispatch_constants(setting):
        for m in measured:
            if mode not in m.cublas_ms:
                continue
            choice = dispatch._untuned_choice(MATMUL, m.problem, device, mode, table_without(entries, m.model))
            outcomes.append(score(choice, m, mode))
    return outcomes


def oracle(measured: Sequence[Measured], mode: str) -> list[Outcome]:
    """The best of each problem's own portfolio, or cuBLAS where none beat it."""
    outcomes = []
    for m in measured:
        if mode not in m.cublas_ms or not m.times[mode]:
            continue
        config, best = min(m.times[mode].items(), key=lambda item: item[1])
        ratio = m.cublas_ms[mode] / best
        won = ratio > 1
        outcomes.append(Outcome(m.problem.key, "own best" if won else "cublas", won, max(ratio, 1.0),
                                str(config) if won else "cublas"))
    return outcomes


def always_cublas(measured: Sequence[Measured], mode: str) -> list[Outcome]:
    return [Outcome(m.problem.key, "cublas", False, 1.0) for m in measured if mode in m.cublas_ms]


def summarize(mode: str, label: str, outcomes: Sequence[Outcome]) -> Summary:
    known = [o for o in outcomes if o.speedup is not None]
    geomean = math.exp(statistics.fmean(math.log(o.speedup) for o in known)) if known else math.nan
    worst = sorted((o for o in known if o.triton), key=lambda o: o.speedup)[:3]
    return Summary(mode, label, len(outcomes), sum(o.triton for o in outcomes), len(known),
                   len(outcomes) - len(known), geomean, sum(o.speedup < LOSS for o in known), worst)


def evaluate(measured: Sequence[Measured], entries: Sequence[tuple[str, dispatch._Entry]], device: DeviceInfo,
             mode: str) -> tuple[list[Summary], dict[str, list[Outcome]]]:
    """Every setting of the grid in ``mode`` (host-bound on and off in eager), then oracle and always cuBLAS."""
    settings = [Setting(near, margin, host) for near in NEARS for margin in MARGINS
                for host in ((True, False) if mode == "eager" else (True,))]
    runs = {s.label: simulate(measured, entries, device, mode, s) for s in settings}
    runs["oracle (own portfolio)"] = oracle(measured, mode)
    runs["always cublas"] = always_cublas(measured, mode)
    return [summarize(mode, label, outcomes) for label, outcomes in runs.items()], runs


def best_setting(summaries: Sequence[Summary]) -> Summary:
    """The simulated setting with the fewest known outcomes under LOSS, then the best geomean."""
    simulated = [s for s in summaries if s.label.startswith("near")]
    return min(simulated, key=lambda s: (s.under, -s.geomean))


def markdown(summaries: Sequence[Summary]) -> str:
    lines = ["| setting | problems | triton | known | unknown | geomean | < 0.97 | worst 3 (problem <- source) |",
             "|---|---:|---:|---:|---:|---:|---:|---|"]
    for s in summaries:
        current = " (shipped)" if s.label == SHIPPED.label else ""
        worst = "; ".join(f"{o.problem} <- {o.source.split(':', 1)[-1]} {o.speedup:.2f}x" for o in s.worst)
        lines.append(f"| {s.label}{current} | {s.problems} | {s.triton} | {s.known} | {s.unknown} | "
                     f"{s.geomean:.4f} | {s.under} | {worst} |")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db", default=DEFAULT_DB, help="SQLAlchemy URL of a tuner database with its Optuna studies")
    parser.add_argument("--device", default=None, help="the device's records (name or alias), if several")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated: eager, graph")
    parser.add_argument("--json", default=None, help="write every summary and per-problem outcome here")
    parser.add_argument("--part", default="tuned", choices=("tuned", "held_out"),
                        help="the corpus part to evaluate; choose settings on tuned, check them on held_out")
    args = parser.parse_args(argv)
    PART["part"] = args.part
    if args.part != "tuned":
        print("fallback_eval: the held-out part checks a setting chosen on the tuned part; do not choose on it",
              file=sys.stderr)
    modes = [m for m in args.modes.split(",") if m]
    if not modes or any(m not in MODES for m in modes):
        parser.error(f"--modes {args.modes}: give a comma-separated subset of {', '.join(MODES)}")
    try:
        url = readonly_url(args.db)
        device, entries = load_records(url, args.device)
        measured = load_measured(url, device)
    except ValueError as exc:
        print(f"fallback_eval: {exc}", file=sys.stderr)
        return 2
    if not measured:
        print(f"fallback_eval: no study of a {args.part} corpus problem on {device.name} in {args.db}", file=sys.stderr)
        return 2
    models = sorted({m.model for m in measured})
    print(f"{device.name}: {len(measured)} problems of {len(models)} models ({', '.join(models)}), "
          f"{len(entries)} records; leave one model out")
    report: dict[str, object] = {"command": " ".join(sys.argv), "device": device.name, "modes": {}}
    for mode in modes:
        summaries, runs = evaluate(measured, entries, device, mode)
        print(f"\n### {mode}\n\n{markdown(summaries)}")
        best = best_setting(summaries)
        print(f"\nfewest under {LOSS}, then best geomean: {best.label} ({best.under} under, geomean "
              f"{best.geomean:.4f}, {best.unknown} unknown)")
        report["modes"][mode] = {"summaries": [asdict(s) for s in summaries],
                                 "outcomes": {label: [asdict(o) for o in os] for label, os in runs.items()}}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    return 0


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    sys.exit(main())
