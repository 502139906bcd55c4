"""Probe: our experts call's host time by cumulative stage, the sort's variants by row count, on one H200."""
import json, statistics, sys, time, copy
from pathlib import Path
import torch
sys.path.insert(0, "scripts")
import bench_models
import kernels
from kernels import hf, ops, _routing
from transformers.integrations import moe as hf_moe

def host_loop(fn, calls=200):
    hosts = []
    for _ in range(calls):
        torch.cuda.synchronize(); t = time.perf_counter(); fn(); hosts.append(time.perf_counter() - t)
    torch.cuda.synchronize(); t = time.perf_counter()
    for _ in range(calls): fn()
    torch.cuda.synchronize()
    return [round(statistics.median(hosts[20:]) * 1e6, 1), round((time.perf_counter() - t) / calls * 1e6, 1)]

def gpu_us(fn, reps=50):
    try:
        return _gpu_us(fn, reps)
    except Exception as e:
        torch.cuda.synchronize()
        return str(e)[:80]

def _gpu_us(fn, reps):
    fn(); torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s): fn()
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g): fn()
    g.replay(); torch.cuda.synchronize()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    a.record()
    for _ in range(reps): g.replay()
    b.record(); torch.cuda.synchronize()
    return round(a.elapsed_time(b) / reps * 1e3, 1)

out = Path(sys.argv[2]); out.mkdir(parents=True, exist_ok=True)
kernels.use_database(sys.argv[1])
print("C++ path", kernels._native.start(block=True), flush=True)
spec = bench_models.MODELS["Qwen3-30B-A3B"]
vanilla = bench_models.build(spec, 1, torch.device("cuda"), torch.bfloat16, False)
vanilla.set_experts_implementation("grouped_mm")
patched = kernels.patch(copy.deepcopy(vanilla))
ours, theirs = patched.model.layers[0].mlp.experts, vanilla.model.layers[0].mlp.experts
E, K = ours.gate_up_proj.shape[0], vanilla.config.num_experts_per_tok
H = vanilla.config.hidden_size
found = {}
with torch.no_grad():
    for tokens in (() if len(sys.argv) > 3 else (1, 16, 512)):
        g = torch.Generator().manual_seed(tokens)
        x = torch.randn(tokens, H, generator=g).cuda().bfloat16()
        index = torch.stack([torch.randperm(E, generator=g)[:K] for _ in range(tokens)]).cuda()
        weights = torch.softmax(torch.randn(tokens, K, generator=g), -1).cuda().bfloat16()
        gu = ours.gate_up_proj.transpose(1, 2); dn = ours.down_proj.transpose(1, 2)
        rows = tokens * K
        path = hf._path(x, rows, gu, dn, True)
        def stage(n):
            def f():
                hf._takes(ours, x)
                a = ours.gate_up_proj.transpose(1, 2); b = ours.down_proj.transpose(1, 2)
                torch.compiler.is_compiling(); torch.is_grad_enabled()
                p = hf._path(x, rows, a, b, True)
                if n == 0: return
                routed = _routing.sort_by_expert(index.reshape(-1), E, K)
                offsets, position = routed.offsets, routed.position
                if n == 1: return
                r = x.index_select(0, routed.token)
                if n == 2: return
                h = ops.moe_gated_matmul_call(r, a, offsets, True) if p == "fused" else ops.moe_matmul_call(r, a, offsets, True)
                if n == 3: return
                d = ops.moe_matmul_call(h[:, :b.shape[1]] if p != "fused" else h, b, offsets, True)
                if n == 4: return
                return _routing.combine(d, position, weights, x.dtype)
            return f
        cells = {"path": path}
        for rep in range(1):
            for name, f in [("stage%d" % n, stage(n)) for n in range(6)] + [
                    ("ours", lambda: hf.experts_forward(ours, x, index, weights)),
                    ("batched_mm", lambda: hf_moe.batched_mm_experts_forward(theirs, x, index, weights)),
                    ("grouped_mm", lambda: hf_moe.grouped_mm_experts_forward(theirs, x, index, weights))]:
                f()
                cells.setdefault(name, []).append(host_loop(f))
        for name, f in (("ours", lambda: hf.experts_forward(ours, x, index, weights)),
                        ("batched_mm", lambda: hf_moe.batched_mm_experts_forward(theirs, x, index, weights)),
                        ("grouped_mm", lambda: hf_moe.grouped_mm_experts_forward(theirs, x, index, weights))):
            cells[name + " gpu"] = gpu_us(f)
        found[f"experts {tokens} tokens"] = cells
        print(tokens, json.dumps(cells), flush=True)
    sorts = {}
    for rows in (8, 128, 512, 520, 1024, 2048, 4096, 8192, 16384, 32768):
        flat = torch.randint(0, E, (rows,), device="cuda")
        cell = {}
        cell["triton"] = host_loop(lambda: _routing._sort_in_triton(flat, E, K)) + [gpu_us(lambda: _routing._sort_in_triton(flat, E, K))]
        limit = _routing._TRITON_ROWS
        _routing._TRITON_ROWS = 0
        cell["torch ops"] = host_loop(lambda: _routing.sort_by_expert(flat, E, K)) + [gpu_us(lambda: _routing.sort_by_expert(flat, E, K))]
        _routing._TRITON_ROWS = limit
        sorts[rows] = cell
        print("sort", rows, json.dumps(cell), flush=True)
    found["sorts"] = sorts
(out / "stages.json").write_text(json.dumps(found, indent=1))
