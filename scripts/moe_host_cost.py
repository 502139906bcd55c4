"""Where a patched MoE model's eager decode time goes: host and loop time of each experts implementation and of our
path's pieces, the MoE block, the dense modules, and ``generate`` at batch 1 and 16 (GPU only).

    python3 scripts/moe_host_cost.py --db sqlite:///tuned.db --out DIR [--model Qwen3-30B-A3B] [--layers 2]

Per call: "host" is the median time to return with the GPU idle before the call (what the host spends launching
it), "loop" the mean over back-to-back calls with one synchronize at the end (the slower of host and GPU paces
it), "graph" the GPU time of the call replayed in a CUDA graph. Writes DIR/moe_host.json, and DIR/prof-*.txt
(torch.profiler, self CPU time) and DIR/cprof-*.txt (cProfile, cumulative) of one ``generate`` at batch 1 per
model. The patched model is ``kernels.patch`` of a copy of vanilla, with the database given; ``generate`` also runs
a third copy, patched with its experts handed back to transformers ("patched, stock experts"), which splits a
gap between the dense modules and the experts. The script waits for the C++ path first (docs/BENCHMARKS.md,
"The MoE decode step's host time", "A benchmark's first minute, and the experts' sort").
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_models  # noqa: E402  (scripts/ is not a package)

GENERATE_TOKENS = 32


def host_and_loop_us(fn: Callable[[], object], calls: int = 200, device: torch.device | None = None) -> dict:
    """"host": the median time for ``fn()`` to return with the device idle before it (after 20 warm calls);
    "loop": the mean of ``calls`` back-to-back calls, one synchronize at the end (the slower of host and GPU paces
    it). On the CPU (``device`` cpu) the two are the same clock."""
    sync = bench_models._sync
    device = device or torch.device("cuda")
    hosts = []
    for _ in range(calls):
        sync(device)
        start = time.perf_counter()
        fn()
        hosts.append(time.perf_counter() - start)
    sync(device)
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    sync(device)
    loop = (time.perf_counter() - start) / calls
    return dict(host_us=round(statistics.median(hosts[20:]) * 1e6, 1), loop_us=round(loop * 1e6, 1))


def graph_gpu_us(fn: Callable[[], object], replays: int = 50) -> float:
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    for _ in range(replays):
        graph.replay()
    end.record()
    torch.cuda.synchronize()
    return round(begin.elapsed_time(end) / replays * 1e3, 1)


def experts_cells(vanilla: torch.nn.Module, patched: torch.nn.Module, tokens: int) -> dict:
    """One layer's experts at ``tokens`` tokens: transformers' two implementations, ours, and our pieces."""
    from transformers.integrations import moe as hf_moe

    import kernels
    from kernels import hf, ops
    from kernels._routing import combine, sort_by_expert

    ours, theirs = patched.model.layers[0].mlp.experts, vanilla.model.layers[0].mlp.experts
    experts, top_k = ours.gate_up_proj.shape[0], vanilla.config.num_experts_per_tok
    device, hidden = ours.gate_up_proj.device, vanilla.config.hidden_size
    gen = torch.Generator().manual_seed(tokens)
    x = torch.randn(tokens, hidden, generator=gen).to(device, torch.bfloat16)
    index = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)]).to(device)
    weights = torch.softmax(torch.randn(tokens, top_k, generator=gen), -1).to(device, torch.bfloat16)
    gate_up, down = ours.gate_up_proj.transpose(1, 2), ours.down_proj.transpose(1, 2)
    rows = tokens * top_k
    cells: dict = {"path": hf._path(x, rows, gate_up, down, True)}
    for name, forward, module in (("grouped_mm", hf_moe.grouped_mm_experts_forward, theirs),
                                  ("batched_mm", hf_moe.batched_mm_experts_forward, theirs),
                                  ("ours", hf.experts_forward, ours)):
        call = lambda: forward(module, x, index, weights)  # noqa: E731
        call()
        cells[name] = dict(host_and_loop_us(call), graph_gpu_us=graph_gpu_us(call))
    routed = sort_by_expert(index.reshape(-1), experts, top_k)
    offsets, position = routed.offsets, routed.position
    sorted_rows = x.index_select(0, routed.token)
    h = ops.moe_gated_matmul_call(sorted_rows, gate_up, offsets, True)
    out = ops.moe_matmul_call(h, down, offsets, True)
    kept = hf._kept(ours)
    pieces = {"_path, kept": lambda: hf._kept_path(kept, x, rows),
              "sort_by_expert": lambda: sort_by_expert(index.reshape(-1), experts, top_k),
              "gather rows": lambda: x.index_select(0, routed.token),
              "moe_gated_matmul_call": lambda: ops.moe_gated_matmul_call(sorted_rows, gate_up, offsets, True),
              "torch._grouped_mm gate_up": lambda: torch._grouped_mm(sorted_rows, gate_up, offs=offsets),
              "moe_matmul_call down": lambda: ops.moe_matmul_call(h, down, offsets, True),
              "torch._grouped_mm down": lambda: torch._grouped_mm(h, down, offs=offsets),
              "kernels.moe_matmul down": lambda: kernels.moe_matmul(h, down, offsets),
              "combine": lambda: combine(out, position, weights, x.dtype)}
    for name, call in pieces.items():
        call()
        cells["piece " + name] = host_and_loop_us(call)
    return cells


def generate_cells(models: dict[str, torch.nn.Module], batch: int, rounds: int, out: Path) -> dict:
    device = next(models["vanilla"].parameters()).device
    ids = torch.randint(1, 1000, (batch, 16), device=device)

    def generate(model: torch.nn.Module) -> Callable[[], object]:
        return lambda: model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=GENERATE_TOKENS,
                                      min_new_tokens=GENERATE_TOKENS, do_sample=False, pad_token_id=0)

    calls = {name: generate(model) for name, model in models.items()}
    for call in calls.values():
        call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for r in range(rounds):  # interleaved, the order flipped every other round
        for name in (list(calls) if r % 2 == 0 else list(calls)[::-1]):
            torch.cuda.synchronize()
            start = time.perf_counter()
            calls[name]()
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - start) * 1e3 / GENERATE_TOKENS)
    if batch == 1:
        from torch.profiler import ProfilerActivity, profile

        for name, call in calls.items():
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                call()
                torch.cuda.synchronize()
            (out / f"prof-{name.replace(', ', '-').replace(' ', '_')}.txt").write_text(prof.key_averages().table(
                sort_by="self_cpu_time_total", row_limit=60, max_name_column_width=70))
            profiler = cProfile.Profile()
            profiler.enable()
            call()
            torch.cuda.synchronize()
            profiler.disable()
            text = io.StringIO()
            pstats.Stats(profiler, stream=text).sort_stats("cumulative").print_stats(70)
            (out / f"cprof-{name.replace(', ', '-').replace(' ', '_')}.txt").write_text(text.getvalue())
    return {f"{name} ms/token": round(statistics.median(t), 3) for name, t in times.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--db", required=True, help="the tuned database's SQLAlchemy URL")
    parser.add_argument("--out", required=True, help="folder for moe_host.json and the profiles")
    parser.add_argument("--model", default="Qwen3-30B-A3B", help="a MoE model of scripts/bench_models.py")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5, help="interleaved generate rounds per batch")
    args = parser.parse_args(argv)
    spec = bench_models.MODELS.get(args.model)
    if spec is None or not spec.moe:
        parser.error(f"--model {args.model!r} is not a MoE model of scripts/bench_models.py; choose one of "
                     + ", ".join(name for name, s in bench_models.MODELS.items() if s.moe))
    if not torch.cuda.is_available():
        parser.error("this script times the GPU: run it on a machine with a CUDA GPU")
    import kernels

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    kernels.use_database(args.db)
    # Wait for the C++ path (built once per machine, cached after): a served model's calls take it.
    print(json.dumps({"C++ path": kernels._native.start(block=True)}), flush=True)
    vanilla = bench_models.build(spec, args.layers, torch.device("cuda"), torch.bfloat16, False)
    vanilla.set_experts_implementation("grouped_mm")
    patched = kernels.patch(copy.deepcopy(vanilla))
    # The dense modules patched, the experts transformers' own: splits a model's gap between the two.
    dense_only = kernels.patch(copy.deepcopy(vanilla))
    dense_only.set_experts_implementation("grouped_mm")
    found: dict = {}
    with torch.no_grad():
        for tokens in (1, 8, 16, 64):  # 8 tokens: 64 rows over Qwen3's 128 experts
            found[f"experts, {tokens} tokens"] = experts_cells(vanilla, patched, tokens)
            print(json.dumps({f"experts, {tokens} tokens": found[f"experts, {tokens} tokens"]}), flush=True)
        for tokens in (1, 16):
            x = torch.randn(1, tokens, vanilla.config.hidden_size, device="cuda", dtype=torch.bfloat16)
            attn_out = torch.randn(1, tokens, vanilla.model.layers[0].self_attn.o_proj.in_features, device="cuda",
                                   dtype=torch.bfloat16)
            cells = {}
            for name, model in (("vanilla", vanilla), ("patched", patched)):
                layer = model.model.layers[0]
                parts = {"moe block": lambda: layer.mlp(x), "q, k, v": lambda: (
                    layer.self_attn.q_proj(x), layer.self_attn.k_proj(x), layer.self_attn.v_proj(x)),
                    "o_proj": lambda: layer.self_attn.o_proj(attn_out),
                    "router gate": lambda: layer.mlp.gate(x), "lm_head": lambda: model.lm_head(x[:, -1:])}
                for part, call in parts.items():
                    call()
                    cells[f"{part}, {name}"] = host_and_loop_us(call)
            found[f"modules, {tokens} tokens"] = cells
            print(json.dumps({f"modules, {tokens} tokens": cells}), flush=True)
    for batch in (1, 16):
        models = {"vanilla": vanilla, "patched": patched, "patched, stock experts": dense_only}
        found[f"generate, batch {batch}"] = generate_cells(models, batch, args.rounds, out)
        print(json.dumps({f"generate, batch {batch}": found[f"generate, batch {batch}"]}), flush=True)
    (out / "moe_host.json").write_text(json.dumps(found, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
