"""generate at small batches: vanilla, patched with the one-token decode rule (batched_mm), patched without it."""
import copy, json, statistics, sys, time
sys.path.insert(0, "scripts")
import torch, kernels, bench_models
from kernels import hf
kernels.use_database(sys.argv[1])
kernels._native.start(block=True)
spec = bench_models.MODELS["Qwen3-30B-A3B"]
vanilla = bench_models.build(spec, 2, torch.device("cuda"), torch.bfloat16, False)
patched = kernels.patch(copy.deepcopy(vanilla))
rule = hf._BATCHED_DECODE_BYTES
for batch in (1, 2):
    setting = bench_models.Setting(f"generate_b{batch}", "generate", batch) if hasattr(bench_models, "Setting") else None
    cols = {}
    for name, model, threshold in (("vanilla", vanilla, rule), ("rule on", patched, rule), ("rule off", patched, 0)):
        fn, per = bench_models.call_for(setting, model, torch.device("cuda"), 32, vanilla.config.vocab_size)
        cols[name] = (fn, per, threshold)
    for fn, per, threshold in cols.values():
        hf._BATCHED_DECODE_BYTES = threshold; fn()
    times = {n: [] for n in cols}
    for r in range(21):
        order = list(cols) if r % 2 == 0 else list(cols)[::-1]
        order = order[r % 3:] + order[:r % 3]
        for n in order:
            fn, per, threshold = cols[n]
            hf._BATCHED_DECODE_BYTES = threshold
            torch.cuda.synchronize(); t = time.perf_counter(); fn(); torch.cuda.synchronize()
            times[n].append((time.perf_counter() - t) * 1e3 / per)
    hf._BATCHED_DECODE_BYTES = rule
    med = {n: round(statistics.median(v), 3) for n, v in times.items()}
    print(json.dumps({"batch": batch, "ms/token median": med,
                      "vanilla/rule on": round(med["vanilla"] / med["rule on"], 3),
                      "vanilla/rule off": round(med["vanilla"] / med["rule off"], 3),
                      "min": {n: round(min(v), 3) for n, v in times.items()}}), flush=True)
