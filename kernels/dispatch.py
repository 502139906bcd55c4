"""Runtime lookup: the tuned config for (this device, this kernel, this problem).

Tables load once per process from the user's database (read only; ``TUNER_DB`` or the default
SQLite file) and from the tables shipped inside the package; the user's database wins. A problem
nobody tuned takes the config of the nearest tuned problem of the same kernel on the same device
(where that config is valid for it; the same shapes in the other of fp16/bf16 count as near), else
the kernel's default. Each resolved problem is cached, so
the hot path of a repeated call is one dict lookup.
"""

from __future__ import annotations

import json
import logging
import math
import threading
from dataclasses import dataclass
from importlib import resources
from typing import Hashable

import triton

from ._spec import BASELINE, Config, DeviceInfo, KernelSpec, Problem, is_baseline

log = logging.getLogger(__name__)

SHIPPED_TABLES = "tables"  # package folder of exported JSON documents, one per GPU family


@dataclass(frozen=True)
class _Entry:
    """One loaded record: its problem parsed once, at load, for the nearest-problem search."""

    problem: Problem
    config: Config
    source: str  # "database" or "shipped"


@dataclass(frozen=True)
class Choice:
    """What the dispatcher picked for a problem, and why (for ``explain`` and the tests)."""

    config: Config
    source: str  # "database", "shipped", "nearest:<problem key>", "default"


class Dispatcher:
    """The process-wide cache of tuned tables. Explicit, thread-safe and clearable."""

    def __init__(self, url: str | None = None, use_shipped: bool = True) -> None:
        self._url = url
        self._use_shipped = use_shipped
        self._lock = threading.Lock()
        self._tables: dict[tuple[str, str], dict[str, _Entry]] = {}
        self._resolved: dict[Hashable, Config] = {}

    @property
    def url(self) -> str | None:
        return self._url

    def configure(self, url: str | None = None, use_shipped: bool = True) -> None:
        """Point at another database (None: ``TUNER_DB`` or the default file) and forget every table."""
        with self._lock:
            self._url = url
            self._use_shipped = use_shipped
            self._tables.clear()
            self._resolved.clear()

    def clear(self) -> None:
        """Forget loaded tables and resolved problems; the next call reloads (after a new tuning run)."""
        with self._lock:
            self._tables.clear()
            self._resolved.clear()

    def cached(self, key: Hashable) -> Config | None:
        """The hot path: a config already resolved for this call signature, or None."""
        return self._resolved.get(key)

    def resolve(self, key: Hashable, spec: KernelSpec, problem: Problem, device: DeviceInfo) -> Config:
        config = self.choose(spec, problem, device).config
        self._resolved[key] = config
        return config

    def choose(self, spec: KernelSpec, problem: Problem, device: DeviceInfo) -> Choice:
        table = self._table(device, spec)
        exact = table.get(problem.key)
        if exact is not None:
            return Choice(exact.config, exact.source)
        best: tuple[float, str, Config] | None = None
        for key, entry in table.items():
            d = spec.transfer_distance(problem, entry.problem)
            if math.isfinite(d) and (best is None or d < best[0]) and self._fits(spec, entry.config, problem, device):
                best = (d, key, entry.config)
        if best is not None:
            return Choice(best[2], f"nearest:{best[1]}")
        return Choice(spec.default_config(problem, device), "default")

    @staticmethod
    def _fits(spec: KernelSpec, config: Config, problem: Problem, device: DeviceInfo) -> bool:
        return is_baseline(config) or spec.space.violation(config, problem, device) is None

    def _table(self, device: DeviceInfo, spec: KernelSpec) -> dict[str, _Entry]:
        table = self._tables.get((device.name, spec.name))
        if table is None:
            with self._lock:
                table = self._tables.get((device.name, spec.name))
                if table is None:
                    table = self._load(device, spec)
                    self._tables[(device.name, spec.name)] = table
        return table

    def _load(self, device: DeviceInfo, spec: KernelSpec) -> dict[str, _Entry]:
        table: dict[str, _Entry] = {}
        rows: list[tuple[str, dict, str, str]] = []  # (problem key, config, triton version, source)
        if self._use_shipped:
            rows += [(r.get("problem_key", ""), r.get("config") or {}, r.get("triton_version", ""), "shipped")
                     for r in _shipped_records(device.name, spec.name)]
        rows += [(r.problem_key, r.config, r.triton_version, "database")
                 for r in _database_records(self._url, device.name, spec.name)]
        other_versions: dict[str, int] = {}
        for key, values, version, source in rows:  # the database comes last: it wins
            try:
                table[key] = _entry(spec, key, values, source)
            except (ValueError, TypeError, KeyError) as exc:  # a damaged or hand-edited table
                log.warning("skipping the %s record of %s %s on %s: %s", source, spec.name, key, device.alias, exc)
                continue
            if version and _minor(version) != _minor(triton.__version__):
                other_versions[version] = other_versions.get(version, 0) + 1
        if other_versions:
            tuned_with = ", ".join(f"{n} with triton {v}" for v, n in sorted(other_versions.items()))
            log.warning("%s configs for %s were tuned under another triton (%s; this is %s): they run, but may "
                        "no longer be the fastest; re-tune with `python -m tuner search --kernel %s`",
                        spec.name, device.alias, tuned_with, triton.__version__, spec.name)
        log.debug("loaded %d tuned %s problems for %s", len(table), spec.name, device.name)
        return table


def _entry(spec: KernelSpec, key: str, values: dict, source: str) -> _Entry:
    """A stored record as dispatch uses it; ValueError (or TypeError, KeyError) if it cannot be used."""
    problem = Problem.from_key(spec.name, key)
    spec.check_problem(problem)
    config = _config_of(values)
    reason = spec.outside(config)
    if reason:
        raise ValueError(reason)
    return _Entry(problem, config, source)


def _minor(version: str) -> str:
    return ".".join(version.split("+")[0].split(".")[:2])


def _config_of(values: dict) -> Config:
    return BASELINE if values.get("VARIANT") == "cublas" else Config.from_dict(values)


def _database_records(url: str | None, device_name: str, kernel: str) -> list:
    """The user's records, read only; a missing or unreadable database means none (with a warning)."""
    from db import Store, StoreError

    try:
        store = Store(url, create=False)
        try:
            return store.records(device=device_name, kernel=kernel)
        finally:
            store.close()
    except StoreError as exc:
        log.warning("tuned configs unavailable, using defaults: %s", exc)
        return []


def _shipped_records(device_name: str, kernel: str) -> list[dict]:
    """Records of the JSON tables inside the package for this GPU (raw dicts: validated when shipped)."""
    found: list[dict] = []
    folder = resources.files(__package__).joinpath(SHIPPED_TABLES)
    if not folder.is_dir():
        return found
    for entry in folder.iterdir():
        if not entry.name.endswith(".json"):
            continue
        document = json.loads(entry.read_text())
        found.extend(r for r in document.get("records", [])
                     if r.get("device_name") == device_name and r.get("kernel") == kernel)
    return found


DISPATCHER = Dispatcher()
