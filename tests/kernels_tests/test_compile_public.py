"""The public functions inside ``torch.compile(fullgraph=True)`` (issue 43): ``kernels.matmul`` (and its ``out=``),
``matmul_bias``, ``gated_matmul``, ``grouped_matmul``, ``moe_matmul`` (and its ``out=``) and ``moe_gated_matmul``,
and on a GPU a ``kernels.autotune``'d user kernel.

Each case runs in a fresh process (tests/kernels_tests/_compile_case.py), so that no eager call made before it
(by this test or another) hides what a first call compiled does: Dynamo's explain counts 0 graph breaks, the
first call compiled matches torch, then an eager call, then a ``dynamic=True`` compile runs two shapes in one
graph. On the CPU (interpreter) each function runs in the default mode on its own, and all of them in one graph
under "reduce-overhead" and "max-autotune" (a compile takes several seconds on a 2-core machine; Inductor's CPU
backend skips CUDA graphs, so these modes differ there only in what Inductor tunes). On a GPU (marked ``gpu``)
every function runs in every mode on its own: "reduce-overhead" captures and replays CUDA graphs there.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CASE = Path(__file__).with_name("_compile_case.py")
# Each public function, with the out= forms beside the call they belong to.
FUNCTIONS = {"matmul": ["matmul", "matmul_out"], "matmul_bias": ["matmul_bias"], "gated_matmul": ["gated_matmul"],
             "grouped_matmul": ["grouped_matmul"], "moe_matmul": ["moe_matmul", "moe_matmul_out"],
             "moe_gated_matmul": ["moe_gated_matmul"]}
EVERY_CALL = [name for names in FUNCTIONS.values() for name in names]
CASE_LIMIT_S = 600  # a case took 7-11 s on the 2-core CPU machine (torch 2.13.0+cpu, 2026-11-28), unloaded


def _run_case(tmp_path: Path, mode: str, names: list[str]) -> None:
    # The root first, then whatever the caller's path holds (packages installed to a --target folder).
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, PYTHONPATH=path, TUNER_DB=f"sqlite:///{tmp_path / 'tuner.db'}")
    env.pop("TUNER_RECORD", None)
    if not _has_gpu():
        env["TRITON_INTERPRET"] = "1"
    done = subprocess.run([sys.executable, str(CASE), mode, *names], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=CASE_LIMIT_S)
    assert done.returncode == 0, f"{mode} {names}:\n{done.stdout[-4000:]}\n{done.stderr[-8000:]}"
    assert f"ok: {mode} {' '.join(names)}" in done.stdout


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("function", list(FUNCTIONS))
def test_a_public_function_compiles_whole_first_and_after_eager_calls(tmp_path: Path, function: str) -> None:
    _run_case(tmp_path, "default", FUNCTIONS[function])


@pytest.mark.parametrize("mode", ["reduce-overhead", "max-autotune"])
def test_every_public_function_compiles_whole_in_one_graph_under_each_mode(tmp_path: Path, mode: str) -> None:
    _run_case(tmp_path, mode, EVERY_CALL)


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune"])
@pytest.mark.parametrize("function", list(FUNCTIONS))
def test_on_the_gpu_each_public_function_compiles_whole_under_each_mode(tmp_path: Path, function: str,
                                                                        mode: str) -> None:
    _run_case(tmp_path, mode, FUNCTIONS[function])


@pytest.mark.gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead", "max-autotune"])
def test_on_the_gpu_a_kernels_autotune_kernel_compiles_whole_under_each_mode(tmp_path: Path, mode: str) -> None:
    # A user's kernel, tuned on its first eager call: compiled first it runs its first config, compiled after the
    # eager call its tuned one; with dynamic=True its rows stay symbolic (one graph for two row counts).
    _run_case(tmp_path, mode, ["autotune"])


@pytest.mark.gpu
def test_on_the_gpu_a_kernels_autotune_config_pre_hook_runs_in_the_compiled_graph(tmp_path: Path) -> None:
    # The hook zeroes the NaN-filled output the kernel adds into: a graph without it returns NaN.
    _run_case(tmp_path, "default", ["autotune_hook"])
