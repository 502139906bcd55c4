"""One model alone in its process (argv: model, variant vanilla|patched|all-norm): static-cache generate, 2 layers,
the shipped table; host time of a compiled decode call with guards checked and skipped, and Dynamo's cache."""
import copy, json, statistics, sys, time
sys.path.insert(0, "scripts")
import torch, kernels, bench_models
kernels._native.start(block=True)
dev = torch.device("cuda")
name, variant = sys.argv[1], sys.argv[2]
model = bench_models.build(bench_models.MODELS[name], 2, dev, torch.bfloat16, False)
if variant == "patched":
    model = kernels.patch(model)
elif variant == "all-norm":
    model = kernels.patch(model, fuse_norm=False)
ids = torch.randint(1, model.config.vocab_size, (1, 16), generator=torch.Generator().manual_seed(1)).to(dev)
def gen():
    return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32, min_new_tokens=32,
                          do_sample=False, pad_token_id=0, cache_implementation="static")
gen(); gen()
inner = model._compiled_call
hosts = []
def wrapped(*a, **k):
    t = time.perf_counter(); out = inner(*a, **k); hosts.append(time.perf_counter() - t); return out
model._compiled_call = wrapped
walls = []
for _ in range(10):
    torch.cuda.synchronize(); t = time.perf_counter(); gen(); torch.cuda.synchronize(); walls.append((time.perf_counter() - t) / 32 * 1e3)
guarded = statistics.median(hosts) * 1e6
hosts.clear()
with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
    for _ in range(6):
        gen()
unguarded = statistics.median(hosts) * 1e6
entries = torch._C._dynamo.eval_frame._debug_get_cache_entry_list(torch.nn.Module._wrapped_call_impl.__code__)
print(json.dumps({"model": name, "variant": variant, "guarded us": round(guarded, 1), "unguarded us": round(unguarded, 1),
                  "check us": round(guarded - unguarded, 1), "wall ms/token": round(statistics.median(walls), 4),
                  "cache entries": len(entries)}), flush=True)
