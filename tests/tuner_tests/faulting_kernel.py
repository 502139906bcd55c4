"""A kernel that faults the GPU on one problem, for the fleet's fault tests; importing it registers it.

``faulting_matmul`` is the real matmul family, except that on a problem with M == ``FAULTING_M`` every
candidate first stores far outside any allocation, a real illegal address on a GPU. Workers load it through
``TUNER_IMPORT=tests.tuner_tests.faulting_kernel`` (the CLI, and the compile and timing workers, import the
modules it names).

On a machine without a GPU no store can fault a device, so there the run raises the error PyTorch raises
for one instead: a stand-in for what cannot happen on the CPU, and the only double in these tests.
"""

from __future__ import annotations

import dataclasses

import torch
import triton
import triton.language as tl

import kernels

NAME = "faulting_matmul"
FAULTING_M = 48
CPU_STAND_IN = "CUDA error: an illegal memory access was encountered (the CPU stand-in for a GPU fault)"


@triton.jit
def _store_far_away(ptr):
    tl.store(ptr + (1 << 40), 1.0)  # a terabyte past the tensor: no allocation is there


def _run(config: kernels.Config, inputs: tuple):
    a = inputs[0]
    if a.shape[0] == FAULTING_M:
        if not a.is_cuda:
            raise RuntimeError(CPU_STAND_IN)
        _store_far_away[(1,)](torch.empty(1, device=a.device, dtype=torch.float32))
        torch.cuda.synchronize()
    return _MATMUL.run(config, inputs)


_MATMUL = kernels.get_kernel("matmul")
if NAME not in kernels.KERNELS:
    kernels.KERNELS[NAME] = dataclasses.replace(_MATMUL, name=NAME, run=_run)
