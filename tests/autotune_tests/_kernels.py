"""Small kernels for the autotune tests: ``y = 2 * x`` over blocks, decorated as a user would decorate them."""

from __future__ import annotations

import torch
import triton
import triton.language as tl

import kernels
from kernels import Key, Launch, Space

# Where the kernels run: the GPU where there is one, else the CPU under the interpreter (tests/conftest.py).
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


class FakeTimer:
    """A test double for the GPU timer only: under the interpreter there are no CUDA events, and wall-clock times
    are noise. It runs the call once (so faults surface), counts calls, and returns the next of ``times``
    (cycling), so a test decides which candidate is fastest."""

    def __init__(self, times: tuple[float, ...] = (1.0,)) -> None:
        self.times = times
        self.calls = 0

    def __call__(self, fn, quantiles=None) -> list[float]:
        fn()
        ms = self.times[self.calls % len(self.times)]
        self.calls += 1
        return [ms, ms, ms]


@triton.jit
def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, 2 * tl.load(x_ptr + offs, mask=offs < n), mask=offs < n)


CONFIGS = [triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((16, 1), (32, 2), (64, 4))]


def inputs(key: Key) -> Launch:
    n = int(key["n"])
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)).to(DEVICE)
    y = torch.empty_like(x)
    return Launch(lambda meta: (triton.cdiv(n, meta["BLOCK"]),), (x, y, n))


def reference(x, y, n) -> None:
    y.copy_(2 * x)


def call(kernel, n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.randn(n, generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    y = torch.full_like(x, float("nan"))  # poisoned: a call that writes nothing fails the check
    kernel[lambda meta: (triton.cdiv(n, meta["BLOCK"]),)](x, y, n)
    return x, y


# What the CLI tests name as --kernel tests.autotune_tests._kernels:cli_kernel (its timer is the double above).
CLI_TIMER = FakeTimer((3.0, 1.0, 2.0))
cli_kernel = kernels.autotune(configs=CONFIGS, key=["n"], inputs=inputs, reference=reference, do_bench=CLI_TIMER,
                              name="tests.autotune_tests.scale")(scale)
SPACE = Space({"BLOCK": [8, 16, 32, 64, 128], "num_warps": [1, 2, 4]},
              constraints=(lambda c, k: c["BLOCK"] <= max(8, int(k["n"])),))
space_kernel = kernels.autotune(key=["n"], space=SPACE, inputs=inputs, do_bench=FakeTimer(),
                                name="tests.autotune_tests.scale_space")(scale)
