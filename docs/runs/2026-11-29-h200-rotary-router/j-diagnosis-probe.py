"""Which patch option moves Qwen3-30B-A3B's logits (tuned experts database), and does the rotary kernel match."""
import copy, sys, torch
sys.path.insert(0, "scripts")
import bench_models, kernels
from kernels import rope
from kernels._routing import top_k_softmax, top_k_softmax_reference
torch.manual_seed(0)
# rotary: bitwise?
for dtype in (torch.float16, torch.bfloat16):
    q = torch.randn(1, 5, 4, 64, device="cuda").to(dtype).transpose(1, 2); k = q[:, :2]
    ang = torch.rand(1, 5, 32, device="cuda") * 100; ang = torch.cat((ang, ang), -1)
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    want = rope.rotary_reference(q, k, cos, sin)
    for fusion in (True, False):
        rope._LAUNCHES.clear()
        orig = rope.DirectLaunch
        got = rope.apply_rotary(q, k, cos, sin)
        print("rope", dtype, "bitwise", [torch.equal(a, b) for a, b in zip(got, want)], "max diff", max((a.float()-b.float()).abs().max().item() for a, b in zip(got, want)))
        break
# router kernel in bf16 on the GPU
for rows in (1, 16, 512):
    l = torch.randn(rows, 128, device="cuda").bfloat16()
    s, e = top_k_softmax(l, 8, True, torch.bfloat16); rs, re_ = top_k_softmax_reference(l, 8, True, torch.bfloat16)
    p = torch.softmax(l, -1, dtype=torch.float32)
    print("router bf16", rows, "same experts", torch.equal(p.gather(1, e), p.gather(1, re_)), "score diff", (s.float()-rs.float()).abs().max().item())
spec = bench_models.MODELS["Qwen3-30B-A3B"] if hasattr(bench_models, "MODELS") else None
print("spec", spec is not None)
import os
spec = bench_models.MODELS["Qwen3-30B-A3B"]
dev = torch.device("cuda")
model = bench_models.build(spec, 2, dev, torch.bfloat16, False)
ref = copy.deepcopy(model).float(); ref.set_experts_implementation("eager")
ids = torch.randint(1, model.config.vocab_size, (1, 512), generator=torch.Generator().manual_seed(7)).to(dev)
with torch.no_grad():
    want = ref(ids, use_cache=False).logits.float()
    err = lambda m: round(float((m(ids, use_cache=False).logits.float() - want).norm() / want.norm()), 5)
    print("vanilla", err(model))
    for opts in ({}, dict(fuse_router=False), dict(fuse_norm=False), dict(fuse_router=False, fuse_norm=False),
                 dict(fuse_router=False, fuse_norm=False, fuse_mlp=False, fuse_qkv=False)):
        m = kernels.patch(copy.deepcopy(model), **opts)
        print(opts, err(m), flush=True)
        del m
    # decode-size rows through one patched router against vanilla's
    m = kernels.patch(copy.deepcopy(model))
    g, g0 = m.model.layers[0].mlp.gate, model.model.layers[0].mlp.gate
    for rows in (1, 16, 512):
        x = torch.randn(rows, 2048, device=dev).bfloat16()
        a, b = g(x), g0(x)
        p = torch.softmax(b[0], -1, dtype=torch.float32)
        print("model router", rows, type(g).__name__, torch.equal(a[0], b[0]), torch.equal(p.gather(1, a[2]).sort(1).values, p.gather(1, b[2]).sort(1).values), (a[1].float()-b[1].float()).abs().max().item())
