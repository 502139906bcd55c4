"""The search's check rejects every mutant (tests/tuner_tests/mutants.py) and passes every valid config.

Each mutant runs through the search's own gate, ``Bench.measure`` (kernels/_check.py ``check_config``), under the
interpreter on small shapes; the same config of the unbroken family passes there, so a rejection is the bug's
and not the shape's. bf16 is left out on the CPU: the interpreter's bf16 ``tl.dot`` is wrong by itself
(docs: GPU.md); scripts/calibrate_check.py runs bf16 and the real shapes on the GPU.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from kernels import CPU, Config, Problem
from kernels._check import check_config
from mutants import MUTANTS, Mutant
from tuner.bench import Bench


class NoTimer:
    """A timer that must not run: a wrong candidate is never timed."""

    def __call__(self, fn) -> float:
        raise AssertionError("a candidate that failed its check was timed")


def _cases() -> list:
    cases = []
    for mutant in MUTANTS:
        for dtype in ("fp16", "fp32"):
            if dtype in kernels.get_kernel(mutant.kernel).dtypes:
                cases.append(pytest.param(mutant, dtype, id=f"{mutant.name} [{dtype}]"))
    return cases


@pytest.mark.interpreter
@pytest.mark.parametrize("mutant, dtype", _cases())
def test_the_search_rejects_the_mutant_and_passes_its_unbroken_config(mutant: Mutant, dtype: str) -> None:
    problem, config = mutant.cpu_case(dtype)
    spec = kernels.get_kernel(mutant.kernel)
    assert spec.space.violation(config, problem, CPU) is None, "the mutant's config must be one the search may try"
    sound = Bench(spec, problem, CPU, timer=lambda fn: (fn(), 1.0)[1]).measure(config)
    assert sound.status == "ok", sound.reason
    broken = Bench(mutant.spec(), problem, CPU, timer=NoTimer()).measure(config)
    assert broken.status == "wrong_result", (mutant.name, broken.status, broken.reason)
    assert not broken.rel_error <= 1.0


def test_every_family_has_each_kind_of_mutant() -> None:
    """The issue's list: a dropped last K tile and element, a skipped last row or column, a split-K slice
    missed, a group's or expert's offset off by one, gate and up swapped, a bias added twice."""
    bugs = {(m.kernel, m.bug) for m in MUTANTS}
    families = {kernel for kernel, _ in bugs}
    assert families == {"matmul", "grouped_matmul", "moe_matmul", "matmul_bias", "gated_matmul", "moe_gated_matmul"}
    assert ("moe_gated_matmul", "gate and up swapped") in bugs
    text = " | ".join(bug for _, bug in bugs)
    for kind in ("last K tile dropped", "last K element dropped", "last row skipped", "last column skipped",
                 "split-K sum misses a slice", "offset off by one", "offsets read one element early",
                 "gate and up swapped", "bias added twice"):
        assert kind in text, kind


# ------------------------------------------------------------------------------ valid configs: no false rejection

# Parameters that change neither what the interpreter computes nor in what order it sums: launch options and
# the tile order. Configs that differ only in these are checked once.
_SAME_NUMBERS = {"num_warps", "num_stages", "GROUP_SIZE_M", "FLATTEN", "EPILOGUE_SUBTILE"}

VALID = [("matmul", "fp16:nn:33x40x80"), ("matmul", "fp32:nn:33x40x80"), ("matmul", "fp16:nt:1x40x300"),
         ("matmul", "fp32:nt:1x40x300"),
         ("matmul", "fp16:nn:20x24x37"), ("grouped_matmul", "fp16:nn:16x32x48+20x40x64+9x24x40"),
         ("moe_matmul", "fp16:nt:" + "+".join(["5x32x64"] * 5)),
         ("moe_gated_matmul", "fp16:nt:" + "+".join(["5x32x64"] * 5)), ("matmul_bias", "fp16:nn:33x40x80"),
         ("matmul_bias", "fp32:nt:1x40x300"), ("gated_matmul", "fp16:nn:17x24x48"),
         ("gated_matmul", "fp32:nn:17x24x48")]


def _distinct(configs: list[Config]) -> list[Config]:
    chosen: dict[tuple, Config] = {}
    for config in configs:
        key = tuple(sorted((k, v) for k, v in config.as_dict().items() if k not in _SAME_NUMBERS))
        chosen.setdefault(key, config)
    return list(chosen.values())


@pytest.mark.interpreter
@pytest.mark.parametrize("kernel, key", VALID, ids=[f"{k} {p[:40]}" for k, p in VALID])
def test_no_valid_config_of_the_space_is_rejected(kernel: str, key: str) -> None:
    spec = kernels.get_kernel(kernel)
    problem = Problem.from_key(kernel, key)
    configs = _distinct(list(spec.space.enumerate(problem, CPU)))
    assert configs
    rejected = []
    for seed, config in enumerate(configs):
        verdict = check_config(spec, problem, config, torch.device("cpu"), seed)
        if not verdict.ok:
            rejected.append(f"{config}: {verdict.reason}")
    assert not rejected, f"{len(rejected)} of {len(configs)} valid configs rejected:\n" + "\n".join(rejected[:5])
