"""What ``kernels.autotune`` shares with the offline search: keys, spaces, measuring, and records.

A user kernel's record lives in ``tuner_records`` beside the matmul family's, told apart by its dtype and
layout ``"any"`` (it has neither) and a problem key of the form ``n_cols=781;float32,float32@<source hash>@3.6.0``:
the key values, the argument dtypes (as Triton's autotuner keys them), a hash of the kernel's source and the triton
version. A changed source or triton finds no record: its old ones stay, unread, until deleted. Nothing here imports
Optuna.
"""

from __future__ import annotations

import hashlib
import inspect
import itertools
import logging
import math
import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from db import Record
from ._spec import Config, DeviceInfo, Value, _parse_value

_logger = logging.getLogger(__name__)

# The dtype and layout of a user kernel's record: the database's marker that no GEMM rule applies to it.
ANY = "any"
# How many configs a space is sampled for when no list bounds the budget (issue 39).
SPACE_BUDGET = 20
# Within this relative error (against the reference, or the first config that ran) a candidate's outputs pass.
# fp16 rounding over a reduction of a few thousand terms stays below 1e-2 (tuner/bench.py uses the same order).
DEFAULT_TOLERANCE = 1e-2


class AutotuneError(ValueError):
    """A kernel, key, config or space that cannot be tuned; the message names the fix. Nothing is stored."""


@dataclass(frozen=True)
class Space:
    """A search space as data: each parameter's values, and constraints over (config, key) that a config must meet.

    A constraint takes the config's values and the key's values (both dicts) and returns True where the
    config may run.
    """

    params: Mapping[str, Sequence[Value]]
    constraints: tuple[Callable[[dict, dict], bool], ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "params", {k: tuple(v) for k, v in dict(self.params).items()})
        object.__setattr__(self, "constraints", tuple(self.constraints))
        empty = [k for k, v in self.params.items() if not v]
        if empty:
            raise AutotuneError(f"space parameter(s) {', '.join(empty)} have no values; give each at least one")

    def valid(self, values: Mapping[str, Value], key: Mapping[str, Value]) -> bool:
        return all(rule(dict(values), dict(key)) for rule in self.constraints)

    def configs(self, key: Mapping[str, Value]) -> list[Config]:
        """Every valid point, in the order the values were given (the first is the space's default)."""
        names = list(self.params)
        points = (dict(zip(names, values)) for values in itertools.product(*self.params.values()))
        return [Config.from_dict(p) for p in points if self.valid(p, key)]


@dataclass(frozen=True)
class Key:
    """The values a call is tuned for: those of the arguments named in ``key=``, then every tensor's dtype."""

    values: Mapping[str, Value]
    dtypes: tuple[str, ...] = ()

    def __getitem__(self, name: str) -> Value:
        return self.values[name]

    @property
    def text(self) -> str:
        """``n_cols=781;float32,float32``: how the database spells it (and ``parse`` reads it back)."""
        return ",".join(f"{k}={v}" for k, v in self.values.items()) + ";" + ",".join(self.dtypes)

    @classmethod
    def parse(cls, text: str) -> Key:
        head, _, dtypes = text.rpartition(";")
        values = {}
        for item in filter(None, head.split(",")):
            name, sep, raw = item.partition("=")
            if not sep:
                raise ValueError(f"key {text!r}: {item!r} is not NAME=VALUE")
            values[name] = _parse_number(raw)
        return cls(values, tuple(filter(None, dtypes.split(","))))


def _parse_number(raw: str) -> Value:
    value = _parse_value(raw)
    if isinstance(value, str):
        try:
            return float(raw)  # type: ignore[return-value]
        except ValueError:
            return value
    return value


@dataclass(frozen=True)
class Launch:
    """What ``inputs=`` returns for a key: the grid and the arguments of one call (meta-parameters left out)."""

    grid: Any
    args: tuple = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)


def source_hash(fn: Any) -> str:
    """The first 12 hex digits of the SHA-1 of the kernel's source: a changed kernel is a new kernel."""
    src = getattr(fn, "src", None) or inspect.getsource(getattr(fn, "fn", fn))
    return hashlib.sha1(src.encode()).hexdigest()[:12]


def version_stamp(fn: Any) -> str:
    """What a record is valid for besides its key: the kernel's source hash and the triton version, ``HASH@3.6.0``."""
    import triton

    return f"{source_hash(fn)}@{triton.__version__}"


def problem_key(key: Key, stamp: str) -> str:
    """``n_cols=781;float32,float32@3421b3aa3aa3@3.6.0``: the key, then the stamp it was tuned under."""
    return f"{key.text}@{stamp}"


def split_problem_key(text: str) -> tuple[Key, str]:
    """(key, stamp) of a stored problem key; a key without a whole stamp has the stamp ""."""
    parts = text.rsplit("@", 2)
    if len(parts) < 3:
        return Key.parse(parts[0]), ""
    return Key.parse(parts[0]), f"{parts[1]}@{parts[2]}"


def make_record(name: str, device: DeviceInfo, key: Key, stamp: str, config: Config, time_ms: float,
                trials: int) -> Record:
    import triton

    return Record(device_name=device.name, device_alias=device.alias,
                  compute_capability=device.compute_capability, sm_count=device.sm_count, kernel=name,
                  problem_key=problem_key(key, stamp), dtype=ANY, layout=ANY, shapes=((0, 0, 0),),
                  config=config.as_dict(), time_ms=float(time_ms), tflops=0.0, cublas_ms=None, triton_config=None,
                  triton_ms=None, torch_version=torch.__version__, triton_version=triton.__version__,
                  cuda_version=torch.version.cuda or "", trials=int(trials), mode="graph")


def as_config(config: Any) -> Config:
    """A ``triton.Config`` (or one of ours) as our Config; prints the same way."""
    if isinstance(config, Config):
        return config
    return Config.make(num_warps=config.num_warps or 4, num_stages=config.num_stages or 3, **config.kwargs)


def candidates(configs: Sequence[Config], space: Space | None, key: Key, seed: int = 0) -> list[Config]:
    """What a key is tuned over: the list; or with a space, the list first (warm starts) then a seeded sample of
    the space's valid points, up to ``SPACE_BUDGET`` in all."""
    if space is None:
        return list(configs)
    pool = space.configs(key.values)
    chosen = [c for c in configs if space.valid(c.as_dict(), key.values)]
    rest = [c for c in pool if c not in chosen]
    random.Random(f"{seed}:{key.text}").shuffle(rest)
    return (chosen + rest)[:max(SPACE_BUDGET, len(chosen))]


def median_ms(timing: Any) -> float:
    """do_bench returns a float, or a list of quantiles whose first is the median."""
    if isinstance(timing, (list, tuple)):
        timing = timing[0]
    return float(timing)


def outputs_close(got: Sequence[torch.Tensor], want: Sequence[torch.Tensor], tolerance: float) -> str | None:
    """None when every tensor matches within ``tolerance`` (relative to the largest reference value), else why not."""
    for index, (g, w) in enumerate(zip(got, want)):
        if g.shape != w.shape:
            return f"tensor argument {index} has shape {tuple(g.shape)}, expected {tuple(w.shape)}"
        if not g.is_floating_point():
            if not torch.equal(g, w):
                return f"tensor argument {index} differs"
            continue
        g64, w64 = g.double(), w.double()
        if not bool(torch.isfinite(g64).all()) and bool(torch.isfinite(w64).all()):
            return f"tensor argument {index} holds NaN or inf"
        scale = max(float(w64.abs().max()) if w64.numel() else 0.0, 1e-6)
        error = float((g64 - w64).abs().max()) / scale if g64.numel() else 0.0
        if not error <= tolerance or math.isnan(error):
            return f"tensor argument {index} is off by {error:.3g} (relative), over the tolerance {tolerance:g}"
    return None
