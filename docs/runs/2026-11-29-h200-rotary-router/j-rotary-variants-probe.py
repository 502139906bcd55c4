"""Rotary kernel variants on the GPU: which one gives torch's bits."""
import torch, triton, triton.language as tl
from kernels import rope

@triton.jit
def k_native(x_ptr, cos_ptr, sin_ptr, out_ptr, D: tl.constexpr, HALF: tl.constexpr):
    r = tl.program_id(0)
    d = tl.arange(0, D)
    first = d < HALF
    partner = tl.where(first, d + HALF, d - HALF)
    x = tl.load(x_ptr + r * D + d)
    o = tl.load(x_ptr + r * D + partner)
    rot = tl.where(first, -o, o)
    cos = tl.load(cos_ptr + d); sin = tl.load(sin_ptr + d)
    a = x * cos
    c = rot * sin
    tl.store(out_ptr + r * D + d, (a.to(tl.float32) + c.to(tl.float32)).to(x.dtype))

@triton.jit
def k_f32(x_ptr, cos_ptr, sin_ptr, out_ptr, D: tl.constexpr, HALF: tl.constexpr):
    r = tl.program_id(0)
    d = tl.arange(0, D)
    first = d < HALF
    partner = tl.where(first, d + HALF, d - HALF)
    x = tl.load(x_ptr + r * D + d).to(tl.float32)
    o = tl.load(x_ptr + r * D + partner).to(tl.float32)
    rot = tl.where(first, -o, o)
    cos = tl.load(cos_ptr + d).to(tl.float32); sin = tl.load(sin_ptr + d).to(tl.float32)
    a = (x * cos).to(out_ptr.dtype.element_ty)
    c = (rot * sin).to(out_ptr.dtype.element_ty)
    tl.store(out_ptr + r * D + d, (a.to(tl.float32) + c.to(tl.float32)).to(out_ptr.dtype.element_ty))

for dtype in (torch.float16, torch.bfloat16):
    x = torch.randn(4096, 128, device="cuda").to(dtype)
    ang = torch.rand(64, device="cuda") * 100; ang = torch.cat((ang, ang))
    cos, sin = ang.cos().to(dtype), ang.sin().to(dtype)
    half = x.shape[-1] // 2
    want = x * cos + torch.cat((-x[..., half:], x[..., :half]), -1) * sin
    for name, kern, opts in (("native", k_native, {}), ("native, no fp fusion", k_native, dict(enable_fp_fusion=False)),
                             ("f32", k_f32, {}), ("f32, no fp fusion", k_f32, dict(enable_fp_fusion=False))):
        out = torch.empty_like(x)
        kern[(4096,)](x, cos, sin, out, D=128, HALF=64, **opts)
        print("variant", dtype, name, "bitwise", torch.equal(out, want), "differ", int((out != want).sum()))
