"""The values the database holds and hands back: one tuned ``Record`` and an ``ImportSummary``.

Kept apart from ``store.py`` and ``io.py`` so that the models, the store and the importer can all
use them without importing one another.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Union

ConfigValue = Union[int, str, bool]
# The two ways a kernel is called, each with its own winner: see Record.mode.
MODES = ("eager", "graph")
Shape = tuple[int, int, int]


def _utc_now() -> datetime:
    return datetime.now(timezone.utc)


@dataclass(frozen=True)
class Record:
    """The winning config for one problem on one device, with the baseline it was measured against.

    Frozen so a record read from the database cannot drift from it; the ``config`` dicts make it
    unhashable, which is fine: records are compared, never used as set members.
    """

    device_name: str  # canonical GPU name, "NVIDIA H100 80GB HBM3"; "cpu" for the interpreter
    device_alias: str  # "h100"; "cpu"
    compute_capability: str  # "9.0"; "" for cpu
    sm_count: int
    kernel: str  # "matmul", "grouped_matmul", ...
    problem_key: str  # "fp16:nt:16x4096x4096"; one "MxNxK" per GEMM, joined by "+"
    dtype: str  # "fp16" | "bf16" | "fp32"
    layout: str  # "nn" | "nt" | "tn" | "tt"
    shapes: tuple[Shape, ...]  # one (M, N, K) per GEMM
    config: dict[str, ConfigValue]  # the winner; {"VARIANT": "cublas"} when cuBLAS won
    time_ms: float  # median time of the winner
    tflops: float
    cublas_ms: float | None  # torch.matmul measured in the same run
    triton_config: dict[str, ConfigValue] | None  # best Triton config (== config unless cuBLAS won)
    triton_ms: float | None
    torch_version: str
    triton_version: str
    cuda_version: str  # "" on cpu
    trials: int
    created_at: datetime = field(default_factory=_utc_now)  # timezone-aware, UTC
    # How the times were taken (docs/MODES.md): "eager" times the public call back to back, host time
    # included; "graph" times its CUDA-graph replay. Records from before modes existed are "graph".
    mode: str = "graph"

    def __post_init__(self) -> None:
        # Lists from JSON become tuples, and the dicts are copied so a caller's later edits cannot
        # reach into a frozen value.
        object.__setattr__(self, "shapes", tuple(tuple(shape) for shape in self.shapes))
        object.__setattr__(self, "config", dict(self.config))
        if self.triton_config is not None:
            object.__setattr__(self, "triton_config", dict(self.triton_config))
        if self.created_at.tzinfo is None:
            raise ValueError(f"created_at {self.created_at.isoformat()} has no timezone; "
                             "pass an aware datetime such as datetime.now(timezone.utc)")
        try:
            object.__setattr__(self, "created_at", self.created_at.astimezone(timezone.utc))
        except OverflowError:
            raise ValueError(f"created_at {self.created_at.isoformat()} is past year 9999 in UTC; "
                             "pass a time that UTC can hold") from None
        if self.mode not in MODES:
            raise ValueError(f"mode {self.mode!r} is not one of {', '.join(MODES)}")

    @property
    def key(self) -> tuple[str, str, str, str]:
        """What the database keeps one record per: (device_name, kernel, problem_key, mode)."""
        return (self.device_name, self.kernel, self.problem_key, self.mode)

    @property
    def speedup(self) -> float | None:
        """How many times faster than the cuBLAS baseline the winner is; None without a baseline."""
        if self.cublas_ms is None or self.time_ms <= 0:
            return None
        return self.cublas_ms / self.time_ms


@dataclass(frozen=True)
class ImportSummary:
    """What a batch write did: how many records were inserted, replaced an old one, or lost to one."""

    inserted: int = 0
    replaced: int = 0
    kept: int = 0

    @property
    def total(self) -> int:
        return self.inserted + self.replaced + self.kept

    def __str__(self) -> str:
        return f"{self.inserted} inserted, {self.replaced} replaced, {self.kept} kept"
