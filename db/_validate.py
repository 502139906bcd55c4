"""Checks on one record as read from JSON, before it becomes a ``Record``.

Each check returns every problem it finds rather than stopping at the first, so that one import
attempt shows everything that must be fixed.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping
from datetime import datetime, timezone
from typing import Any

from ._record import MODES, Record

# "any": a user kernel's record (kernels.autotune), which has neither a GEMM dtype nor a layout.
DTYPES = ("fp16", "bf16", "fp32", "any")
LAYOUTS = ("nn", "nt", "tn", "tt", "any")
FIELDS = tuple(f.name for f in dataclasses.fields(Record))

# A check returns why a value is wrong ("must be ..., got ..."), or None if it is fine.
Check = Callable[[Any], str | None]


def _show(value: Any) -> str:
    text = repr(value)
    if len(text) > 60:
        text = text[:59] + "…"
    return f"{text} ({type(value).__name__})"


def _text(value: Any) -> str | None:
    return None if isinstance(value, str) else f"must be a string, got {_show(value)}"


def _name(value: Any) -> str | None:
    if not isinstance(value, str) or not value.strip():
        return f"must be a non-empty string, got {_show(value)}"
    return None


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)  # JSON true is not a count


def _count(value: Any) -> str | None:
    if not _is_int(value) or value < 0:
        return f"must be an integer >= 0, got {_show(value)}"
    return None


def _measure(value: Any) -> str | None:
    # JSON writes 2.0 as 2 at times, so ints are accepted where floats are meant; an int past the
    # largest float (10**400) cannot become one, and math.isfinite would raise OverflowError on it.
    if not (_is_int(value) or isinstance(value, float)) or not _finite(value) or value < 0:
        return f"must be a finite number >= 0, got {_show(value)}"
    return None


def _finite(value: int | float) -> bool:
    try:
        return math.isfinite(value)
    except OverflowError:
        return False


def _optional(check: Check) -> Check:
    def optional(value: Any) -> str | None:
        return None if value is None else check(value)

    return optional


def _one_of(choices: tuple[str, ...]) -> Check:
    def one_of(value: Any) -> str | None:
        if value not in choices:
            return f"must be one of {', '.join(choices)}, got {_show(value)}"
        return None

    return one_of


def _shapes(value: Any) -> str | None:
    fine = isinstance(value, (list, tuple)) and len(value) > 0 and all(
        isinstance(shape, (list, tuple)) and len(shape) == 3 and all(_is_int(d) and d >= 0 for d in shape)
        for shape in value)
    if not fine:
        return f"must be a non-empty list of [M, N, K] lists of integers >= 0, got {_show(value)}"
    return None


def _config(value: Any) -> str | None:
    if not isinstance(value, dict) or not value:
        return f"must be a non-empty object of parameter: value, got {_show(value)}"
    bad = [f"{name!r}: {_show(v)}" for name, v in value.items()
           if not isinstance(name, str) or not isinstance(v, (int, str))]  # bool is an int
    if bad:
        return f"values must be integers, strings or booleans; not {', '.join(bad)}"
    return None


def _timestamp(value: Any) -> str | None:
    wanted = "must be an ISO 8601 time with a zone, e.g. 2025-01-31T12:00:00+00:00"
    if not isinstance(value, str):
        return f"{wanted}, got {_show(value)}"
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return f"{wanted}, got {_show(value)}"
    if parsed.tzinfo is None:
        return f"{wanted}; {value!r} has no zone"
    try:
        parsed.astimezone(timezone.utc)  # records hold UTC; 9999-12-31T23:59-05:00 is past year 9999 there
    except OverflowError:
        return f"must be a time before year 10000 in UTC; {value!r} is past it"
    return None


_CHECKS: dict[str, Check] = {
    "device_name": _name, "device_alias": _name, "compute_capability": _text, "sm_count": _count,
    "kernel": _name, "problem_key": _name, "dtype": _one_of(DTYPES), "layout": _one_of(LAYOUTS),
    "shapes": _shapes, "config": _config, "time_ms": _measure, "tflops": _measure,
    "cublas_ms": _optional(_measure), "triton_config": _optional(_config),
    "triton_ms": _optional(_measure), "torch_version": _text, "triton_version": _text,
    "cuda_version": _text, "trials": _count, "created_at": _timestamp, "mode": _one_of(MODES),
}


def record_problems(raw: Mapping[str, Any]) -> list[str]:
    """Every way ``raw`` (one JSON record) fails to be a valid ``Record``; empty if it is one."""
    problems = [f"missing field {name!r}" for name in FIELDS if name not in raw]
    problems += [f"unknown field {name!r} (misspelt? the fields are those of db.Record)"
                 for name in raw if name not in _CHECKS]
    for name, check in _CHECKS.items():
        reason = check(raw[name]) if name in raw else None
        if reason:
            problems.append(f"{name} {reason}")
    return problems


def record_from_raw(raw: Mapping[str, Any]) -> Record:
    """The ``Record`` of a raw record that ``record_problems`` passed."""
    values = {name: raw[name] for name in FIELDS}
    for name in ("time_ms", "tflops", "cublas_ms", "triton_ms"):
        if values[name] is not None:
            values[name] = float(values[name])
    values["shapes"] = tuple(tuple(shape) for shape in values["shapes"])
    values["created_at"] = datetime.fromisoformat(values["created_at"])
    return Record(**values)
