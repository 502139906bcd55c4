"""Static-cache generate, 2 layers, the shipped table: host time of one compiled decode call (guards checked and
skipped) for vanilla and for patch variants; Dynamo reset before each variant (vanilla compiled again beside it)."""
import copy, json, statistics, sys, time
sys.path.insert(0, "scripts")
import torch, torch.nn as nn, kernels, bench_models
from kernels import nn as knn
kernels._native.start(block=True)
dev = torch.device("cuda")

def unpatch_linears(model):
    for m in model.modules():
        if type(m) is knn.Linear:
            m.__class__ = nn.Linear
    return model

VARIANTS = {
    "all": lambda m: kernels.patch(m),
    "linears": lambda m: kernels.patch(m, fuse_mlp=False, fuse_qkv=False, fuse_norm=False, fuse_rotary=False, fuse_router=False),
    "fusions": lambda m: unpatch_linears(kernels.patch(m)),
    "all-norm": lambda m: kernels.patch(m, fuse_norm=False),
    "all-mlp": lambda m: kernels.patch(m, fuse_mlp=False),
}
for name, chosen in (("DeepSeek-V2-Lite", ("all", "linears", "fusions", "all-norm", "all-mlp")),
                     ("Llama-3.1-8B", ("all", "linears", "fusions", "all-norm", "all-mlp"))):
    spec = bench_models.MODELS[name]
    vanilla = bench_models.build(spec, 2, dev, torch.bfloat16, False)
    ids = torch.randint(1, vanilla.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1)).to(dev)
    def gen(m):
        return m.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                          do_sample=False, pad_token_id=0, cache_implementation="static")
    for variant in chosen:
        torch._dynamo.reset()
        for m in (vanilla,):
            m.__dict__.pop("_compiled_call", None)
        other = VARIANTS[variant](copy.deepcopy(vanilla))
        models = {"vanilla": vanilla, variant: other}
        hosts = {k: [] for k in models}
        for label, m in models.items():
            m.__dict__.pop("_compiled_call", None)
            gen(m); gen(m)
            inner = m._compiled_call
            def wrapped(*a, _inner=inner, _label=label, **k):
                t = time.perf_counter(); out = _inner(*a, **k); hosts[_label].append(time.perf_counter() - t); return out
            m._compiled_call = wrapped
        for label in models: hosts[label].clear()
        for r in range(6):
            for label in ((list(models)) if r % 2 == 0 else list(models)[::-1]):
                gen(models[label])
        guarded = {k: round(statistics.median(v) * 1e6, 1) for k, v in hosts.items()}
        for k in models: hosts[k].clear()
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            for r in range(4):
                for label in models:
                    gen(models[label])
        unguarded = {k: round(statistics.median(v) * 1e6, 1) for k, v in hosts.items()}
        print(json.dumps({"model": name, "variant": variant, "guarded us": guarded, "unguarded us": unguarded,
                          "check us": {k: round(guarded[k] - unguarded[k], 1) for k in models}}), flush=True)
        del other, models
        vanilla.__dict__.pop("_compiled_call", None)
    del vanilla; torch.cuda.empty_cache()
