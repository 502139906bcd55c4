"""A/B of kernels.patch variants on whole-model forwards (2 layers, bf16): loops of 100 forwards per sample,
interleaved rounds, median; no table (the no-shipped database) then the tuned database (argv[1])."""
import copy, statistics, sys, time
import torch
sys.path.insert(0, "scripts")
import bench_models as bm
import kernels

dev = torch.device("cuda")
def loop_ms(fn, n=100):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - t0) * 1e3 / n

for table, url, shipped in (("no table", "sqlite:////tmp/none.db", False), ("tuned db + shipped", sys.argv[1], True)):
    kernels.use_database(url, use_shipped=shipped)
    for name in ("Qwen2.5-7B", "Llama-3.1-8B"):
        model = bm.build(bm.MODELS[name], 2, dev, torch.bfloat16, False)
        cols = {"vanilla": model, "control": copy.deepcopy(model),
                "patched": kernels.patch(copy.deepcopy(model)),
                "patched_no_qkv": kernels.patch(copy.deepcopy(model), fuse_qkv=False)}
        for shape in ((1, 1), (16, 1), (1, 512)):
            ids = torch.randint(1, 1000, shape, device=dev)
            res = {c: [] for c in cols}
            with torch.no_grad():
                for m in cols.values():
                    loop_ms(lambda: m(ids, use_cache=False, logits_to_keep=1), 10)
                for r in range(9):
                    order = list(cols) if r % 2 == 0 else list(cols)[::-1]
                    for c in order:
                        m = cols[c]
                        res[c].append(loop_ms(lambda: m(ids, use_cache=False, logits_to_keep=1)))
            v = res["vanilla"]
            ratio = {c: statistics.median(a / b for a, b in zip(v, res[c])) for c in cols if c != "vanilla"}
            print(f"{table:20s} {name:13s} {str(shape):9s} vanilla {statistics.median(v):.3f} ms  " +
                  "  ".join(f"{c} {x:.3f}x" for c, x in ratio.items()), flush=True)
