"""Which config and plan the experts' two GEMMs take per routed row count (Qwen3-30B-A3B, tuned db)."""
import copy, json, sys
sys.path.insert(0, "scripts")
import torch, kernels, bench_models, moe_host_cost
from kernels import hf, moe, moe_gated, _grouped_dispatch as gd
from kernels._routing import sort_by_expert
kernels.use_database(sys.argv[1]); kernels._native.start(block=True)
spec = bench_models.MODELS["Qwen3-30B-A3B"]
vanilla = bench_models.build(spec, 2, torch.device("cuda"), torch.bfloat16, False)
patched = kernels.patch(copy.deepcopy(vanilla))
ours = patched.model.layers[0].mlp.experts
gate_up, down = ours.gate_up_proj.transpose(1, 2), ours.down_proj.transpose(1, 2)
with torch.no_grad():
    for tokens in (1, 8, 16, 64):
        x = torch.randn(tokens, 2048, device="cuda", dtype=torch.bfloat16)
        index = torch.stack([torch.randperm(128)[:8] for _ in range(tokens)]).cuda()
        routed = sort_by_expert(index.reshape(-1), 128, 8)
        rows = x.index_select(0, routed.token)
        h = kernels.moe_gated_matmul(rows, gate_up, routed.offsets)
        kernels.moe_matmul(h, down, routed.offsets)
        p_g = gd._READY.get(gd._signature(True, rows, gate_up, routed.offsets))
        p_d = gd._READY.get(gd._signature(False, h, down, routed.offsets))
        t = {"gate plan": None if p_g is None else str(p_g.kernel is not None), "down plan": None if p_d is None else str(p_d.kernel is not None),
             "gate config": str(moe_gated.resolve(moe_gated.dispatch_key(rows, gate_up, "eager"))),
             "down config": str(moe.resolve(moe.dispatch_key(h, down, "eager")))}
        for name, fn in (("public down", lambda: kernels.moe_matmul(h, down, routed.offsets)),
                         ("grouped_mm down", lambda: torch._grouped_mm(h, down, offs=routed.offsets)),
                         ("public down 2", lambda: kernels.moe_matmul(h, down, routed.offsets)),
                         ("grouped_mm down 2", lambda: torch._grouped_mm(h, down, offs=routed.offsets))):
            fn(); t[name] = moe_host_cost.host_and_loop_us(fn)["host_us"]
        print(json.dumps({"tokens": tokens, **t}), flush=True)
