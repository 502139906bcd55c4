"""Temporary GPU probe for kernels/grouped.py (deleted after use): host overhead."""
import random, time
import torch, triton
from kernels import grouped
from kernels.grouped import GROUPED_MATMUL, default_config
from kernels._device import current_device
from kernels._spec import Problem

dev = current_device("cuda")
p = Problem("grouped_matmul", "fp16", "nn", tuple((random.Random(i).randrange(128, 641), 768, 2048) for i in range(64)))
As, Bs = GROUPED_MATMUL.make_inputs(p, "cuda", 0)
config = default_config(p, dev)
GROUPED_MATMUL.run(config, (As, Bs)); torch.cuda.synchronize()


def clock(name, fn, n=100):
    fn(); torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(n):
        r = fn()
    t1 = time.perf_counter(); torch.cuda.synchronize()
    print(f"{name:28s} {(t1 - t0) / n * 1e6:9.1f} us", flush=True)
    return r

problem = clock("problem_of", lambda: grouped.problem_of(As, Bs))
Cs = clock("alloc C", lambda: [torch.empty((m, n), dtype=As[0].dtype, device="cuda") for m, n, _ in problem.shapes])
tiles = grouped._tile_counts(problem.shapes, 64, 64)
vals = clock("table values", lambda: grouped._table_values(As, Bs, Cs, tiles))
clock("torch.tensor pinned", lambda: torch.tensor(vals, dtype=torch.int64, pin_memory=True))
clock("torch.tensor plain", lambda: torch.tensor(vals, dtype=torch.int64))
clock("empty pinned", lambda: torch.empty(len(vals), dtype=torch.int64, pin_memory=True))
table = clock("_to_device", lambda: grouped._to_device(vals, torch.device("cuda")))
spec = clock("_specialize", lambda: grouped._specialize(As, Bs, problem.shapes))
k = grouped._grouped_matmul_kernel
def launch():
    return k[(132,)](table, len(As), DTYPE=grouped._TL_DTYPES[As[0].dtype], BLOCK_M=64, BLOCK_N=64, BLOCK_K=32,
                     A_M_UNIT=spec.A_M_UNIT, A_K_UNIT=spec.A_K_UNIT, B_K_UNIT=spec.B_K_UNIT, B_N_UNIT=spec.B_N_UNIT,
                     ALIGNED=spec.ALIGNED, num_warps=4, num_stages=3)
clock("launch", launch)
print("cache sizes", {d: len(c[0]) for d, c in k.device_caches.items()})
clock("whole run", lambda: GROUPED_MATMUL.run(config, (As, Bs)))
print("cache sizes", {d: len(c[0]) for d, c in k.device_caches.items()})
