"""Host time of one call of a compiled transformers model: vanilla against ``kernels.patch``'s, per fusion.

Under ``torch.compile`` a CUDA-graphed step (transformers' static-cache ``generate``) costs the host Dynamo's
own work on every call: the guards' check, then gathering the graph's inputs and writing back its side
effects. A patched module's traced path reads more state than torch's (its route, the fused MLP's
bookkeeping, the query/key/value group), and each read can become a guard. This script measures that work
alone: the model is compiled with a backend that returns the first call's outputs without running anything,
so a call's time is Dynamo's. ``unguarded`` times the same call with the guards' check skipped
(``torch.compiler.set_stance(skip_guard_eval_unsafe=True)``), so the difference is the check's. "in Python"
counts the guards Dynamo checks in Python (the rest it checks in C++).

Each variant runs in a fresh process (compiled code and caches of one never touch another's), rounds
alternate the variants, and a cell is the median over rounds. On a machine without a GPU the model runs
under Triton's interpreter, where ``kernels.patch(everywhere=True)`` patches what it patches on a GPU.

    PYTHONPATH=. python3 scripts/compile_host_cost.py [--layers 2] [--rounds 3] [--variants vanilla,linears,all]

Variants: ``vanilla``; ``linears`` (Linears patched, no fusion); ``mlp``, ``qkv``, ``norm``, ``rotary`` (the
Linears and that one fusion); ``all`` (every fusion).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import statistics
import subprocess
import sys
import timeit
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
FUSIONS = {"mlp": "fuse_mlp", "qkv": "fuse_qkv", "norm": "fuse_norm", "rotary": "fuse_rotary"}
VARIANTS = ("vanilla", "linears", *FUSIONS, "all")


def measure(variant: str, layers: int, calls: int) -> dict:
    """One variant, in this process: guard count, and the compiled call's time with and without the check."""
    import copy

    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    import kernels

    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=layers, num_attention_heads=4,
                         num_key_value_heads=2, vocab_size=128, max_position_embeddings=64)
    model = LlamaForCausalLM(config).to(device).eval()
    if variant != "vanilla":
        flags = {flag: variant == "all" or variant == name for name, flag in FUSIONS.items()}
        model = kernels.patch(copy.deepcopy(model), everywhere=True, **flags)
    ids = torch.randint(0, 128, (1, 8), device=device)
    guards = len(torch._dynamo.explain(model)(input_ids=ids, use_cache=False).out_guards)
    torch._dynamo.reset()
    python_guards = len(python_checked_guards(model, ids))

    def outputs_of_the_first_call(graph: torch.fx.GraphModule, inputs: list) -> object:
        out = graph(*inputs)
        return lambda *args: out

    compiled = torch.compile(model, backend=outputs_of_the_first_call, fullgraph=True)
    with torch.no_grad():
        compiled(input_ids=ids, use_cache=False)
        guarded = min(timeit.repeat(lambda: compiled(input_ids=ids, use_cache=False), number=calls, repeat=5))
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            unguarded = min(timeit.repeat(lambda: compiled(input_ids=ids, use_cache=False), number=calls, repeat=5))
    return {"variant": variant, "guards": guards, "python_guards": python_guards, "guarded_us": guarded / calls * 1e6,
            "unguarded_us": unguarded / calls * 1e6}


class _GuardLines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.extend(line for line in record.getMessage().splitlines() if "LAMBDA_GUARD: " in line)


def python_checked_guards(model: object, ids: object) -> list[str]:
    """The compiled call's guards that Dynamo checks in Python (LAMBDA_GUARD: object aliasing, and the like), as
    TORCH_LOGS=guards prints them; it checks the rest in C++. Each costs the host a Python call on every call of
    the compiled model (docs/PYTORCH.md, "Guards"). Dynamo's caches are reset before and after."""
    import torch

    handler = _GuardLines()
    logger = logging.getLogger("torch._dynamo.guards.__guards")  # the "guards" artifact's logger
    logger.addHandler(handler)
    torch._logging.set_logs(guards=True)
    try:
        torch._dynamo.reset()
        compiled = torch.compile(model, backend=lambda graph, inputs: graph, fullgraph=True)
        with torch.no_grad():
            compiled(input_ids=ids, use_cache=False)
    finally:
        torch._logging.set_logs()
        logger.removeHandler(handler)
        torch._dynamo.reset()
    if not handler.lines:
        raise RuntimeError("no guard was logged: torch's guard logging changed, and nothing was counted")
    return [line.split("LAMBDA_GUARD: ")[1].split("  #")[0] for line in handler.lines]


def run_in_a_fresh_process(variant: str, layers: int, calls: int) -> dict:
    import torch

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p))
    if not torch.cuda.is_available():
        env["TRITON_INTERPRET"] = "1"  # kernels.patch patches on the CPU under the interpreter alone
    done = subprocess.run([sys.executable, __file__, "--one", variant, "--layers", str(layers), "--calls", str(calls)],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"{variant}: the measuring process failed:\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--layers", type=int, default=2, help="decoder layers (default 2)")
    parser.add_argument("--rounds", type=int, default=3, help="fresh processes per variant, alternating (default 3)")
    parser.add_argument("--calls", type=int, default=1000, help="compiled calls per timing (default 1000)")
    parser.add_argument("--variants", default="vanilla,linears,all",
                        help=f"comma-separated, of: {', '.join(VARIANTS)} (default vanilla,linears,all)")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a child's variant
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(measure(args.one, args.layers, args.calls)))
        return
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in VARIANTS]
    if unknown or not variants:
        parser.error(f"--variants {args.variants}: unknown {', '.join(unknown) or 'none given'}; "
                     f"choose from {', '.join(VARIANTS)}")
    readings: dict[str, list[dict]] = {v: [] for v in variants}
    for round_number in range(args.rounds):
        order = variants if round_number % 2 == 0 else variants[::-1]
        for variant in order:
            readings[variant].append(run_in_a_fresh_process(variant, args.layers, args.calls))
    import torch
    import transformers

    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{'GPU ' + torch.cuda.get_device_name() if torch.cuda.is_available() else 'CPU (Triton interpreter)'}, "
          f"{args.layers} layers, {args.rounds} rounds of {args.calls} calls, medians")
    rows = []
    base = statistics.median(r["guarded_us"] for r in readings[variants[0]])
    print(f"{'variant':10s} {'guards':>7s} {'in Python':>10s} {'call us':>8s} {'unguarded us':>13s} {'check us':>9s} "
          f"{'vs ' + variants[0]:>12s}")
    for variant in variants:
        guarded = statistics.median(r["guarded_us"] for r in readings[variant])
        unguarded = statistics.median(r["unguarded_us"] for r in readings[variant])
        row = {"variant": variant, "guards": readings[variant][0]["guards"],
               "python_guards": readings[variant][0]["python_guards"], "guarded_us": guarded,
               "unguarded_us": unguarded, "readings": readings[variant]}
        rows.append(row)
        print(f"{variant:10s} {row['guards']:7d} {row['python_guards']:10d} {guarded:8.1f} {unguarded:13.1f} "
              f"{guarded - unguarded:9.1f} {guarded - base:+12.1f}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
