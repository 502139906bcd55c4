"""The problems tuned and benchmarked by default: the public suite of ../shared/GPU.md on a GPU, and
problems small enough for Triton's interpreter on CPU."""

from __future__ import annotations

DENSE_GPU = ("1024x768x512", "16x4096x4096", "64x4096x4096", "128x8192x8192", "512x14336x4096",
             "1000x1000x1000", "2048x2048x2048", "4096x4096x4096", "8192x8192x8192",
             "4096x28672x2048", "3333x257x4099")
DENSE_CPU = ("32x32x32", "16x64x48", "40x24x72")

# The six groups of GPU.md, then MoE groups with skewed and empty experts.
GROUPS_GPU = {
    "4x128^3": "+".join(["128x128x128"] * 4),
    "4x256^3": "+".join(["256x256x256"] * 4),
    "4x512^3": "+".join(["512x512x512"] * 4),
    "4x1024^3": "+".join(["1024x1024x1024"] * 4),
    "8 experts K=4096 N=1536": "+".join(f"{m}x1536x4096" for m in (128, 384, 640, 896, 1152, 1408, 1664, 2048)),
    "64 experts K=2048 N=768": "+".join(f"{128 + 64 * (i % 9)}x768x2048" for i in range(64)),
    "8 experts skewed+empty": "+".join(f"{m}x1536x4096" for m in (0, 2048, 16, 1024, 0, 512, 128, 96)),
    "16 experts skewed": "+".join(f"{m}x768x2048" for m in (1024, 16, 32, 0, 512, 48, 0, 256,
                                                             16, 2048, 64, 0, 128, 16, 32, 16)),
}
GROUPS_CPU = {"tiny": "16x32x32+8x16x32+0x16x16"}

# The MoE groups above (one N and K over the experts) for moe_matmul, whose operands are one token
# buffer and one weight tensor.
MOE_GPU = {name: GROUPS_GPU[name] for name in ("8 experts K=4096 N=1536", "64 experts K=2048 N=768",
                                                "8 experts skewed+empty", "16 experts skewed")}
MOE_CPU = {"tiny": "16x32x32+0x32x32+8x32x32"}
