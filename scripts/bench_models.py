"""Whole transformers models, vanilla against ``kernels.patch(model)``: is a real model faster, and never slower?

Models are built from their transformers 5 config classes with real dimensions, a few layers and random
weights (nothing is downloaded), in bf16 on the GPU. Two parts, reported apart: "tuned" models, whose layer
shapes are in the corpus the shipped tables were tuned on (benchmarks/corpus/models.json), and "held-out"
ones that nobody tuned or fitted a rule to (benchmarks/corpus/unseen.json, or in no corpus file at all).

Settings (each a row): prefill of 512 and 4096 tokens, eager (ms per forward); ``generate`` at batch 1, 16
and 64 with the dynamic cache, eager (ms per new token); ``generate`` with ``cache_implementation="static"``
at batch 1 and 16, where transformers compiles ``forward`` itself (reduce-overhead). Columns: vanilla (for
MoE models transformers' default experts implementation, "grouped_mm", which its ``generate`` switches to
"batched_mm" for decode steps), "eager_experts" (MoE: transformers' per-expert loop), and patched. Vanilla
and patched are two copies of one model, timed in interleaved rounds, each column in each place in turn
(``round_order``: the GPU's speed drifts within a run); a cell's speed-up is the median over rounds of each
round's vanilla / patched ratio (the two timed in one round, so a drift of the host's speed between rounds
cancels). ``--control`` adds an A/A column: a second, unpatched copy of the model timed as patched is; its
ratio to vanilla is what the host's noise alone makes of a cell (1.00 ideally). A static-cache cell also gives
the GPU's own time of one call per column ("GPU x": vanilla's over patched's, and its A/A): the host paces a
small model's compiled step, so that its wall cell reads the host's noise; and the host's time in Dynamo's guard
check per compiled step, vanilla's and patched's ("guards", ``guard_check_us``). ``--profile`` writes
torch.profiler's tables of one call of each column per setting (where the time goes). Correctness: the
relative L2 error of vanilla's and patched's prefill logits to an fp32 copy of the same model; patched must
be no further than vanilla.

On a GPU the script first waits for the C++ path (kernels/_native.py; built once per machine, 35 s on a fresh
H200), as a served model's process finds it, and its header says so ("C++ path ready"): on a fresh machine a run
that did not wait timed most of its calls on the Python path (docs/BENCHMARKS.md, "A benchmark's first minute").

A time budget (--budget-s, default 400 s) stops starting new settings once spent (a static-cache one needs 90 s
of it left); skipped settings are listed as such. Imports, model builds and the last setting come on top.

    PYTHONPATH=. python scripts/bench_models.py --out $OUT                  # default set, <= ~8 min on an H100
    PYTHONPATH=. python scripts/bench_models.py --quick --out $OUT          # 2 models, no static cache, ~2 min
    TUNER_RECORD=1 PYTHONPATH=. python scripts/bench_models.py --quick --out $OUT   # also records every problem
    TRITON_INTERPRET=1 PYTHONPATH=. python scripts/bench_models.py --cpu-smoke --out /tmp/smoke  # tiny, CPU
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import logging
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch._dynamo

import kernels

LOG = logging.getLogger("bench_models")


@dataclass(frozen=True)
class ModelSpec:
    """A model to build: its transformers classes, its real config values, and which part it belongs to."""

    name: str
    part: str  # "tuned" or "held-out"
    config_class: str
    model_class: str
    config: dict
    moe: bool = False
    why: str = ""


_GQA = dict(hidden_act="silu", max_position_embeddings=8192, rope_theta=1e6)
MODELS = {spec.name: spec for spec in (
    ModelSpec("Qwen2.5-7B", "tuned", "Qwen2Config", "Qwen2ForCausalLM", dict(
        _GQA, hidden_size=3584, intermediate_size=18944, num_attention_heads=28, num_key_value_heads=4,
        vocab_size=152064), why="benchmarks/corpus/models.json, in the shipped H100 table"),
    ModelSpec("DeepSeek-V2-Lite", "tuned", "DeepseekV2Config", "DeepseekV2ForCausalLM", dict(
        hidden_size=2048, intermediate_size=10944, moe_intermediate_size=1408, n_routed_experts=64,
        num_experts_per_tok=6, n_shared_experts=2, first_k_dense_replace=1, num_attention_heads=16,
        num_key_value_heads=16, q_lora_rank=None, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64,
        v_head_dim=128, head_dim=64, n_group=1, topk_group=1, vocab_size=102400, max_position_embeddings=8192),
        moe=True, why="benchmarks/corpus/models.json (its dense first layer and shared experts tuned)"),
    ModelSpec("Llama-3.1-8B", "held-out", "LlamaConfig", "LlamaForCausalLM", dict(
        _GQA, hidden_size=4096, intermediate_size=14336, num_attention_heads=32, num_key_value_heads=8,
        vocab_size=128256, rope_theta=5e5), why="benchmarks/corpus/unseen.json"),
    ModelSpec("Qwen3-30B-A3B", "held-out", "Qwen3MoeConfig", "Qwen3MoeForCausalLM", dict(
        _GQA, hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
        num_experts_per_tok=8, num_attention_heads=32, num_key_value_heads=4, head_dim=128, vocab_size=151936,
        decoder_sparse_step=1, mlp_only_layers=[], norm_topk_prob=True),  # as released (transformers' default: False)
        moe=True, why="in no corpus file; 128 experts, top-8"),
    ModelSpec("Mixtral-8x7B", "held-out", "MixtralConfig", "MixtralForCausalLM", dict(
        _GQA, hidden_size=4096, intermediate_size=14336, num_local_experts=8, num_experts_per_tok=2,
        num_attention_heads=32, num_key_value_heads=8, vocab_size=32000), moe=True,
        why="in no corpus file; 8 large experts, top-2"),
)}
NEVER_SLOWER = 0.98  # the floor for a cell: patched / vanilla
# What a static-cache setting is assumed to take (two compiles of forward by transformers, then the rounds): an
# estimate, not a measurement; one is not started with less of the budget left.
STATIC_SETTING_S = 90.0
DEFAULT_MODELS = ("Qwen2.5-7B", "DeepSeek-V2-Lite", "Llama-3.1-8B", "Qwen3-30B-A3B")
QUICK_MODELS = ("Qwen2.5-7B", "Qwen3-30B-A3B")
SMOKE = dict(hidden_size=64, intermediate_size=128, moe_intermediate_size=32, num_attention_heads=4,
             num_key_value_heads=2, head_dim=16, vocab_size=128, kv_lora_rank=16, qk_nope_head_dim=8,
             qk_rope_head_dim=8, v_head_dim=16, n_routed_experts=4, num_experts=4, num_local_experts=4,
             num_experts_per_tok=2, n_shared_experts=1, max_position_embeddings=128)


@dataclass
class Setting:
    name: str  # prefill512, generate_b16, static_b1 ...
    kind: str  # "prefill", "generate", "static"
    tokens: int  # prompt length (prefill) or batch size (generate)


@dataclass
class Row:
    model: str
    part: str
    setting: str
    unit: str
    ms: dict = field(default_factory=dict)  # column -> median ms
    rounds: dict = field(default_factory=dict)  # column -> every round's ms
    ratios: dict = field(default_factory=dict)  # column -> median over rounds of that round's column / patched
    gpu_ms: dict = field(default_factory=dict)  # column -> the GPU's own ms per unit, one profiled call (static)
    guard_us: dict = field(default_factory=dict)  # column -> the compiled decode call's guard check, us (static)
    note: str = ""


def settings(args: argparse.Namespace, spec: ModelSpec) -> list[Setting]:
    found = [Setting(f"prefill{n}", "prefill", n) for n in args.prefill]
    found += [Setting(f"generate_b{b}", "generate", b) for b in args.batches]
    if not spec.moe or args.static_moe:  # compiling an MoE model twice more costs minutes
        found += [Setting(f"static_b{b}", "static", b) for b in args.static]
    return found


# --------------------------------------------------------------------------------------------- building

def build(spec: ModelSpec, layers: int, device: torch.device, dtype: torch.dtype, smoke: bool) -> torch.nn.Module:
    import transformers

    values = dict(spec.config, num_hidden_layers=layers, pad_token_id=0, bos_token_id=0, eos_token_id=None)
    if smoke:
        values.update({k: v for k, v in SMOKE.items() if k in values})
        if "qk_rope_head_dim" in values:  # DeepSeek's head_dim is its rope part; its one layer an MoE one
            values.update(head_dim=values["qk_rope_head_dim"], first_k_dense_replace=0)
    config = getattr(transformers, spec.config_class)(**values)
    torch.manual_seed(0)
    with torch.device(device):
        model = getattr(transformers, spec.model_class)(config)
    return model.to(dtype=dtype).eval()


def variants(spec: ModelSpec, model: torch.nn.Module, control: bool = False) -> dict[str, torch.nn.Module]:
    """The columns' models: vanilla (and, for MoE, vanilla with transformers' per-expert loop: the same
    object, switched per call), a patched copy, and with ``control`` an unpatched copy (the A/A column)."""
    patched = kernels.patch(copy.deepcopy(model))
    found = {"vanilla": model, "patched": patched, "moe": spec.moe}
    if control:
        found["control"] = copy.deepcopy(model)
    return found


def columns(spec: ModelSpec, setting: Setting, models: dict) -> tuple[str, ...]:
    # The per-expert loop syncs with the host per expert: not under a compiled static cache.
    found = ("vanilla", "eager_experts", "patched") if spec.moe and setting.kind != "static" else ("vanilla", "patched")
    return found + (("control",) if "control" in models else ())


def model_for(column: str, models: dict[str, torch.nn.Module]) -> torch.nn.Module:
    """The model a column runs; for MoE, vanilla's experts implementation switched to the column's."""
    if column in ("patched", "control"):
        return models[column]
    model = models["vanilla"]
    if models["moe"]:
        model.set_experts_implementation("eager" if column == "eager_experts" else "grouped_mm")
    return model


# ---------------------------------------------------------------------------------------------- timing

def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], object], device: torch.device, iters: int) -> float:
    """Median wall ms of ``iters`` calls, each synchronized (a generate call is long: its sync is noise)."""
    times = []
    for _ in range(iters):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def call_for(setting: Setting, model: torch.nn.Module, device: torch.device, new_tokens: int,
             vocab: int) -> tuple[Callable[[], object], float]:
    """The timed call of ``setting`` and what to divide its ms by (1 for a forward, new tokens for generate)."""
    gen = torch.Generator(device="cpu").manual_seed(setting.tokens)
    if setting.kind == "prefill":
        ids = torch.randint(1, vocab, (1, setting.tokens), generator=gen).to(device)

        def forward() -> object:
            with torch.no_grad():
                return model(ids, use_cache=False, logits_to_keep=1)
        return forward, 1.0
    ids = torch.randint(1, vocab, (setting.tokens, 16), generator=gen).to(device)
    extra = {"cache_implementation": "static"} if setting.kind == "static" else {}

    def generate() -> object:
        return model.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=new_tokens,
                              min_new_tokens=new_tokens, do_sample=False, pad_token_id=0, **extra)
    return generate, float(new_tokens)


def round_order(cols: tuple[str, ...], r: int) -> tuple[str, ...]:
    """The columns' order in round ``r``: rotated by one a round, and reversed every other pass of rotations,
    so that over the rounds each column sits in each place, first and last alike (a flip alone would keep the
    middle of three columns, patched, in the middle for good)."""
    shift = r % len(cols)
    order = cols[shift:] + cols[:shift]
    return order if (r // len(cols)) % 2 == 0 else tuple(reversed(order))


def bench_setting(spec: ModelSpec, setting: Setting, models: dict, args: argparse.Namespace,
                  device: torch.device) -> Row:
    unit = "ms/forward" if setting.kind == "prefill" else "ms/token"
    row = Row(spec.name, spec.part, setting.name, unit)
    cols = columns(spec, setting, models)
    iters = args.iters if setting.kind == "prefill" else 1
    vocab = models["vanilla"].config.vocab_size
    for col in cols:  # warm-up: compiles, dispatch resolution, transformers' compile of forward
        fn, _ = call_for(setting, model_for(col, models), device, args.new_tokens, vocab)
        fn()
        if setting.kind == "static":
            fn()  # reduce-overhead records its graphs on the second call
    for r in range(args.rounds):
        for col in round_order(cols, r):
            fn, per = call_for(setting, model_for(col, models), device, args.new_tokens, vocab)
            row.rounds.setdefault(col, []).append(timed(fn, device, iters) / per)
    row.ms = {col: statistics.median(times) for col, times in row.rounds.items()}
    row.ratios = {col: statistics.median(t / p for t, p in zip(times, row.rounds["patched"]))
                  for col, times in row.rounds.items() if col != "patched"}
    if "control" in row.rounds:  # the A/A ratio: vanilla over its unpatched copy
        row.ratios["control"] = statistics.median(v / c for v, c in zip(row.rounds["vanilla"], row.rounds["control"]))
    if setting.kind == "static" and device.type == "cuda":
        row.gpu_ms = {col: gpu_ms(call_for(setting, model_for(col, models), device, args.new_tokens, vocab))
                      for col in cols}
        row.guard_us = {col: guard_check_us(model_for(col, models),
                                            call_for(setting, model_for(col, models), device, args.new_tokens,
                                                     vocab)[0])
                        for col in cols}
    if args.profile:
        profile(setting, cols, models, args, device, Path(args.out) / "profiles" / f"{spec.name}_{setting.name}.txt")
    model_for("vanilla", models)
    return row


def guard_check_us(model: torch.nn.Module, call: Callable[[], object]) -> float | None:
    """The host's time in Dynamo's guard check per compiled decode step of ``call`` (a static-cache
    ``generate``): transformers' compiled call (``_compiled_call``) timed to its return over one ``generate``
    with the guards checked, then with them skipped (``skip_guard_eval_unsafe``), the difference of the medians.
    On the H200 host a patched 2-layer model's check cost 24-63 us a step more than vanilla's, about what our
    kernels saved the GPU (docs/BENCHMARKS.md, "The static-cache cells' host time: Dynamo's guards"). None where
    the model has no compiled call (nothing was compiled)."""
    inner = model.__dict__.get("_compiled_call")
    if inner is None:
        return None
    times: list[float] = []

    def timed(*args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        out = inner(*args, **kwargs)
        times.append(time.perf_counter() - start)
        return out

    model.__dict__["_compiled_call"] = timed
    try:
        call()
        guarded = statistics.median(times)
        times.clear()
        with torch.compiler.set_stance("default", skip_guard_eval_unsafe=True):
            call()
        skipped = statistics.median(times)
    finally:
        model.__dict__["_compiled_call"] = inner
    return round((guarded - skipped) * 1e6, 1)


def gpu_ms(timed_call: tuple[Callable[[], object], float]) -> float:
    """The GPU's own time of one call, per unit: the sum of every kernel's time in torch.profiler's record (the
    "Self CUDA time total" of its table). A static-cache step of a 2-layer model is paced by the host (1.3-2.1 ms
    of wall time a token, 0.6 ms of it on the GPU; H200, 2026-11-29, torch 2.11.0+cu130, triton 3.6.0,
    transformers 5.24.0, this script with --profile), so its wall cell moves with the host's noise (an unpatched
    copy read 0.907x of vanilla) where this one does not (0.999-1.004x)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    fn, per = timed_call
    torch.cuda.synchronize()
    with torch_profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return sum(event.self_device_time_total for event in prof.key_averages()) / 1e3 / per


def profile(setting: Setting, cols: tuple[str, ...], models: dict, args: argparse.Namespace, device: torch.device,
            path: Path) -> None:
    """torch.profiler's table of one call of each column (CPU and CUDA time per op, sorted by CUDA time)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    path.parent.mkdir(parents=True, exist_ok=True)
    parts = []
    for col in cols:
        fn, _ = call_for(setting, model_for(col, models), device, args.new_tokens, models["vanilla"].config.vocab_size)
        _sync(device)
        with torch_profile(activities=activities) as prof:
            fn()
            _sync(device)
        sort = "cuda_time_total" if device.type == "cuda" else "cpu_time_total"
        parts.append(f"==== {col}\n{prof.key_averages().table(sort_by=sort, row_limit=25, max_name_column_width=60)}")
    path.write_text("\n".join(parts))


# ------------------------------------------------------------------------------------------ correctness

def errors(spec: ModelSpec, model: torch.nn.Module, models: dict, device: torch.device, tokens: int,
           prompts: int = 1) -> dict:
    """Relative L2 error of vanilla's and patched's last-token logits to an fp32 copy's, per prompt (``prompts``
    random prompts of ``tokens``): the medians, each prompt's patched-over-vanilla ratio, and whether patched
    was no further on every prompt. One prompt's ratio moves either way with the order of a sum (Qwen3-30B-A3B
    with its tuned experts: 0.985-1.007x over 8 prompts, H200, 2026-11-29, torch 2.11.0+cu130, triton 3.6.0,
    docs/runs/2026-11-29-h200-lean-mlp/logit_errors_probe.py), so a verdict on one is a coin."""
    reference = copy.deepcopy(model).float()
    if spec.moe:
        reference.set_experts_implementation("eager")  # fp32 experts: torch's grouped GEMM takes bf16 only
    per_prompt = []
    with torch.no_grad():
        for seed in range(7, 7 + prompts):
            ids = torch.randint(1, model.config.vocab_size, (1, tokens),
                                generator=torch.Generator().manual_seed(seed)).to(device)
            want = reference(ids, use_cache=False).logits.float()
            got = {col: model_for(col, models)(ids, use_cache=False).logits.float() for col in ("vanilla", "patched")}
            per_prompt.append({col: float((out - want).norm() / want.norm()) for col, out in got.items()})
    del reference
    model_for("vanilla", models)
    ratios = [found["patched"] / found["vanilla"] if found["vanilla"] else 1.0 for found in per_prompt]
    return {"vanilla": statistics.median(f["vanilla"] for f in per_prompt),
            "patched": statistics.median(f["patched"] for f in per_prompt),
            "ratios": ratios, "patched_no_further": all(f["patched"] <= f["vanilla"] for f in per_prompt)}


# ----------------------------------------------------------------------------------------------- report

def ratio(row: Row, column: str) -> float | None:
    """Speed-up of patched over ``column`` (>1: patched faster): the median of the rounds' paired ratios;
    for "control", vanilla over its unpatched copy (the noise floor)."""
    if column in row.ratios:
        return row.ratios[column]
    if column not in row.ms or "patched" not in row.ms:
        return None
    return row.ms[column] / row.ms["patched"]


def gpu_ratio(row: Row, column: str) -> float | None:
    """Vanilla's GPU time over ``column``'s (patched, or the unpatched copy), where the cell was profiled."""
    if "vanilla" not in row.gpu_ms or not row.gpu_ms.get(column):
        return None
    return row.gpu_ms["vanilla"] / row.gpu_ms[column]


def table(rows: list[Row], checks: dict) -> str:
    lines = []
    for part in ("tuned", "held-out"):
        chosen = [r for r in rows if r.part == part]
        if not chosen:
            continue
        lines.append(f"\n{part} models (patched speed-up; >1.00 is faster)")
        lines.append(f"{'model':<18} {'setting':<13} {'vanilla ms':>11} {'patched ms':>11} {'x vanilla':>10} "
                     f"{'x eager_exp':>11} {'A/A':>6}  {'GPU x':>6} {'A/A':>6}  unit")
        speedups, controls = [], []
        for r in chosen:
            if r.note:
                lines.append(f"{r.model:<18} {r.setting:<13} {r.note}")
                continue
            vs, ve, aa = ratio(r, "vanilla"), ratio(r, "eager_experts"), ratio(r, "control")
            speedups.append(vs)
            if aa is not None:
                controls.append(aa)
            gv, ga = gpu_ratio(r, "patched"), gpu_ratio(r, "control")
            guards = ""
            if r.guard_us.get("vanilla") is not None and r.guard_us.get("patched") is not None:
                guards = f"  guards {r.guard_us['vanilla']:.0f} / {r.guard_us['patched']:.0f} us"
            lines.append(f"{r.model:<18} {r.setting:<13} {r.ms['vanilla']:>11.3f} {r.ms['patched']:>11.3f} "
                         f"{vs:>10.3f} {'' if ve is None else f'{ve:.3f}':>11} {'' if aa is None else f'{aa:.3f}':>6}"
                         f"  {'' if gv is None else f'{gv:.3f}':>6} {'' if ga is None else f'{ga:.3f}':>6}  {r.unit}"
                         f"{guards}")
        if speedups:
            geomean = statistics.geometric_mean(speedups)
            lines.append(f"{part}: geomean {geomean:.3f}x vanilla, min {min(speedups):.3f}x over {len(speedups)} cells")
        if controls:
            lines.append(f"{part}, A/A (an unpatched copy against vanilla): geomean "
                         f"{statistics.geometric_mean(controls):.3f}x, range {min(controls):.3f}-{max(controls):.3f}x")
            under = [r for r in chosen if not r.note and ratio(r, "vanilla") < NEVER_SLOWER]
            noisy = [r for r in under if ratio(r, "control") < NEVER_SLOWER]
            lines.append(f"{part}: {len(under)} cells under {NEVER_SLOWER:.2f}x, {len(noisy)} of them where the A/A "
                         f"cell reads under {NEVER_SLOWER:.2f}x too")
    lines.append("\ncorrectness (relative L2 error of last-token logits to an fp32 copy, the median over the prompts)")
    for name, found in checks.items():
        if "error" in found:
            lines.append(f"{name:<18} {found['error']}")
            continue
        ratios = found.get("ratios") or [found["patched"] / found["vanilla"]]
        further = sum(r > 1 for r in ratios)
        verdict = "ok" if found["patched_no_further"] else \
            f"patched further on {further} of {len(ratios)} prompt(s), x{min(ratios):.3f}-x{max(ratios):.3f}"
        lines.append(f"{name:<18} vanilla {found['vanilla']:.2e}  patched {found['patched']:.2e}  {verdict}")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------- main

def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ints = lambda s: [int(v) for v in s.split(",") if v]  # noqa: E731
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=lambda s: s.split(","), default=None,
                        help=f"comma-separated, of: {', '.join(MODELS)} (default: {', '.join(DEFAULT_MODELS)})")
    parser.add_argument("--layers", type=int, default=2, help="decoder layers per model (default 2)")
    parser.add_argument("--prefill", type=ints, default=[512, 4096], help="prompt lengths (default 512,4096)")
    parser.add_argument("--batches", type=ints, default=[1, 16, 64], help="dynamic-cache generate batches")
    parser.add_argument("--static", type=ints, default=[1, 16], help="static-cache generate batches ('' for none)")
    parser.add_argument("--static-moe", action="store_true", help="static-cache settings for MoE models too")
    parser.add_argument("--new-tokens", type=int, default=32, help="tokens per generate call (default 32)")
    # A round costs each column one call (a generate: 32 tokens, 0.1-0.3 s on an H200), so rounds are cheap next to
    # building and compiling the models; at 5 rounds an unpatched copy read 0.86-1.12x of vanilla per cell, at 9
    # rounds 0.95-1.03x (H200, 2026-11-28, torch 2.11.0+cu130, triton 3.6.0, this script with --control, --rounds
    # 9 for the second: docs/runs/2026-11-28-h200-models-evidence/).
    parser.add_argument("--rounds", type=int, default=15, help="interleaved rounds per setting (default 15)")
    parser.add_argument("--control", action="store_true",
                        help="time an unpatched copy as well: the A/A column, the host's noise on each cell")
    parser.add_argument("--profile", action="store_true",
                        help="write torch.profiler's tables of one call per column and setting under OUT/profiles")
    parser.add_argument("--iters", type=int, default=5, help="forwards per prefill round (default 5)")
    parser.add_argument("--check-prompts", type=int, default=4,
                        help="prompts of the logits check against an fp32 copy (default 4; medians reported)")
    parser.add_argument("--budget-s", type=float, default=400.0,
                        help="start no new setting after this many seconds, and no static-cache one with less than "
                             f"{STATIC_SETTING_S:g} s of it left (default 400)")
    parser.add_argument("--quick", action="store_true", help=f"{', '.join(QUICK_MODELS)}; prefill 512, "
                        "generate batch 1 and 16, no static cache, 2 rounds")
    parser.add_argument("--no-shipped", action="store_true",
                        help="dispatch without the tables shipped in the package: a GPU nobody tuned")
    parser.add_argument("--cpu-smoke", action="store_true", help="tiny dims on the CPU (TRITON_INTERPRET=1)")
    parser.add_argument("--out", default=os.environ.get("OUT", "bench_models_out"))
    args = parser.parse_args(argv)
    if args.quick or args.cpu_smoke:
        args.models = args.models or list(QUICK_MODELS)
        args.prefill, args.batches, args.static, args.rounds = [512], [1, 16], [], 2
    if args.cpu_smoke:
        args.layers, args.prefill, args.batches, args.new_tokens, args.rounds, args.iters = 1, [8], [1], 2, 1, 1
        args.check_prompts = min(args.check_prompts, 2)
    if args.check_prompts < 1:
        parser.error("--check-prompts must be at least 1")
    args.models = args.models or list(DEFAULT_MODELS)
    unknown = [m for m in args.models if m not in MODELS]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; choose from {', '.join(MODELS)}")
    return args


def run(args: argparse.Namespace, on_row: Callable[[list[Row], dict], None] | None = None) -> tuple[list[Row], dict]:
    """Every model's eager settings first, then the static-cache ones (each compiles twice per batch size,
    the costliest settings): a budget that runs out then costs compiled columns, not whole models. A setting
    that raises is noted in its row and the run goes on; ``on_row`` sees the rows after each setting."""
    smoke = args.cpu_smoke
    device = torch.device("cpu" if smoke else "cuda")
    dtype = torch.float16 if smoke else torch.bfloat16  # bf16 dot products are wrong under the interpreter
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 64)  # two copies compiled
    start = time.perf_counter()
    rows, checks = [], {}
    for phase in ("eager", "static"):
        for name in args.models:
            spec = MODELS[name]
            chosen = [s for s in settings(args, spec) if (s.kind == "static") == (phase == "static")]
            if not chosen:
                continue
            model = build(spec, args.layers, device, dtype, smoke)
            models = variants(spec, model, args.control)
            if phase == "eager":
                try:
                    checks[name] = errors(spec, model, models, device, 8 if smoke else 512, args.check_prompts)
                except Exception as exc:  # noqa: BLE001 - as a failing setting: noted, the timings still run
                    LOG.exception("%s: the correctness check failed", name)
                    checks[name] = {"error": f"{type(exc).__name__}: {exc}"[:200]}
            for setting in chosen:
                left = args.budget_s - (time.perf_counter() - start)
                if left <= 0 or (setting.kind == "static" and left < STATIC_SETTING_S):
                    rows.append(Row(name, spec.part, setting.name, "",
                                    note=f"skipped: --budget-s {args.budget_s:g} spent"))
                    continue
                LOG.info("%s %s", name, setting.name)
                try:
                    rows.append(bench_setting(spec, setting, models, args, device))
                except Exception as exc:  # noqa: BLE001 - one failing setting must not cost the run's other rows
                    LOG.exception("%s %s failed", name, setting.name)
                    note = f"failed: {type(exc).__name__}: {exc}"[:200]
                    rows.append(Row(name, spec.part, setting.name, "", note=note))
                if on_row is not None:
                    on_row(rows, checks)
            del model, models
            gc.collect()
            if device.type == "cuda":
                torch.cuda.empty_cache()
    return rows, checks


def main(argv: list[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    args = parse_args(argv)
    import transformers  # after parsing: --help works without it

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.no_shipped:
        kernels.use_database(use_shipped=False)  # the user's database (TUNER_DB) only
    # A served model's process finds the C++ path built (it is cached per machine after the first process):
    # wait for it, as every other benchmark here does, so that no timed call runs on the Python path while
    # it builds (a fresh machine's first process spends 40-60 s so; docs/BENCHMARKS.md).
    native = kernels._native.start(block=True) if torch.cuda.is_available() else "no GPU"
    device = kernels.current_device()
    meta = {"cxx_path": native, "shipped_tables": not args.no_shipped,
            "date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "gpu": device.name, "alias": device.alias,
            "torch": torch.__version__, "transformers": transformers.__version__,
            "triton": __import__("triton").__version__, "layers": args.layers, "rounds": args.rounds,
            "new_tokens": args.new_tokens, "argv": sys.argv[1:],
            "parts": {name: {"part": MODELS[name].part, "why": MODELS[name].why} for name in args.models}}

    def write(rows: list[Row], checks: dict) -> None:  # after every setting: a run cut short keeps its rows
        (out / "bench_models.json").write_text(json.dumps(
            {"meta": meta, "rows": [vars(r) for r in rows], "correctness": checks}, indent=1))

    rows, checks = run(args, write)
    write(rows, checks)
    text = table(rows, checks)
    (out / "bench_models.txt").write_text(text + "\n")
    print(f"{meta['gpu']}, torch {meta['torch']}, transformers {meta['transformers']}, triton {meta['triton']}, "
          f"{args.layers} layers, C++ path {native}, {meta['date']}")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
