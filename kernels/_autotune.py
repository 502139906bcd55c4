"""``@kernels.autotune``: ``@triton.autotune``'s arguments and reading order, with the winners kept in the database.

``Autotuner.run`` reads as Triton's does: key -> cache -> (on a miss) resolve -> launch. A miss resolves, in
order: the user's database, the tables shipped with ``tables=``, the nearest tuned key by ``distance=``, then
the mode (``mode=`` or ``TUNER_AUTOTUNE``: off | record | on | incremental; docs/AUTOTUNE.md). Inside a
CUDA-graph capture or a torch.compile trace nothing is timed: the best config known so far runs (under a trace, it is
chosen at trace time and launched as a plain Triton kernel, which Dynamo turns into its kernel operator).
"""

from __future__ import annotations

import itertools
import logging
import operator
import os
import re
import threading
import weakref
import warnings
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from triton.runtime.jit import KernelInterface

from ._autotune_core import (DEFAULT_TOLERANCE, AutotuneError, Key, Launch, Space, as_config, candidates,
                             make_record, median_ms, problem_key, source_hash, split_problem_key,
                             version_stamp)
from ._device import cuda_context_lost, current_device
from .dispatch import DISPATCHER, _database_records, table_documents, table_records
from ._spec import LAUNCH_OPTIONS, Config, DeviceInfo

__all__ = ["AUTOTUNE_MODES", "AutotuneError", "Autotuner", "ENV_MODE", "Key", "Launch", "Space", "autotune"]

_logger = logging.getLogger(__name__)

ENV_MODE = "TUNER_AUTOTUNE"
# Every live decorator by its serial number: for clear_all, and for the trace-time lookup (Dynamo passes a constant,
# not the object, to an assume_constant_result function in torch 2.11).
_ALL: weakref.WeakValueDictionary[int, Autotuner] = weakref.WeakValueDictionary()
_SERIALS = itertools.count()
_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")  # as db/_plausible.py's _USER_KERNEL
AUTOTUNE_MODES = ("off", "record", "on", "incremental")


def autotune(configs: Sequence[Any] = (), key: Sequence[str] = (), prune_configs_by: Mapping[str, Any] | None = None,
             reset_to_zero: Sequence[str] | None = None, restore_value: Sequence[str] | None = None,
             pre_hook: Callable | None = None, post_hook: Callable | None = None, warmup: int | None = None,
             rep: int | None = None, do_bench: Callable | None = None, *, space: Space | None = None,
             name: str | None = None, tables: str | Path | Sequence[str | Path] | None = None,
             distance: Callable[[dict, dict], float] | None = None, mode: str | None = None,
             inputs: Callable[[Key], Launch] | None = None, reference: Callable | None = None,
             tolerance: float = DEFAULT_TOLERANCE, db: str | None = None, **triton_only: Any) -> Callable:
    """A drop-in for ``triton.autotune`` whose results are stored, shared and searched (docs/AUTOTUNE.md)."""
    unknown = set(triton_only) - {"use_cuda_graph", "cache_results"}
    if unknown:
        raise TypeError(f"autotune() got unexpected argument(s) {', '.join(sorted(unknown))}")

    def decorator(fn: Any) -> Autotuner:
        return Autotuner(fn, configs=configs, key=key, prune_configs_by=prune_configs_by,
                         reset_to_zero=reset_to_zero, restore_value=restore_value, pre_hook=pre_hook,
                         post_hook=post_hook, warmup=warmup, rep=rep, do_bench=do_bench, space=space, name=name,
                         tables=tables, distance=distance, mode=mode, inputs=inputs, reference=reference,
                         tolerance=tolerance, db=db)

    return decorator


class Autotuner(KernelInterface):
    """The wrapped kernel: ``kernel[grid](...)`` as with Triton's, configs from the database where it has them."""

    def __init__(self, fn: Any, *, configs: Sequence[Any], key: Sequence[str], prune_configs_by: Mapping | None,
                 reset_to_zero: Sequence[str] | None, restore_value: Sequence[str] | None, pre_hook: Callable | None,
                 post_hook: Callable | None, warmup: int | None, rep: int | None, do_bench: Callable | None,
                 space: Space | None, name: str | None, tables: Any, distance: Callable | None, mode: str | None,
                 inputs: Callable | None, reference: Callable | None, tolerance: float, db: str | None) -> None:
        self.fn = fn
        self.base_fn = getattr(fn, "fn", fn)
        self.arg_names = list(fn.arg_names)
        # A nested function's qualname holds "<locals>", which no database name may: it is left out.
        self.name = name or f"{self.base_fn.__module__}.{self.base_fn.__qualname__}".replace("<locals>.", "")
        if not _NAME.fullmatch(self.name):
            raise AutotuneError(f"name={self.name!r} cannot name a kernel in the database: give name= a dotted Python "
                                "name of up to 128 letters, digits and '_', e.g. my_pkg.my_mod.my_kernel")
        if self.name in _builtin_names():
            raise AutotuneError(f"name={self.name!r} is one of the tuner's own kernels; give name= another name")
        self.keys = list(key)
        self.configs = [as_config(c) for c in configs]
        self._triton_configs = list(configs)
        # A triton.Config's own pre_hook runs before each launch of that config, as Triton runs it.
        self._config_hooks = {as_config(c): c.pre_hook for c in configs if getattr(c, "pre_hook", None)}
        # The same hooks by position, for a compiled graph: a trace-time constant names its config's hook by index
        # (a function returned as one cannot be guarded by Dynamo: torch 2.11, an H200 run of 2026-11-28).
        self._hooks = tuple(self._config_hooks.values())
        self._hook_index = {config: at for at, config in enumerate(self._config_hooks)}
        self.space = space
        self.prune_configs_by = dict(prune_configs_by or {})
        self.reset_to_zero = list(reset_to_zero or [])
        self.restore_value = list(restore_value or [])
        self.user_pre_hook, self.user_post_hook = pre_hook, post_hook
        self.num_warmups, self.num_reps, self._do_bench = warmup, rep, do_bench  # Triton's names for them
        self.tables = [tables] if isinstance(tables, (str, Path)) else list(tables or [])
        self.distance, self.mode, self.inputs, self.reference = distance, mode, inputs, reference
        self.tolerance, self.db = tolerance, db
        if mode is not None and mode not in AUTOTUNE_MODES:
            raise AutotuneError(f"mode={mode!r} is not one of {', '.join(AUTOTUNE_MODES)}")
        self._check_declaration()
        self.src_hash = source_hash(fn)
        self.stamp = version_stamp(fn)  # the source hash and the triton version: records of another are not read
        self.cache: dict[tuple, Config] = {}  # the hot path: key values -> config, filled at a key's first call
        self.best_config: Config | None = None
        self._known: dict[str, dict[str, Config]] = {}  # device name -> problem key -> config
        self._pending: dict[tuple, list[float]] = {}  # incremental: key -> times of the candidates tried so far
        self._lock = threading.RLock()  # one thread tunes a key; the others wait for its winner
        self._warned: set[tuple] = set()  # (device, key) already warned of an untuned config in a compiled graph
        self.serial = next(_SERIALS)
        _ALL[self.serial] = self

    # The call ---------------------------------------------------------------------------------

    def run(self, *args: Any, grid: Any, warmup: bool = False, **kwargs: Any) -> Any:
        if warmup:  # kernel.warmup(...): compile every config ahead of time, as Triton's Autotuner.warmup does
            return [self.fn.run(*args, grid=grid, warmup=True, **kwargs, **c.as_dict()) for c in self.configs]
        # Dynamo folds it to True while it traces; eagerly one call returning False (32 ns: docs/PYTORCH.md)
        if torch.compiler.is_dynamo_compiling():
            return self._run_traced(args, grid, kwargs)
        nargs = dict(zip(self.arg_names, args))
        key = self._key_of(nargs, kwargs)
        config = self.cache.get(key)
        if config is None:
            with self._lock:
                config = self.cache.get(key) or self._resolve(key, args, kwargs, grid)
        self.best_config = config
        if self._config_hooks and config in self._config_hooks:
            self._config_hooks[config]({**nargs, **kwargs, **config.as_dict()})
        return self.fn.run(*args, grid=grid, warmup=False, **kwargs, **config.as_dict())

    def _run_traced(self, args: tuple, grid: Any, kwargs: dict) -> Any:
        """Under torch.compile: the key's config is chosen while Dynamo traces, outside the graph, and the plain
        kernel is launched with it, which Dynamo turns into its own Triton kernel operator. Each key value is traced
        once: a symbolic key argument (``dynamic=True``) is specialized, as its config may differ."""
        nargs = dict(zip(self.arg_names, args))
        every = {**nargs, **kwargs}
        tensors = [a for a in every.values() if isinstance(a, torch.Tensor)]
        key = tuple(_specialized(every[k]) for k in self.keys if k in every) + tuple(str(t.dtype) for t in tensors)
        pairs, hook_at = _config_while_tracing(self.serial, key, tensors[0].device if tensors else None)
        # A dict built here, not the constant one: Dynamo (torch 2.11) cannot guard a constant dict's keys.
        meta = dict(kwargs)
        for name, value in pairs:
            meta[name] = value
        if hook_at >= 0:
            self._hooks[hook_at]({**nargs, **meta})
        return self.fn.run(*args, grid=grid, warmup=False, **meta)

    def config_while_tracing(self, key_values: tuple, device: torch.device | None
                             ) -> tuple[tuple[tuple[str, Any], ...], int]:
        """The config a compiled graph bakes in for a key, and its ``triton.Config`` pre-hook's place in ``_hooks``
        (-1: none): the cached or stored
        one, else the nearest or the default. Nothing is timed (there are no real tensors while Dynamo traces), and an
        untuned key's choice is not cached, so the key's next eager call still tunes it."""
        config = self.cache.get(key_values)
        if config is None:
            with self._lock:
                config = self.cache.get(key_values) or self._untimed(key_values, current_device(device))
        self.best_config = config
        return tuple(config.as_dict().items()), self._hook_index.get(config, -1)

    def _untimed(self, key_values: tuple, device: DeviceInfo) -> Config:
        key = self.key_of(key_values)
        stored, known = self._stored(key_values, key, device)
        if stored is not None:
            return stored
        mode = self._mode()
        if mode == "record":
            self._note(device, key)
        elif mode in ("on", "incremental") and (device.name, key_values) not in self._warned:
            self._warned.add((device.name, key_values))
            warnings.warn(f"{self.name}: key {key.text} is not tuned on {device.alias}, so the graph torch.compile "
                          "traces now keeps an untuned config; tune the key first (one eager call, or `python -m "
                          f"tuner search --kernel MODULE:NAME --problems ...`), then compile", stacklevel=2)
        return self._nearest(key, known) or self.default_config(key)

    def _stored(self, key_values: tuple, key: Key, device: DeviceInfo) -> tuple[Config | None, Mapping[str, Config]]:
        """The key's stored (or shipped) config, cached for its next calls, or None; and what is known on
        ``device`` (for the nearest key)."""
        known = self._known_on(device)
        stored = known.get(problem_key(key, self.stamp))
        if stored is not None:
            self.cache[key_values] = stored
        return stored, known

    def _mode(self) -> str:
        mode = self.mode or os.environ.get(ENV_MODE, "on").strip().lower() or "on"
        if mode not in AUTOTUNE_MODES:
            raise AutotuneError(f"{ENV_MODE}={mode!r} is not one of {', '.join(AUTOTUNE_MODES)}")
        return mode

    def _key_of(self, nargs: dict, kwargs: dict) -> tuple:
        # As Triton keys it: the named arguments' values, then the dtype of every argument that has one.
        every = {**nargs, **kwargs}
        values = tuple(every[k] for k in self.keys if k in every)
        return values + tuple(str(a.dtype) for a in every.values() if hasattr(a, "dtype"))

    def _resolve(self, key_values: tuple, args: tuple, kwargs: dict, grid: Any) -> Config:
        """A key's first call: the stored config, a shipped one, the nearest one, or what the mode says."""
        key, device = self.key_of(key_values), _device_of(args, kwargs)
        stored, known = self._stored(key_values, key, device)
        if stored is not None:
            return stored
        near = self._nearest(key, known)
        mode = self._mode()
        if _capturing():  # never time under a CUDA-graph capture; a later eager call tunes the key
            return near or self.default_config(key)
        if mode in ("off", "record"):
            if mode == "record":
                self._note(device, key)
            config = near or self.default_config(key)
        elif mode == "on":
            config = self._tune_now(key, device, args, kwargs, grid)
        else:
            return self._tune_one_step(key_values, key, device, args, kwargs, grid)
        self.cache[key_values] = config
        return config

    def key_of(self, key_values: tuple) -> Key:
        named = [k for k in self.keys]
        return Key(dict(zip(named, key_values[:len(named)])), tuple(str(d).removeprefix("torch.")
                                                                   for d in key_values[len(named):]))

    def explain(self, key: Key, device: DeviceInfo) -> tuple[str, Config]:
        """Where a key's first call on ``device`` would take its config from, and that config (reads only)."""
        known = self._known_on(device)
        stored = known.get(problem_key(key, self.stamp))
        if stored is not None:
            return "record", stored
        near = self._nearest(key, known)
        if near is not None:
            return "nearest", near
        mode = self.mode or os.environ.get(ENV_MODE, "on").strip().lower() or "on"
        return ("default" if mode in ("off", "record") else f"default until tuned ({mode})"), self.default_config(key)

    # Candidates and the default ----------------------------------------------------------------

    def candidates(self, key: Key, nargs: Mapping[str, Any] | None = None, kwargs: Mapping | None = None) -> list[Config]:
        configs = self._pruned(nargs, kwargs) if nargs is not None else self.configs
        found = candidates(configs, self.space, key)
        if not found:
            raise AutotuneError(self._nothing_valid(key))
        return found

    def default_config(self, key: Key) -> Config:
        """The list's first config, else the space's first valid point."""
        if self.configs:
            return self.configs[0]
        points = self.space.configs(key.values) if self.space else []
        if not points:
            raise AutotuneError(self._nothing_valid(key))
        return points[0]

    def _nothing_valid(self, key: Key) -> str:
        if self.space is None:
            return f"{self.name} has no config to run: give configs= or space="
        return (f"the space of {self.name} has no valid config for key {key.text}: every point fails a constraint; "
                "loosen the constraints or add values to the space")

    def _pruned(self, nargs: Mapping[str, Any], kwargs: Mapping | None) -> list[Config]:
        prune = self.prune_configs_by.get("early_config_prune")
        configs = self.configs
        if prune and configs:
            import triton

            given = [c if isinstance(c, triton.Config) else triton.Config(dict(c.kwargs), num_warps=c.num_warps,
                                                                          num_stages=c.num_stages)
                     for c in self._triton_configs]
            configs = [as_config(c) for c in prune(given, dict(nargs), **dict(kwargs or {}))]
            if not configs:
                raise AutotuneError(f"early_config_prune of {self.name} left no config; it must return at least one")
        model, top_k = self.prune_configs_by.get("perf_model"), self.prune_configs_by.get("top_k")
        if model and top_k:
            k = int(top_k * len(configs)) if isinstance(top_k, float) and top_k <= 1.0 else int(top_k)
            configs = sorted(configs, key=lambda c: model(**nargs, **dict(kwargs or {}), **c.as_dict()))[:k]
        return configs

    # Measuring --------------------------------------------------------------------------------

    def bench(self, config: Config, args: tuple, kwargs: dict, grid: Any) -> float:
        """The median ms of one config on these arguments, hooks applied as Triton applies them; inf if it faults."""
        conflicts = set(kwargs) & set(config.as_dict())
        if conflicts:
            raise AutotuneError(f"{self.name} is called with {', '.join(sorted(conflicts))}, which its configs set; "
                                "leave tuned meta-parameters out of the call")
        current = {**kwargs, **config.as_dict()}
        full = {**dict(zip(self.arg_names, args)), **current}
        saved = {n: full[n].clone() for n in self.restore_value}

        hook = self._config_hooks.get(config)

        def call() -> None:
            if hook:
                hook(full)
            for n in self.reset_to_zero:
                full[n].zero_()
            if self.user_pre_hook:
                self.user_pre_hook(full)
            self.fn.run(*args, grid=grid, warmup=False, **current)
            if self.user_post_hook:
                self.user_post_hook(full, exception=None)
            for n, value in saved.items():
                full[n].copy_(value)

        try:
            return median_ms(self._timer()(call, quantiles=(0.5, 0.2, 0.8)))
        except Exception as exc:
            # A GPU fault cannot be skipped as a bad config is: the process's CUDA context is gone with it, and
            # every later candidate, and the user's next call, would fail on it.
            if cuda_context_lost():
                raise AutotuneError(
                    f"{self.name}: timing config {config} in this process failed ({_first_line(exc)}) and left the "
                    "process's CUDA context lost: the GPU faulted (an illegal address or a device-side assert, in "
                    "this config or a launch before it), so every later CUDA call in this process fails and nothing "
                    "was stored. Restart the process; to tune with such a config among the candidates, run the "
                    "search out of process: `python -m tuner search --kernel MODULE:NAME --problems FILE` (the "
                    "decorator needs inputs=) checks and times each candidate in a worker process, where a fault "
                    "costs that candidate only") from exc
            # a config that cannot compile or run is skipped, as Triton skips one out of resources
            _logger.warning("%s: config %s failed and is skipped: %s", self.name, config, _first_line(exc))
            for n, value in saved.items():
                full[n].copy_(value)
            self._last_error = exc
            return float("inf")

    def _timer(self) -> Callable:
        if self._do_bench is not None:
            return self._do_bench
        import triton.testing

        return lambda fn, quantiles: triton.testing.do_bench(fn, warmup=self.num_warmups or 25,
                                                             rep=self.num_reps or 100, quantiles=quantiles)

    def _tune_now(self, key: Key, device: DeviceInfo, args: tuple, kwargs: dict, grid: Any) -> Config:
        configs = self.candidates(key, dict(zip(self.arg_names, args)), kwargs)
        times = [self.bench(c, args, kwargs, grid) for c in configs]
        return self._finish(key, device, configs, times)

    def _tune_one_step(self, key_values: tuple, key: Key, device: DeviceInfo, args: tuple, kwargs: dict,
                       grid: Any) -> Config:
        configs = self.candidates(key, dict(zip(self.arg_names, args)), kwargs)
        with self._lock:
            times = self._pending.setdefault(key_values, [])
            config = configs[len(times)]
            times.append(self.bench(config, args, kwargs, grid))
            if len(times) < len(configs):
                return config if times[-1] != float("inf") else self.default_config(key)
            del self._pending[key_values]
        winner = self._finish(key, device, configs, times)
        self.cache[key_values] = winner
        return winner

    def _finish(self, key: Key, device: DeviceInfo, configs: list[Config], times: list[float]) -> Config:
        ok = [(t, i) for i, t in enumerate(times) if t != float("inf")]
        if not ok:
            error = getattr(self, "_last_error", None)
            raise AutotuneError(f"{self.name} failed for every one of its {len(configs)} config(s) at key {key.text}, "
                                f"so nothing was stored; the last error: {_first_line(error)}. Fix the kernel or "
                                "its configs (run one config alone with TRITON_INTERPRET=1 to see the fault)")
        best_ms, best = min(ok)
        winner = configs[best]
        self._store(make_record(self.name, device, key, self.stamp, winner, best_ms, len(ok)))
        self._known_on(device)[problem_key(key, self.stamp)] = winner
        return winner

    # The database -----------------------------------------------------------------------------

    def _known_on(self, device: DeviceInfo) -> dict[str, Config]:
        """This kernel's tuned keys on ``device`` (its tables, then the user's database over them), read once,
        as dispatch reads matmul's (kernels/dispatch.py: the same readers)."""
        known = self._known.get(device.name)
        if known is None:
            documents = table_documents([Path(p) for p in self.tables], _warn_damaged_table)
            raw = table_records(documents, device.name, self.name)
            raw += [{"problem_key": r.problem_key, "config": r.config}
                    for r in _database_records(self.url, device.name, self.name)]
            fresh = {r["problem_key"]: r["config"] for r in raw
                     if isinstance(r.get("config"), dict) and _stamp_of(r["problem_key"]) == self.stamp}
            stale = {r["problem_key"] for r in raw} - set(fresh)
            if stale:
                warnings.warn(f"{self.name}: {len(stale)} of its keys on {device.alias} were tuned for another "
                              f"{self._what_changed(stale)}; those records are ignored and the keys are tuned again "
                              "(`python -m tuner list --kernel NAME` shows them)", stacklevel=4)
            known = self._known[device.name] = {k: Config.from_dict(v) for k, v in fresh.items()}
        return known

    def _what_changed(self, stale: set[str]) -> str:
        sources = {_stamp_of(text).partition("@")[0] for text in stale}
        if sources == {self.src_hash}:
            versions = sorted({_stamp_of(text).partition("@")[2] for text in stale})
            return f"triton ({', '.join(versions)}; this is {self.stamp.partition('@')[2]})"
        return "source of the kernel (its source changed)"

    def _store(self, record: Any) -> None:
        from db import Store, StoreError

        try:
            with Store(self.url) as store:
                store.put(record)
        except (StoreError, ValueError) as exc:  # ValueError: a record the plausibility rules refuse (a timer's 0 ms)
            _logger.warning("%s: the winner for %s could not be stored (%s)", self.name, record.problem_key, exc)

    def _note(self, device: DeviceInfo, key: Key) -> None:
        from db import Store, StoreError
        from db.recorded import ProblemKey, add_calls

        try:
            with Store(self.url) as store:
                add_calls(store, {ProblemKey(device.name, self.name, problem_key(key, self.stamp)): (1, 0.0)})
        except StoreError as exc:
            _logger.warning("%s: key %s could not be recorded (%s)", self.name, key.text, exc)

    def _nearest(self, key: Key, known: Mapping[str, Config]) -> Config | None:
        if self.distance is None or not known:
            return None
        best: tuple[float, str] | None = None
        for text in known:
            other, _ = split_problem_key(text)
            if other.dtypes == key.dtypes:
                d = float(self.distance(dict(key.values), dict(other.values)))
                best = min(best, (d, text)) if best else (d, text)
        return known[best[1]] if best else None

    # Declaration checks ------------------------------------------------------------------------

    def _check_declaration(self) -> None:
        takes = set(self.arg_names)
        for k in self.keys:
            if k not in takes:
                raise AutotuneError(f"key {k!r} of {self.name} names no argument of the kernel; its arguments are "
                                    f"{', '.join(self.arg_names)}: fix key=")
        named = [(str(c), set(c.as_dict()) - set(LAUNCH_OPTIONS)) for c in self.configs]
        if self.space is not None:
            named.append(("space", set(self.space.params) - set(LAUNCH_OPTIONS)))
        for where, params in named:
            unknown = sorted(params - takes)
            if unknown:
                raise AutotuneError(f"{where}: {self.name} takes no parameter {', '.join(unknown)}; its arguments are "
                                    f"{', '.join(self.arg_names)}: rename the config's parameter or add it to the kernel")
        if not self.configs and self.space is None:
            raise AutotuneError(f"{self.name} has no config to run: give configs= or space=")

    @property
    def url(self) -> str | None:
        """``db=``, else the database dispatch reads (``kernels.use_database``; None: ``TUNER_DB`` or the default)."""
        return self.db if self.db is not None else DISPATCHER.url

    def clear(self) -> None:
        """Forget cached and loaded configs (the database is read again at each key's next call)."""
        self.cache.clear()
        self._known.clear()
        self._pending.clear()


def clear_all() -> None:
    """Forget every decorator's cached configs (``kernels.clear_cache``, ``kernels.use_database``)."""
    for tuner in list(_ALL.values()):
        tuner.clear()


def _builtin_names() -> set[str]:
    from ._families import KERNELS  # imported late: the families' modules are not this decorator's to load

    return set(KERNELS)


def _stamp_of(text: object) -> str | None:
    return split_problem_key(text)[1] if isinstance(text, str) else None


def _warn_damaged_table(name: str, exc: Exception) -> None:
    _logger.warning("skipping the table %s: it is not a records export (%s)", name, exc)


def _device_of(args: tuple, kwargs: dict) -> DeviceInfo:
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return current_device(value.device)
    return current_device()


def _capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def _specialized(value: Any) -> Any:
    """A key value as a plain int: under Dynamo, ``operator.index`` turns a symbolic size into its value, with a
    guard (a new value traces again), where ``int()`` would keep it symbolic."""
    return operator.index(value) if isinstance(value, int) and not isinstance(value, bool) else value


def _config_while_tracing(serial: int, key_values: tuple, device: torch.device | None
                          ) -> tuple[tuple[tuple[str, Any], ...], int]:
    # Dynamo runs this at trace time and bakes its answer into the graph, as a constant: locks, dict lookups and
    # database reads stay out of the traced code.
    return _ALL[serial].config_while_tracing(key_values, device)


# What ``torch.compiler.assume_constant_result`` does (torch 2.11 and 2.13: it sets this attribute), without the
# import of torch._dynamo that it makes: 1.2 of the 3.9 s of ``import kernels`` on our CPU build machine
# (python -X importtime and /usr/bin/time of ``python -c 'import kernels'``, torch 2.13.0+cpu, 2026-11-29), paid by every process that imports us, a fleet's workers
# and their compile processes among them, most of which never compile a model. tests/autotune_tests/
# test_autotune.py checks that the attribute is still what the decorator sets, and that Dynamo honours it.
CONSTANT_RESULT_MARK = "_dynamo_marked_constant"
setattr(_config_while_tracing, CONSTANT_RESULT_MARK, True)


def _first_line(exc: BaseException | None) -> str:
    text = f"{type(exc).__name__}: {exc}" if exc is not None else "none recorded"
    return text.strip().splitlines()[0][:300] if text.strip() else type(exc).__name__
