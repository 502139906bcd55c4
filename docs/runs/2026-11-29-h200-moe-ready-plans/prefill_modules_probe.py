"""Dense modules at ROWS rows (default 512: prefill 512), vanilla against patched (shipped table): host and loop us
per call, each column twice. ``ROWS=16 python3 prefill_modules_probe.py MODEL ...``."""
import copy, json, os, sys
sys.path.insert(0, "scripts")
import torch, kernels, bench_models
from moe_host_cost import host_and_loop_us
kernels._native.start(block=True)
for name in sys.argv[1:]:
    spec = bench_models.MODELS[name]
    vanilla = bench_models.build(spec, 2, torch.device("cuda"), torch.bfloat16, False)
    patched = kernels.patch(copy.deepcopy(vanilla))
    v_mods, p_mods = dict(vanilla.named_modules()), dict(patched.named_modules())
    rows = {}
    with torch.no_grad():
        for path, module in v_mods.items():
            if ".layers.1." in path or path not in p_mods:
                continue
            leaf = isinstance(module, torch.nn.Linear)
            if not (leaf or path.endswith(".mlp") or path.endswith("self_attn")):
                continue
            if p_mods[path] is module or (leaf and type(p_mods[path]) is type(module)):
                rows[path] = "same module"; continue
            if path.endswith("self_attn"):
                continue
            width = module.in_features if leaf else vanilla.config.hidden_size
            tokens = 1 if path == "lm_head" else int(os.environ.get("ROWS", "512"))
            x = torch.randn(1, tokens, width, device="cuda", dtype=torch.bfloat16)
            cell = {}
            for col, mods in (("vanilla", v_mods), ("patched", p_mods), ("vanilla2", v_mods), ("patched2", p_mods)):
                m = mods[path]
                try:
                    m(x)
                except Exception as e:  # a module that needs more than x
                    cell[col] = repr(e)[:80]; continue
                cell[col] = host_and_loop_us(lambda: m(x), 100)
            cell["type"] = type(p_mods[path]).__name__
            rows[path] = cell
            print(json.dumps({name: {path: cell}, "rows": tokens}), flush=True)
