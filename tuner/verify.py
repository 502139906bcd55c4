"""Check the stored winners of a GPU again, with the search's own check (kernels/_check.py ``check_config``).

A winner stored before the check grew stricter, or by an older kernel, ships in a table to every machine; this
re-runs each stored config of this GPU (the database's records and the shipped tables') on fresh check inputs
at its own problem, and says which fail. cuBLAS winners have nothing of ours to check. A config stored for
several records (both modes, the database and a table) is checked once per problem.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace

import torch

import kernels
from db import Record, Store, StoreError
from kernels import Config, DeviceInfo, Problem, alias_of, described_device, is_baseline
from kernels._check import check_config

from .workers import CheckPool, Precheck

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class StoredWinner:
    """One stored record's winner: where it is kept, and for what."""

    source: str  # "database" or the shipped table's device alias ("shipped h100")
    kernel: str
    problem_key: str
    mode: str
    config: Config


@dataclass(frozen=True)
class Verdict:
    winner: StoredWinner
    status: str  # "ok", "wrong_result", "error", ... (tuner.workers.Precheck), or "cublas"
    error: float | None = None  # the worst element in units of its bound
    reason: str = ""

    @property
    def failed(self) -> bool:
        return self.status not in ("ok", "cublas")


@dataclass(frozen=True)
class Tally:
    """Verdicts of one source's records of one kernel."""

    source: str
    kernel: str
    ok: int
    cublas: int
    failed: int
    worst: float | None  # the worst passing element over these records, in units of its bound


def tally(verdicts: list[Verdict]) -> list[Tally]:
    """One row per (source, kernel), in that order."""
    groups: dict[tuple[str, str], list[Verdict]] = {}
    for v in verdicts:
        groups.setdefault((v.winner.source, v.winner.kernel), []).append(v)
    rows = []
    for (source, kernel), group in sorted(groups.items()):
        errors = [v.error for v in group if v.status == "ok" and v.error is not None]
        rows.append(Tally(source, kernel, sum(v.status == "ok" for v in group),
                          sum(v.status == "cublas" for v in group), sum(v.failed for v in group),
                          max(errors) if errors else None))
    return rows


def stored_winners(device: DeviceInfo, url: str | None, shipped: bool = True,
                   kernel: str | None = None) -> list[StoredWinner]:
    """The winners stored for ``device``: the database's (``url``; none if there is no database there) and,
    with ``shipped``, those of the tables inside the package."""
    found = [_winner("database", r.kernel, r.problem_key, r.mode, r.config)
             for r in _database_records(url, device.name, kernel)]
    if shipped:
        for name in kernels.KERNELS if kernel is None else [kernel]:
            found += [_winner(f"shipped {raw.get('device_alias', device.alias)}", name, raw["problem_key"],
                              raw.get("mode", "graph"), raw["config"])
                      for raw in kernels.dispatch._shipped_records(device.name, name)]
    return found


def stored_devices(url: str | None, shipped: bool = True) -> list[DeviceInfo]:
    """Each GPU that has winners stored, under the alias it was stored with: in the database at ``url`` (none
    if there is no database there) and, with ``shipped``, in the tables inside the package; by name, the first
    description found."""
    found: dict[str, DeviceInfo] = {}

    def add(name: str, alias: str, capability: str, sm_count: int) -> None:
        if name != "cpu" and name not in found:
            found[name] = replace(described_device(name, capability, sm_count), alias=alias or alias_of(name))

    for r in _database_records(url):
        add(r.device_name, r.device_alias, r.compute_capability, r.sm_count)
    if shipped:
        for document in kernels.dispatch._shipped_documents():
            for raw in document.get("records", []):
                if isinstance(raw, dict) and isinstance(raw.get("device_name"), str):
                    add(raw["device_name"], str(raw.get("device_alias", "")), str(raw.get("compute_capability", "")),
                        int(raw.get("sm_count", 0)))
    return sorted(found.values(), key=lambda d: d.alias)


def _database_records(url: str | None, device: str | None = None, kernel: str | None = None) -> list[Record]:
    """The records of the database at ``url`` (of ``device`` and ``kernel`` where given); none where the default
    database does not exist yet. A database the user named must be there."""
    try:
        with Store(url, create=False) as store:
            return store.records(device=device, kernel=kernel) if store.exists() else []
    except StoreError as exc:
        if url is not None:
            raise
        log.info("no default database (%s): the shipped tables alone", exc)
        return []


def _winner(source: str, kernel: str, key: str, mode: str, config: dict) -> StoredWinner:
    return StoredWinner(source, kernel, key, mode, Config.from_dict(config))


def verify(device: DeviceInfo, url: str | None = None, shipped: bool = True, kernel: str | None = None,
           workers: int = 0, seed: int = 0) -> list[Verdict]:
    """The verdict on every winner stored for ``device`` (``stored_winners``), checked on this machine."""
    return verify_winners(stored_winners(device, url, shipped, kernel), device, workers, seed)


def verify_winners(winners: list[StoredWinner], device: DeviceInfo, workers: int = 0, seed: int = 0) -> list[Verdict]:
    """Each winner's verdict, in their order: its config checked at its problem on this machine (on a GPU by
    ``workers`` compile-and-check processes in parallel, as the search's; 0: in this process)."""
    cases: dict[tuple[str, str, Config], int] = {}
    for w in winners:
        if not is_baseline(w.config):
            cases.setdefault((w.kernel, w.problem_key, w.config), len(cases))
    order = [(Problem.from_key(k, key), config) for k, key, config in cases]
    log.info("checking %d distinct stored config(s) of %d record(s) on %s", len(order), len(winners), device.name)
    if workers and not device.is_cpu:
        with CheckPool(workers=workers) as pool:
            checked = pool.check_each(order, seed)
    else:
        checked = [_check_here(problem, config, device, seed + i) for i, (problem, config) in enumerate(order)]
    verdicts = []
    for w in winners:
        if is_baseline(w.config):
            verdicts.append(Verdict(w, "cublas"))
            continue
        result = checked[cases[(w.kernel, w.problem_key, w.config)]]
        verdicts.append(Verdict(w, result.status, result.rel_error, result.reason))
    return verdicts


def _check_here(problem: Problem, config: Config, device: DeviceInfo, seed: int) -> Precheck:
    from .bench import _classify, _first_line, wrong_result_reason

    torch_device = torch.device("cpu") if device.is_cpu else torch.device("cuda", torch.cuda.current_device())
    try:
        verdict = check_config(kernels.get_kernel(problem.kernel), problem, config, torch_device, seed)
    except Exception as exc:  # a stored config that no longer runs is a failure to report, not a crash
        return Precheck(_classify(exc), reason=f"{type(exc).__name__}: {_first_line(exc)}")
    if not verdict.ok:
        return Precheck("wrong_result", verdict.error, wrong_result_reason(verdict))
    return Precheck("ok", verdict.error)
