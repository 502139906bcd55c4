"""Patched and vanilla logits against an fp32 copy over 8 prompts (bench_models' check uses one)."""
import copy, json, sys, os
sys.path.insert(0, "scripts")
import torch, kernels, bench_models
kernels._native.start(block=True)
dev = torch.device("cuda")
for name in sys.argv[1:]:
    spec = bench_models.MODELS[name]
    model = bench_models.build(spec, 2, dev, torch.bfloat16, False)
    models = bench_models.variants(spec, model, False)
    reference = copy.deepcopy(model).float()
    if spec.moe:
        reference.set_experts_implementation("eager")
    rows = []
    with torch.no_grad():
        for seed in range(8):
            ids = torch.randint(1, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(seed)).to(dev)
            want = reference(ids, use_cache=False).logits.float()
            got = {col: bench_models.model_for(col, models)(ids, use_cache=False).logits.float() for col in ("vanilla", "patched")}
            rows.append({col: float((o - want).norm() / want.norm()) for col, o in got.items()})
            print(json.dumps({"model": name, "seed": seed, **rows[-1]}), flush=True)
    ratios = sorted(r["patched"] / r["vanilla"] for r in rows)
    print(json.dumps({"model": name, "patched/vanilla per prompt": [round(x, 4) for x in ratios],
                      "patched no further in": sum(x <= 1 for x in ratios)}), flush=True)
    del model, models, reference
    torch.cuda.empty_cache()
