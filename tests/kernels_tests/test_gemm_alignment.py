"""The ALIGN hints change the machine code: compiled for Hopper (sm_90) on any machine, no GPU needed.

Under the interpreter a hint changes nothing, so the CPU tests of test_gemm.py cannot show that it
works. This test compiles the tiled kernel to PTX with Triton's own compiler, as the GPU would, for
a problem whose rows are 16-byte aligned but not multiples of 16 elements (1000x1000x1000), and reads
the loads: without the hint, scalar 2-byte loads and no asynchronous copies; with it, 16-byte
``cp.async`` copies that the pipeline can overlap. The compile runs in a child process because the
test session runs Triton in interpreter mode, where kernels cannot be compiled.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

_COMPILE = r'''
import json, re, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from kernels._gemm_triton import _tiled_kernel

strides, align = json.loads(sys.argv[1]), int(sys.argv[2])
# What Triton's launcher would pass: pointers 16-byte aligned, a stride of 1 as a constant, 1000 as a
# plain i32 (it does not divide by 16).
signature = {"a_ptr": "*fp16", "b_ptr": "*fp16", "c_ptr": "*fp16", "M": "i32", "N": "i32", "K": "i32"}
constants = {}
for name, stride in zip(("stride_am", "stride_ak", "stride_bk", "stride_bn", "stride_cm", "stride_cn"), strides):
    signature[name] = "constexpr" if stride == 1 else "i32"
    if stride == 1:
        constants[name] = 1
for name, value in dict(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, GROUP_SIZE_M=8, EVEN_K=False, INDEX_64=False,
                        DOT_PRECISION="ieee", ALIGN=align, C_ALIGN=align, WRAP_ALIGNED=True).items():
    signature[name] = "constexpr"
    constants[name] = value
source = ASTSource(_tiled_kernel, signature, constexprs=constants,
                   attrs={(i,): [["tt.divisibility", 16]] for i in range(3)})
ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4, "num_stages": 3}).asm["ptx"]
print(json.dumps(sorted(set(re.findall(r"(cp\.async\.cg\.shared\.global|ld\.global\.b16|st\.global\.v4)", ptx)))))
'''

LAYOUTS = {"nn": (1000, 1, 1000, 1, 1000, 1), "nt": (1000, 1, 1, 1000, 1000, 1),
           "tn": (1, 1000, 1000, 1, 1000, 1)}


def _loads(strides: tuple[int, ...], align: int) -> set[str]:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    done = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(strides), str(align)],
                          capture_output=True, text=True, env=env, timeout=300)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        if "backend" in last.lower() or "ptxas" in last.lower():
            pytest.skip(f"this triton cannot compile for sm_90 here: {last}")
        raise AssertionError(f"compiling for sm_90 failed:\n{done.stderr[-3000:]}")
    return set(json.loads(done.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_align_hint_turns_scalar_loads_into_async_16_byte_copies(layout) -> None:
    without = _loads(LAYOUTS[layout], align=1)
    with_hint = _loads(LAYOUTS[layout], align=8)
    assert "ld.global.b16" in without and "cp.async.cg.shared.global" not in without
    assert "cp.async.cg.shared.global" in with_hint and "ld.global.b16" not in with_hint
    assert "st.global.v4" in with_hint  # C_ALIGN: the stores are 16 bytes wide too
