"""Static-cache generate, 2 layers, shipped table: per compiled decode call, the host time to return (guards
checked, and skipped), and the wall time per token; vanilla and patched alternated, 15 rounds."""
import copy, json, statistics, sys, time
sys.path.insert(0, "scripts")
import torch, kernels, bench_models
kernels._native.start(block=True)
dev = torch.device("cuda")
for name in sys.argv[1].split(","):
    spec = bench_models.MODELS[name]
    vanilla = bench_models.build(spec, 2, dev, torch.bfloat16, False)
    patched = kernels.patch(copy.deepcopy(vanilla))
    models = {"vanilla": vanilla, "patched": patched}
    ids = torch.randint(1, vanilla.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1)).to(dev)
    def gen(m):
        return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                          do_sample=False, pad_token_id=0, cache_implementation="static")
    hosts = {k: [] for k in models}
    for label, m in models.items():
        gen(m); gen(m)
        inner = m._compiled_call
        def wrapped(*a, _inner=inner, _label=label, **k):
            t = time.perf_counter(); out = _inner(*a, **k); hosts[_label].append(time.perf_counter() - t); return out
        m._compiled_call = wrapped
    walls = {k: [] for k in models}; skip_hosts = {k: [] for k in models}
    for r in range(15):
        for label in (("vanilla", "patched") if r % 2 == 0 else ("patched", "vanilla")):
            torch.cuda.synchronize(); t = time.perf_counter(); gen(models[label]); torch.cuda.synchronize()
            walls[label].append((time.perf_counter() - t) / 32 * 1e3)
    calls = {k: len(v) // 15 for k, v in hosts.items()}
    guarded = {k: statistics.median(v) * 1e6 for k, v in hosts.items()}
    for k in models: hosts[k].clear()
    with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
        for r in range(5):
            for label in models:
                gen(models[label])
    unguarded = {k: statistics.median(v) * 1e6 for k, v in hosts.items()}
    print(json.dumps({"model": name, "compiled calls per generate": calls,
                      "wall ms/token": {k: round(statistics.median(v), 4) for k, v in walls.items()},
                      "wall min": {k: round(min(v), 4) for k, v in walls.items()},
                      "compiled call host us": {k: round(v, 1) for k, v in guarded.items()},
                      "... guards skipped": {k: round(v, 1) for k, v in unguarded.items()}}), flush=True)
    del models, vanilla, patched; torch.cuda.empty_cache()
