"""The host-side Python of an eager MoE call on the CPU machine (no GPU): each Triton launch left out
(``DirectLaunch.__call__`` made a no-op), the median of 3000 timed calls after 200 warm ones, in us.

    TRITON_INTERPRET=1 python3 cpu_call_probe.py ROOT     # ROOT: the tree to import kernels from

Prints the public ``kernels.moe_matmul`` and ``kernels.ops.moe_matmul_call`` on a decode-sized call (64 rows, 128
experts), and transformers' whole experts call (Qwen3-MoE's experts at
8 tokens, top-8; the sort's Python timed, its result taken from a real run)."""

import os
import statistics
import sys
import time

os.environ.setdefault("TRITON_INTERPRET", "1")
sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402

import kernels  # noqa: E402
from kernels import _launch, ops  # noqa: E402

assert kernels.__file__.startswith(os.path.abspath(sys.argv[1])), kernels.__file__


def median_us(fn, calls: int = 3000) -> float:
    for _ in range(200):
        fn()
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return round(statistics.median(times) * 1e6, 2)


E, H, I = 128, 256, 128
x = torch.randn(64, H, dtype=torch.bfloat16)
w = torch.randn(E, I, H, dtype=torch.bfloat16).transpose(1, 2)
offsets = torch.sort(torch.randint(0, 64, (E,)))[0].to(torch.int32)
offsets[-1] = 64
experts = None
try:
    from transformers import Qwen3MoeConfig
    from transformers.models.qwen3_moe.modeling_qwen3_moe import Qwen3MoeExperts

    from kernels import hf
    experts = Qwen3MoeExperts(Qwen3MoeConfig(hidden_size=H, moe_intermediate_size=I, num_experts=E,
                                             num_experts_per_tok=8)).to(torch.bfloat16)
    tokens = torch.randn(8, H, dtype=torch.bfloat16)
    index = torch.stack([torch.randperm(E)[:8] for _ in range(8)])
    weights = torch.rand(8, 8, dtype=torch.bfloat16)
    with torch.no_grad():
        hf.experts_forward(experts, tokens, index, weights)  # compiles (interpreter), keeps what it keeps
        routed = hf.sort_by_expert(index.reshape(-1), E, 8)
except ImportError:
    pass
_launch.DirectLaunch.__call__ = lambda self, *args: None  # the launches left out: their Python only
with torch.no_grad():
    print("kernels.moe_matmul", median_us(lambda: kernels.moe_matmul(x, w, offsets)))
    print("ops.moe_matmul_call", median_us(lambda: ops.moe_matmul_call(x, w, offsets, True)))
    if experts is not None:
        sort = hf.sort_by_expert
        hf.sort_by_expert = lambda *args: (sort(*args), routed)[1]
        print("experts_forward", median_us(lambda: hf.experts_forward(experts, tokens, index, weights)))
