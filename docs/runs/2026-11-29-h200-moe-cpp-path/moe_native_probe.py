"""The experts' calls with the C++ path serving MoE plans ("cpp") against the same process with it suspended
("python", the kept plans of 2026-11-29), alternated; Qwen3-30B-A3B, 2 layers, the tuned database argv[1]."""
import copy, json, sys
sys.path.insert(0, "scripts")
import torch, kernels, bench_models, moe_host_cost
from kernels import _native
kernels.use_database(sys.argv[1]); print("native:", _native.start(block=True), flush=True)
spec = bench_models.MODELS["Qwen3-30B-A3B"]
vanilla = bench_models.build(spec, 2, torch.device("cuda"), torch.bfloat16, False)
patched = kernels.patch(copy.deepcopy(vanilla))
keep = ("ours", "grouped_mm", "batched_mm", "piece moe_matmul_call down", "piece torch._grouped_mm down",
        "piece kernels.moe_matmul down", "piece moe_gated_matmul_call", "piece torch._grouped_mm gate_up")
with torch.no_grad():
    for repeat in range(2):
        for tokens in (1, 8, 16, 64):
            for label in (("cpp", "python") if repeat == 0 else ("python", "cpp")):
                if label == "python":
                    _native.suspend()
                launches, baseline = _native.launches(), _native.moe_baseline_calls()
                cells = moe_host_cost.experts_cells(vanilla, patched, tokens)
                if label == "python":
                    _native.resume()
                row = {"repeat": repeat, "tokens": tokens, "label": label, "path": str(cells["path"]),
                       "cpp launches": _native.launches() - launches,
                       "cpp grouped_mm": _native.moe_baseline_calls() - baseline}
                row.update({k: cells[k]["host_us"] for k in keep})
                print(json.dumps(row), flush=True)
