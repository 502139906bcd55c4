"""One tree's experts_cells (scripts/moe_host_cost.py of that tree) for Qwen3-30B-A3B, 2 layers, tuned db."""
import json, sys, copy, importlib
root, db, label = sys.argv[1], sys.argv[2], sys.argv[3]
sys.path.insert(0, root); sys.path.insert(0, root + "/scripts")
import torch, kernels
assert kernels.__file__.startswith(root), kernels.__file__
import bench_models, moe_host_cost
kernels.use_database(db)
kernels._native.start(block=True)
spec = bench_models.MODELS["Qwen3-30B-A3B"]
vanilla = bench_models.build(spec, 2, torch.device("cuda"), torch.bfloat16, False)
vanilla.set_experts_implementation("grouped_mm")
patched = kernels.patch(copy.deepcopy(vanilla))
with torch.no_grad():
    for tokens in (1, 8, 16, 64):
        c = moe_host_cost.experts_cells(vanilla, patched, tokens)
        print(json.dumps({"tree": label, "tokens": tokens, **{k: v for k, v in c.items()}}), flush=True)
