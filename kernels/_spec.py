"""The values every kernel family shares: Config, Problem, SearchSpace and KernelSpec.

A kernel family (``matmul.py``, ``grouped.py``) declares one ``KernelSpec``: its search space, the
constraints that rule a config out before compiling, a reference, how to make inputs for a problem,
and how to run a config. The tuner and the runtime dispatch only ever talk to a ``KernelSpec``.
Nothing here imports Optuna or the database.
"""

from __future__ import annotations

import functools
import itertools
import math
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Union

Value = Union[int, str, bool]

# Launch options that Triton takes beside the kernel's own constexpr meta-parameters.
LAUNCH_OPTIONS = ("num_warps", "num_stages")

DTYPES = ("fp16", "bf16", "fp32")


@dataclass(frozen=True, eq=False)
class Config:
    """Meta-parameters plus launch options; prints and parses like ``triton.Config``.

    ``str(Config)`` is the one-line form people paste into issues:
    ``BLOCK_M: 128, BLOCK_N: 64, BLOCK_K: 64, GROUP_SIZE_M: 8, num_warps: 4, num_stages: 3``.
    """

    kwargs: tuple[tuple[str, Value], ...]
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self) -> None:
        # Lookups happen in every constraint check; a dict built once keeps enumeration fast.
        values = dict(self.kwargs)
        values["num_warps"], values["num_stages"] = self.num_warps, self.num_stages
        object.__setattr__(self, "_values", values)

    @classmethod
    def make(cls, num_warps: int = 4, num_stages: int = 3, **kwargs: Value) -> Config:
        return cls(tuple(kwargs.items()), int(num_warps), int(num_stages))

    @classmethod
    def from_dict(cls, values: Mapping[str, Value]) -> Config:
        """Inverse of ``as_dict``; missing launch options take Triton's defaults."""
        kwargs = {k: v for k, v in values.items() if k not in LAUNCH_OPTIONS}
        return cls.make(num_warps=int(values.get("num_warps", 4)),
                        num_stages=int(values.get("num_stages", 3)), **kwargs)

    def as_dict(self) -> dict[str, Value]:
        return dict(self._values)

    # Equal whatever order the parameters were given in; printing keeps the given order.
    def __eq__(self, other: object) -> bool:
        return isinstance(other, Config) and self._values == other._values

    def __hash__(self) -> int:
        # Dispatch hashes the config on every call of moe_matmul, so the hash is kept; computed on first use,
        # since most configs a search enumerates are dropped by a constraint without ever being hashed.
        try:
            return self._hash  # one attribute read, as before: the dispatch path pays nothing for the laziness
        except AttributeError:
            value = hash(frozenset(self._values.items()))
            object.__setattr__(self, "_hash", value)
            return value

    def get(self, name: str, default: Value | None = None) -> Value | None:
        return self._values.get(name, default)

    def __getitem__(self, name: str) -> Value:
        try:
            return self._values[name]
        except KeyError:
            raise KeyError(f"config has no parameter {name!r}; it has {', '.join(self._values)}") from None

    def replace(self, **changes: Value) -> Config:
        return Config.from_dict({**self.as_dict(), **changes})

    def __str__(self) -> str:
        return ", ".join(f"{k}: {_format_value(v)}" for k, v in self.as_dict().items())

    @classmethod
    def parse(cls, text: str) -> Config:
        """Parse the ``str(config)`` form (``"BLOCK_M: 64, num_warps: 4"``)."""
        values: dict[str, Value] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, sep, raw = item.partition(":")
            if not sep or not name.strip():
                raise ValueError(f"cannot parse {item!r} in config {text!r}: expected 'NAME: VALUE'")
            values[name.strip()] = _parse_value(raw.strip())
        return cls.from_dict(values)


def _format_value(value: Value) -> str:
    return str(value)


def _parse_value(raw: str) -> Value:
    if raw in ("True", "False"):
        return raw == "True"
    if re.fullmatch(r"-?\d+", raw):
        return int(raw)
    return raw


Shape = tuple[int, int, int]


@dataclass(frozen=True)
class Problem:
    """What a config is tuned for: kernel, dtype, operand layout and one (M, N, K) per GEMM.

    ``layout`` has one letter per operand, A then B: ``n`` is row-major (last stride 1), ``t`` a
    transposed view (first stride 1, e.g. ``w.t()`` of an ``nn.Linear`` weight). Dense matmul has
    one shape; a grouped problem has one per member GEMM.
    """

    kernel: str
    dtype: str
    layout: str
    shapes: tuple[Shape, ...]

    def __post_init__(self) -> None:
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype {self.dtype!r} is not supported; use one of {', '.join(DTYPES)}")
        if len(self.layout) != 2 or any(c not in "nt" for c in self.layout):
            raise ValueError(f"layout {self.layout!r} must be two letters of 'n'/'t' (A then B), e.g. 'nn' or 'nt'")
        if not self.shapes or any(len(s) != 3 or min(s) < 0 for s in self.shapes):
            raise ValueError(f"shapes {self.shapes!r} must be one or more (M, N, K) triples of integers >= 0")

    @property
    def key(self) -> str:
        """The string the database stores this problem under: ``fp16:nt:16x4096x4096``."""
        dims = "+".join("x".join(str(d) for d in shape) for shape in self.shapes)
        return f"{self.dtype}:{self.layout}:{dims}"

    @classmethod
    def from_key(cls, kernel: str, key: str) -> Problem:
        try:
            dtype, layout, dims = key.split(":")
            shapes = tuple(_parse_shape(part) for part in dims.split("+"))
        except ValueError as exc:
            raise ValueError(f"problem key {key!r} is not of the form DTYPE:LAYOUT:MxNxK[+MxNxK...]") from exc
        return cls(kernel, dtype, layout, shapes)

    @property
    def shape(self) -> Shape:
        """The single (M, N, K) of a dense problem."""
        if len(self.shapes) != 1:
            raise ValueError(f"problem {self.key} has {len(self.shapes)} GEMMs; use .shapes")
        return self.shapes[0]

    @property
    def flops(self) -> float:
        return float(sum(2 * m * n * k for m, n, k in self.shapes))

    def bytes_moved(self, element_size: int) -> float:
        """The fewest bytes a kernel must move: each input read once, each output written once."""
        return float(sum((m * k + k * n + m * n) * element_size for m, n, k in self.shapes))

    def __str__(self) -> str:
        return f"{self.kernel}[{self.key}]"


def parse_shape(text: str) -> Shape:
    """``"4096x4096x512"`` → ``(4096, 4096, 512)``, with a message that says what form is wanted."""
    try:
        return _parse_shape(text)
    except ValueError:
        raise ValueError(f"shape {text!r} must be MxNxK with integers >= 0, e.g. 4096x4096x4096") from None


def _parse_shape(text: str) -> Shape:
    parts = text.lower().split("x")
    if len(parts) != 3:
        raise ValueError(text)
    m, n, k = (int(p) for p in parts)
    if min(m, n, k) < 0:
        raise ValueError(text)
    return (m, n, k)


@dataclass(frozen=True)
class DeviceInfo:
    """The GPU (or the CPU interpreter) a result is measured on and stored under."""

    name: str  # canonical, as the driver reports it: "NVIDIA H100 80GB HBM3"; "cpu" for the interpreter
    alias: str  # short family name: "h100"; "cpu"
    compute_capability: str  # "9.0"; "" for cpu
    sm_count: int
    shared_memory_bytes: int  # per-block opt-in limit, the budget a config's buffers must fit in

    @property
    def is_cpu(self) -> bool:
        return self.name == "cpu"


# A constraint returns None when the config may run on this problem and device, else the reason it may not.
Constraint = Callable[[Config, "Problem", DeviceInfo], Union[str, None]]

# A fold returns the config that launches the same programs over the same work as ``config`` does on
# this problem (for a 16-row problem every GROUP_SIZE_M gives one program order), or ``config`` itself.
Fold = Callable[[Config, "Problem"], Config]


def fold_to_least_covering(config: Config, name: str, values: Sequence[int], bound: int) -> Config:
    """The fold shared by the kernels: where every value of ``name`` at or above ``bound`` is one
    launch (a group that covers every row of tiles, a program per tile), ``config`` with the least
    of ``values`` that reaches ``bound``."""
    if config[name] <= bound:
        return config
    least = min(v for v in values if v >= bound)
    return config if least == config[name] else config.replace(**{name: least})


@dataclass(frozen=True)
class Param:
    """One tunable: a name and the values it may take, smallest first where that means anything.

    ``default``, for a parameter added after configs were stored: the value it had in effect in those
    configs, which may leave it out (a record, a trial or an export written before it existed).
    """

    name: str
    values: tuple[Value, ...]
    default: Value | None = None


@dataclass(frozen=True)
class SearchSpace:
    """A search space as data: parameters, constraints, and the parameters each variant ignores.

    ``ignored`` maps a switch parameter's value to the parameters that value makes meaningless and
    the one value they are folded to (``{"VARIANT": {"tiled": {"SPLIT_K": 1}}}``: a split-K factor
    means nothing to the tiled kernel). ``folds`` do the same for values that differ in general but
    not on a given problem (every NUM_SM above the tile count launches one program per tile).
    ``canonical`` applies both, so a search never pays twice for one kernel and enumeration lists each
    kernel once. The measured case for it: one sweep timed the four GROUP_SIZE_M values of each
    16-row tile, identical launches, and their times spread by 1.8% (median) up to 5.8%
    (benchmarks/sweeps/subspaces/matmul-fp16-nn-16x4096x4096-tiled.json).
    """

    params: tuple[Param, ...]
    constraints: tuple[Constraint, ...] = ()
    ignored: Mapping[str, Mapping[Value, Mapping[str, Value]]] = field(default_factory=dict)
    folds: tuple[Fold, ...] = ()

    def fixed_by(self, values: Mapping[str, Value]) -> dict[str, Value]:
        """The folded values implied by the switch parameters in ``values``."""
        fixed: dict[str, Value] = {}
        for switch, by_value in self.ignored.items():
            fixed.update(by_value.get(values.get(switch), {}))
        return {k: v for k, v in fixed.items() if k in values}

    def canonical(self, config: Config, problem: Problem | None = None) -> Config:
        """The one representative of the configs that launch the same kernel as ``config``; with a
        problem, of those that launch the same programs over it (see ``folds``)."""
        values = config.as_dict()
        fixed = self.fixed_by(values)
        # A parameter with a default that this variant ignores is left out, as configs stored before
        # it existed leave it out: one form for both.
        dropped = [name for name in fixed if name in self._defaulted]
        if dropped:
            config = Config.from_dict({k: v for k, v in values.items() if k not in dropped})
            fixed = {k: v for k, v in fixed.items() if k not in dropped}
        if not all(config.get(k) == v for k, v in fixed.items()):
            config = config.replace(**fixed)
        # A config outside the space (cuBLAS's, or a record from an older space) has nothing to fold.
        if problem is not None and self.folds and self.outside(config) is None:
            for fold in self.folds:
                config = fold(config, problem)
        return config

    def portable(self, config: Config, problem: Problem, device: DeviceInfo,
                 preferred: Mapping[str, Value]) -> Config:
        """Of the configs that launch what ``config`` launches on ``problem`` (its fold class), the
        valid one whose values lie nearest ``preferred``.

        The fold class's canonical member has the least value (NUM_SM=32 for 32 tiles), which is
        right for ``problem`` but poor where a stored winner is reused: on a problem with 256 tiles,
        32 programs would leave most SMs idle. So winners are stored with the value a larger
        problem would want (the SM count, the usual group size) when it is equivalent here.
        """
        target = self.canonical(config, problem)
        fixed = self.fixed_by(config.as_dict())
        chosen = config
        for name, want in preferred.items():
            if name in fixed or name not in self.names:
                continue
            equivalent = [v for v in self.param(name).values
                          if self.canonical(chosen.replace(**{name: v}), problem) == target
                          and self.violation(chosen.replace(**{name: v}), problem, device) is None]
            if equivalent:
                chosen = chosen.replace(**{name: min(equivalent, key=lambda v: (abs(v - want), v))})
        return chosen

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    @functools.cached_property
    def _defaulted(self) -> frozenset[str]:  # frozen dataclass: cached_property writes the instance dict
        return frozenset(p.name for p in self.params if p.default is not None)

    def param(self, name: str) -> Param:
        for p in self.params:
            if p.name == name:
                return p
        raise KeyError(f"no parameter {name!r}; the space has {', '.join(self.names)}")

    def outside(self, config: Config) -> str | None:
        """Why ``config`` is not a point of this space (unknown or missing name, value not allowed)."""
        values = config.as_dict()
        unknown = sorted(set(values) - set(self.names))
        if unknown:
            return f"unknown parameter(s) {', '.join(unknown)}; the space has {', '.join(self.names)}"
        for p in self.params:
            if p.name not in values:
                if p.default is not None:
                    continue  # a config stored before the parameter existed
                return f"parameter {p.name} is missing"
            if values[p.name] not in p.values:
                allowed = ", ".join(str(v) for v in p.values)
                return f"{p.name}={values[p.name]!r} is not one of {allowed}"
        return None

    def violation(self, config: Config, problem: Problem, device: DeviceInfo) -> str | None:
        """Why ``config`` must not be compiled for this problem on this device, or None if it may."""
        return self.outside(config) or self._first_violation(config, problem, device)

    def enumerate(self, problem: Problem, device: DeviceInfo) -> Iterator[Config]:
        """Every distinct valid config for this problem, each canonical form once."""
        switches = [p for p in self.params if p.name in self.ignored]
        for switch_values in itertools.product(*(p.values for p in switches)):
            chosen = dict(zip((p.name for p in switches), switch_values))
            fixed = self.fixed_by({**{p.name: None for p in self.params}, **chosen})
            kept = [p for p in self.params if not (p.name in fixed and p.default is not None)]  # as canonical
            axes = [(chosen[p.name],) if p.name in chosen else (fixed[p.name],) if p.name in fixed else p.values
                    for p in kept]
            # Config.from_dict, unrolled: a matmul problem enumerates about 150,000 configs here, and building
            # them through from_dict took 40% of it (cProfile, CPU build machine, torch 2.13.0+cpu, 2026-11-29; docs/FLEET.md).
            meta = [i for i, p in enumerate(kept) if p.name not in LAUNCH_OPTIONS]
            names = [kept[i].name for i in meta]
            warps = next((i for i, p in enumerate(kept) if p.name == "num_warps"), None)
            stages = next((i for i, p in enumerate(kept) if p.name == "num_stages"), None)
            for values in itertools.product(*axes):
                config = Config(tuple(zip(names, [values[i] for i in meta])),
                                4 if warps is None else int(values[warps]), 3 if stages is None else int(values[stages]))
                if self._first_violation(config, problem, device) is None and self._is_folded(config, problem):
                    yield config

    def _is_folded(self, config: Config, problem: Problem) -> bool:
        return all(fold(config, problem) == config for fold in self.folds)

    def _first_violation(self, config: Config, problem: Problem, device: DeviceInfo) -> str | None:
        for constraint in self.constraints:
            reason = constraint(config, problem, device)
            if reason:
                return reason
        return None

    def size(self) -> int:
        return math.prod(len(p.values) for p in self.params)


@dataclass(frozen=True)
class KernelSpec:
    """Everything the tuner and the dispatcher need to know about one kernel family."""

    name: str
    space: SearchSpace
    dtypes: tuple[str, ...]
    # The problem a call's arguments pose (raises ValueError/TypeError on bad arguments).
    problem_of: Callable[..., Problem]
    # Fresh random inputs for a problem on a torch device; the tuple is passed to run/reference.
    make_inputs: Callable[[Problem, Any, int], tuple]
    # The output in float32 (or a list of them), computed by torch.
    reference: Callable[[tuple], Any]
    # Run one config on the inputs; returns the output (a tensor or a list of tensors).
    run: Callable[[Config, tuple], Any]
    # What the user would call without us (torch.matmul, a loop of it); timed beside every winner.
    baseline: Callable[[tuple], Any]
    # A sound config for any problem, used when nothing is tuned near it.
    default_config: Callable[[Problem, DeviceInfo], Config]
    # Distance between problems of this kernel, for "nearest tuned problem" at dispatch.
    distance: Callable[[Problem, Problem], float]
    # Configs known to do well on problems like this one: the search's first trials.
    seeds: Callable[[Problem, DeviceInfo], list] = field(default=lambda problem, device: [])
    # Raises ValueError naming the fix when a well-formed key is still not a problem of this kernel.
    check_problem: Callable[[Problem], None] = field(default=lambda problem: None)
    # Values a stored winner should carry where its problem makes several equivalent (see
    # SearchSpace.portable): the config is reused on the nearest untuned problems, where they differ.
    portable_values: Callable[[DeviceInfo], Mapping[str, Value]] = field(default=lambda device: {})
    # Whether an untuned problem runs the baseline unless a near tuned record won clearly (dispatch's
    # ``_untuned_choice``): right where the baseline is a vendor library (cuBLAS), which an untried
    # Triton config rarely beats; wrong where it is a Python loop of launches (grouped GEMMs), which
    # the default config beats.
    baseline_when_untuned: bool = False
    # Whether a problem whose nearest tuned record is far (dispatch's FAR_NEIGHBOUR) runs the baseline on
    # this device instead of a config tuned for a shape unlike its own: right where the baseline is one
    # vendor launch (torch._grouped_mm for bf16 MoE on Hopper), wrong where it is a loop of them.
    baseline_when_far: Callable[[Problem, DeviceInfo], bool] = field(default=lambda problem, device: False)
    # Whether dispatch may run the baseline for a problem as the tuner timed it. False where the timed
    # baseline needs what a call does not hold on the host: moe_matmul's loop of torch.matmul reads the
    # end rows, a device-to-host sync per call that no CUDA graph can capture. There the baseline is the
    # yardstick of every speed-up but never a winner, and dispatch runs a Triton config instead.
    baseline_dispatchable: Callable[[Problem], bool] = field(default=lambda problem: True)
    # The least host time, in ms, the baseline's call takes on the fastest host met: where its GPU time is
    # under this, it is host-bound on every host, and a fast host does not see its GPU time alone
    # (tuner/search.py ``holds_on_a_fast_host``). 0 for a baseline of one torch call, as the rule was made.
    baseline_host_floor_ms: float = 0.0
    # The inputs of the correctness check (kernels/_check.py): make_inputs' with the edges a missed element
    # hides in made loud (and for MoE, a split of the tokens with empty and one-row experts); None: make_inputs.
    check_inputs: Callable[[Problem, Any, int], tuple] | None = None

    def inputs_for_check(self, problem: Problem, device: Any, seed: int) -> tuple:
        """Fresh inputs for checking a config on ``problem`` (``check_inputs``, or ``make_inputs``)."""
        return (self.check_inputs or self.make_inputs)(problem, device, seed)

    def execute(self, config: Config, inputs: tuple) -> Any:
        """Run ``config``, or the baseline when the stored winner is cuBLAS itself."""
        if is_baseline(config):
            return self.baseline(inputs)
        return self.run(config, inputs)

    def outside(self, config: Config) -> str | None:
        """Why ``config`` can be neither run nor stored for this kernel, or None."""
        return None if is_baseline(config) else self.space.outside(config)

    def transfer_distance(self, problem: Problem, tuned: Problem) -> float:
        """How far ``tuned``'s winner is from ``problem`` as a config to reuse: ``distance``, except
        that the same shapes in the other of fp16/bf16 count too, one factor of 2 farther; infinite
        where nothing carries over (another layout, fp32 against a half type)."""
        if tuned.dtype == _HALF_SIBLING.get(problem.dtype):
            return self.distance(problem, replace(tuned, dtype=problem.dtype)) + HALF_SIBLING_PENALTY
        return self.distance(problem, tuned)


# fp16 and bf16 share element size, tile limits and tensor-core rate, so a winner for the same shapes
# in the other one is a strong guess: on the H100 the bf16 MoE group's best of 5,418 swept configs was
# the fp16 search's winner. Such a record counts as a factor 2 farther in one dimension (distance 1).
_HALF_SIBLING = {"fp16": "bf16", "bf16": "fp16"}
HALF_SIBLING_PENALTY = 1.0


# The winner when no Triton config beats what the user already has (torch.matmul / cuBLAS).
BASELINE = Config.make(VARIANT="cublas")


def is_baseline(config: Config) -> bool:
    return config.get("VARIANT") == "cublas"


def is_row_loop(config: Config) -> bool:
    """Whether ``config`` runs a row of programs per row of A, GEMV_BLOCK_N columns each, over K in GEMV_BLOCK_K
    steps: matmul's ``gemv`` variant, or the epilogue kernels' one-row loop (GEMV_BLOCK_N > 0 and no VARIANT,
    kernels/epilogue.py). Their BLOCK_M/N/K are placeholders, not the blocks a program covers."""
    return config.get("VARIANT") == "gemv" or (config.get("VARIANT") is None and config.get("GEMV_BLOCK_N", 0) > 0)


def log_distance(a: Sequence[float], b: Sequence[float]) -> float:
    """Distance between two size vectors on a log scale: 2x off in one dimension costs 1."""
    return math.sqrt(sum((math.log2(max(x, 1)) - math.log2(max(y, 1))) ** 2 for x, y in zip(a, b)))
