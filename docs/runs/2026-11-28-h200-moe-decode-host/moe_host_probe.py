"""Where a patched Qwen3-30B-A3B (2 layers, bf16, tuned database) loses decode time: host and loop time per
experts call, per MoE block, and profiles of generate at batch 1."""
import copy, cProfile, io, json, pstats, statistics, sys, time
import torch
sys.path.insert(0, "scripts")
import bench_models as bm
import kernels
from kernels import hf

out = sys.argv[2]
kernels.use_database(sys.argv[1])
dev = torch.device("cuda")
spec = bm.MODELS["Qwen3-30B-A3B"]
model = bm.build(spec, 2, dev, torch.bfloat16, False)
model.set_experts_implementation("grouped_mm")
patched = kernels.patch(copy.deepcopy(model))
print("patched experts impl:", patched.config._experts_implementation, flush=True)

def host_and_loop(fn, n=200):
    hs = []
    for _ in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter(); fn(); hs.append(time.perf_counter() - t0)
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return statistics.median(hs[20:]) * 1e6, (time.perf_counter() - t0) / n * 1e6

def gpu_us(fn, n=50):
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(); s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn(); fn()
    torch.cuda.current_stream().wait_stream(s)
    try:
        with torch.cuda.graph(g):
            fn()
    except Exception as e:
        return float("nan")
    g.replay(); torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(True), torch.cuda.Event(True)
    e0.record()
    for _ in range(n): g.replay()
    e1.record(); torch.cuda.synchronize()
    return e0.elapsed_time(e1) / n * 1e3

res = {}
ev = model.model.layers[0].mlp.experts
ep = patched.model.layers[0].mlp.experts
H = model.config.hidden_size
with torch.no_grad():
    for tokens in (1, 16, 64):
        g = torch.Generator(device="cpu").manual_seed(tokens)
        x = torch.randn(tokens, H, generator=g).to(dev, torch.bfloat16)
        idx = torch.stack([torch.randperm(128, generator=g)[:8] for _ in range(tokens)]).to(dev)
        w = torch.softmax(torch.randn(tokens, 8, generator=g), -1).to(dev, torch.bfloat16)
        rows = tokens * 8
        gu = ep.gate_up_proj.transpose(1, 2); dn = ep.down_proj.transpose(1, 2)
        path = hf._path(x, rows, gu, dn, True)
        cells = {}
        for name, impl, mod in (("grouped_mm", hf._hf_moe.grouped_mm_experts_forward, ev),
                                ("batched_mm", hf._hf_moe.batched_mm_experts_forward, ev),
                                ("ours", hf.experts_forward, ep)):
            fn = lambda: impl(mod, x, idx, w)
            fn(); fn()
            h, l = host_and_loop(fn)
            cells[name] = dict(host_us=round(h, 1), loop_us=round(l, 1), graph_gpu_us=round(gpu_us(fn), 1))
        # the pieces of our path
        from kernels._routing import sort_by_expert
        from kernels import ops
        perm, position, offsets, _ = sort_by_expert(idx.reshape(-1), 128)
        r = x[perm // 8]
        pieces = {"_path": lambda: hf._path(x, rows, gu, dn, True), "sort_by_expert": lambda: sort_by_expert(idx.reshape(-1), 128),
                  "gather rows": lambda: x[perm // 8],
                  "moe_gated_matmul_call": lambda: ops.moe_gated_matmul_call(r, gu, offsets, True),
                  "moe_matmul_call gate_up": lambda: ops.moe_matmul_call(r, gu, offsets, True),
                  "torch._grouped_mm gate_up": lambda: torch._grouped_mm(r, gu, offs=offsets)}
        h1 = ops.moe_gated_matmul_call(r, gu, offsets, True)
        pieces["moe_matmul_call down"] = lambda: ops.moe_matmul_call(h1, dn, offsets, True)
        pieces["torch._grouped_mm down"] = lambda: torch._grouped_mm(h1, dn, offs=offsets)
        for name, fn in pieces.items():
            fn()
            h, l = host_and_loop(fn)
            cells["piece " + name] = dict(host_us=round(h, 1), loop_us=round(l, 1))
        cells["path"] = path
        res[f"experts T={tokens} rows={rows}"] = cells
        print(tokens, json.dumps(cells, indent=1), flush=True)
    # whole MoE block
    bv, bp = model.model.layers[0].mlp, patched.model.layers[0].mlp
    for tokens in (1, 16):
        x = torch.randn(1, tokens, H, device=dev, dtype=torch.bfloat16)
        cells = {}
        for name, mod in (("vanilla grouped_mm", bv), ("patched", bp)):
            fn = lambda: mod(x)
            fn()
            h, l = host_and_loop(fn)
            cells[name] = dict(host_us=round(h, 1), loop_us=round(l, 1))
        model.set_experts_implementation("batched_mm")
        fn = lambda: bv(x); fn()
        h, l = host_and_loop(fn); cells["vanilla batched_mm"] = dict(host_us=round(h, 1), loop_us=round(l, 1))
        model.set_experts_implementation("grouped_mm")
        res[f"block T={tokens}"] = cells
        print("block", tokens, cells, flush=True)
    for tokens in (1, 16):
        x = torch.randn(1, tokens, H, device=dev, dtype=torch.bfloat16)
        xo = torch.randn(1, tokens, model.config.num_attention_heads * model.config.head_dim, device=dev, dtype=torch.bfloat16)
        cells = {}
        for name, m in (("vanilla", model), ("patched", patched)):
            a = m.model.layers[0].self_attn
            parts = {"q,k,v": lambda: (a.q_proj(x), a.k_proj(x), a.v_proj(x)), "o_proj": lambda: a.o_proj(xo),
                     "router gate": lambda: m.model.layers[0].mlp.gate(x), "lm_head": lambda: m.lm_head(x[:, -1:]),
                     "input_layernorm": lambda: m.model.layers[0].input_layernorm(x)}
            for part, fn in parts.items():
                fn(); fn()
                h, l = host_and_loop(fn)
                cells[f"{part} {name}"] = dict(host_us=round(h, 1), loop_us=round(l, 1))
            cells[f"types {name}"] = {n: type(mm).__name__ for n, mm in a.named_children()}
        res[f"modules T={tokens}"] = cells
        print("modules", tokens, json.dumps(cells, indent=0), flush=True)
    # whole layers, decode-like: one token through each decoder layer's module list, patched vs vanilla
def gen(m, batch):
    ids = torch.randint(1, 1000, (batch, 16), device=dev)
    return lambda: m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                              do_sample=False, pad_token_id=0)
for batch in (1, 16):
    fns = {name: gen(m, batch) for name, m in (("vanilla", model), ("patched", patched))}
    times = {name: [] for name in fns}
    for fn in fns.values():
        fn(); fn()
    for r in range(5):
        for name in (list(fns) if r % 2 == 0 else list(fns)[::-1]):
            torch.cuda.synchronize(); t0 = time.perf_counter(); fns[name](); torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t0) * 1e3 / 32)
    for name in fns:
        res[f"generate b{batch} ms/token {name}"] = round(statistics.median(times[name]), 3)
    if batch == 1:
        from torch.profiler import ProfilerActivity, profile
        for name, fn in fns.items():
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                fn(); torch.cuda.synchronize()
            open(f"{out}/prof-{name}.txt", "w").write(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=60, max_name_column_width=70))
            pr = cProfile.Profile(); pr.enable(); fn(); torch.cuda.synchronize(); pr.disable()
            s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("cumulative").print_stats(70); open(f"{out}/cprof-{name}.txt", "w").write(s.getvalue())
print(json.dumps({k: v for k, v in res.items() if k.startswith("generate")}), flush=True)
json.dump(res, open(f"{out}/moe_host.json", "w"), indent=1)
