"""The search: sample configs with Optuna, check and time them, store the winners.

Nothing here is needed at runtime; ``kernels`` dispatches from the database alone. Names load
lazily so that ``python -m tuner --device cpu`` can switch on Triton's interpreter before anything
imports triton.
"""

from __future__ import annotations

import importlib
from typing import Any

_PUBLIC = {
    "Bench": "bench", "Measurement": "bench", "gpu_timer": "bench", "wall_timer": "bench",
    "Budget": "search", "Progress": "search", "SAMPLERS": "search", "study_name": "search", "tune": "search",
    "tune_problem": "search", "SearchStats": "search", "quick_gpu_timer": "bench", "CheckPool": "workers",
    "Stamp": "stamp", "stamp_eager": "stamp",
}

__all__ = sorted(_PUBLIC)


def __getattr__(name: str) -> Any:
    if name not in _PUBLIC:
        raise AttributeError(f"module 'tuner' has no attribute {name!r}")
    return getattr(importlib.import_module(f".{_PUBLIC[name]}", __name__), name)
