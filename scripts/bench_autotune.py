"""kernels.autotune against triton.autotune on Triton's tutorials (examples/), on the GPU.

Four figures per kernel family (fused softmax, layer-norm forward, the matmul tutorial with its configs list):

- first call: wall time of a key's first call (compile + tuning + launch, synchronised) in a fresh process,
  for a first process on an empty database and an empty Triton cache, then a second process on both as the
  first left them; for kernels.autotune, triton.autotune, and triton.autotune(cache_results=True);
- tuned time: do_bench median of the tuned call, kernels.autotune (the list; for layer-norm also a ``space``)
  against triton.autotune's pick from the same list; the space's geomean target is >= 1.05x;
- tuning time for the same quality: matmul with a list of more than 20 configs, triton.autotune's exhaustive
  pass against ``python -m tuner search``'s pipeline (a resumable Optuna study, 40% of the list's size in trials);
- incremental: calls until mode "incremental" converges, and its worst call against the converged call.

    PYTHONPATH=. python scripts/bench_autotune.py --out runs/autotune
    PYTHONPATH=. python scripts/bench_autotune.py --smoke        # CPU interpreter, tiny shapes: checks the script

``--smoke`` times with the wall clock on tiny shapes: its numbers mean nothing. JSON goes to DIR/bench_autotune.json.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# family -> shapes timed for the tuned-time figure (the first is also the fresh-process and incremental one)
SHAPES = {"softmax": [(4096, 781), (4096, 4000)], "layer_norm": [(4096, 1024), (4096, 8192)],
          "matmul": [(1024, 1024, 1024), (512, 4096, 4096)]}
SMOKE_SHAPES = {"softmax": [(4, 37)], "layer_norm": [(4, 37)], "matmul": [(16, 16, 16)]}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter, epilog=__doc__)
    p.add_argument("--out", default=None, metavar="DIR", help="write DIR/bench_autotune.json")
    p.add_argument("--families", default="softmax,layer_norm,matmul", help="comma-separated (default: all three)")
    p.add_argument("--no-processes", action="store_true", help="skip the fresh-process first-call figures")
    p.add_argument("--budget-s", type=float, default=240.0,
                   help="seconds after which the parts not yet started are skipped (default 240: the run then "
                        "ends within about 5 minutes on an H100); the JSON lists what was skipped")
    p.add_argument("--smoke", action="store_true", help="CPU interpreter, tiny shapes, wall clock: checks the script")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    unknown = set(args.families.split(",")) - set(SHAPES)
    if unknown:
        p.error(f"--families {args.families}: unknown {', '.join(sorted(unknown))}; choose from {', '.join(SHAPES)}")
    return args


# The calls ------------------------------------------------------------------------------------------------

def _device() -> str:
    import torch

    return "cuda" if torch.cuda.is_available() and not os.environ.get("TRITON_INTERPRET") else "cpu"


def make_call(family: str, shape: tuple, kernel) -> Callable[[], object]:
    """A no-argument call of ``family``'s launcher at ``shape`` through ``kernel`` (any wrapper of its jit)."""
    import torch

    from examples import layer_norm, matmul, softmax

    gen = torch.Generator(device=_device()).manual_seed(0)
    if family == "softmax":
        x = torch.randn(*shape, device=_device(), generator=gen)
        return lambda: softmax.softmax(x, kernel=kernel)
    if family == "layer_norm":
        x = torch.randn(*shape, device=_device(), generator=gen, dtype=torch.float16)
        w = torch.rand(shape[1], device=_device(), generator=gen, dtype=torch.float16)
        b = torch.randn(shape[1], device=_device(), generator=gen, dtype=torch.float16)
        return lambda: layer_norm.layer_norm(x, w, b, kernel=kernel)
    m, n, k = shape
    a = torch.randn(m, k, device=_device(), generator=gen, dtype=torch.float16)
    bm = torch.randn(k, n, device=_device(), generator=gen, dtype=torch.float16)
    return lambda: matmul.matmul(a, bm, kernel=kernel)


def wrappers(family: str, impl: str, db: str | None, timer: Callable | None = None) -> object:
    """The family's jit function under ``impl``: kernels (the list), kernels-space, triton, triton-cache."""
    import triton

    import kernels
    from examples import layer_norm, matmul, softmax

    tuner = {"softmax": softmax.softmax_kernel, "layer_norm": layer_norm.layer_norm_kernel,
             "matmul": matmul.matmul_kernel}[family]
    if impl.startswith("triton"):
        return triton.autotune(configs=tuner._triton_configs, key=tuner.keys, do_bench=timer,
                               cache_results=impl == "triton-cache")(tuner.fn)
    space = layer_norm.SPACE if impl == "kernels-space" else None
    return kernels.autotune(configs=tuner._triton_configs, key=tuner.keys, space=space, do_bench=timer, db=db,
                            name=f"{tuner.name}{'_space' if space else ''}", mode="on")(tuner.fn)


def _sync() -> None:
    import torch

    if torch.cuda.is_available() and _device() == "cuda":
        torch.cuda.synchronize()


def timer_for(smoke: bool) -> Callable | None:
    """None (each wrapper's own do_bench) on the GPU; under --smoke a wall-clock stand-in, as there are no events."""
    if not smoke:
        return None

    def wall(fn, quantiles=None):
        start = time.perf_counter()
        fn()
        ms = (time.perf_counter() - start) * 1e3
        return [ms, ms, ms] if quantiles else ms

    return wall


def time_ms(fn: Callable[[], object], smoke: bool) -> float:
    if smoke:
        return timer_for(True)(fn)
    import triton.testing

    return float(triton.testing.do_bench(fn, return_mode="median"))


# Fresh processes ------------------------------------------------------------------------------------------

def child(spec: str) -> None:
    """In a fresh process: one first call, timed; prints its JSON."""
    job = json.loads(spec)
    kernel = wrappers(job["family"], job["impl"], job["db"], timer_for(job["smoke"]))
    call = make_call(job["family"], tuple(job["shape"]), kernel)
    _sync()
    start = time.perf_counter()
    call()
    _sync()
    found = {"first_call_s": time.perf_counter() - start}
    if job["impl"] == "kernels":  # what the database read adds at a key's first call: a second decorator's lookup
        import kernels

        again = wrappers(job["family"], job["impl"], job["db"], timer_for(job["smoke"]))
        key = kernel.key_of(next(iter(kernel.cache)))
        start = time.perf_counter()
        again.explain(key, kernels.current_device())
        found["lookup_ms"] = (time.perf_counter() - start) * 1e3
    print(json.dumps(found))


def first_calls(family: str, shape: tuple, smoke: bool, scratch: Path) -> dict:
    """First-call seconds of a first and a second fresh process per implementation."""
    found = {}
    for impl in ("kernels", "triton", "triton-cache"):
        folder = scratch / f"{family}-{impl}"
        folder.mkdir(parents=True, exist_ok=True)
        env = {**os.environ, "TRITON_CACHE_DIR": str(folder / "triton-cache"), "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        job = json.dumps({"family": family, "impl": impl, "shape": list(shape), "smoke": smoke,
                          "db": f"sqlite:///{folder / 'tuner.db'}"})
        times = []
        for _ in ("first", "second"):
            done = subprocess.run([sys.executable, str(Path(__file__).resolve()), "--child", job], env=env,
                                  capture_output=True, text=True, timeout=150)
            if done.returncode != 0:
                raise RuntimeError(f"{family} {impl} child failed:\n{done.stderr[-2000:]}")
            times.append(json.loads(done.stdout.strip().splitlines()[-1]))
        found[impl] = {"first_process_s": times[0]["first_call_s"], "second_process_s": times[1]["first_call_s"],
                       "second_process_lookup_ms": times[1].get("lookup_ms")}
    return found


# In one process -------------------------------------------------------------------------------------------

TUNED_ROUNDS = 5  # interleaved do_bench readings per tuned call


def tuned_times(family: str, shapes: list[tuple], smoke: bool, scratch: Path) -> list[dict]:
    impls = ["kernels", "triton"] + (["kernels-space"] if family == "layer_norm" else [])
    rows = []
    for shape in shapes:
        row = {"shape": list(shape)}
        calls = {}
        for impl in impls:
            kernel = wrappers(family, impl, f"sqlite:///{scratch / f'tuned-{family}.db'}", timer_for(smoke))
            call = make_call(family, shape, kernel)
            start = time.perf_counter()
            call()
            _sync()
            row[f"{impl}_tune_s"] = time.perf_counter() - start
            row[f"{impl}_config"] = str(kernel.best_config)
            calls[impl] = call
        # Timed once each, two tuners that picked the same config read up to 5x apart (H200, 2026-11-28): the
        # tuned calls are timed side by side instead, in interleaved rounds (order flipped each round), median.
        readings: dict[str, list[float]] = {impl: [] for impl in impls}
        for round_ in range(TUNED_ROUNDS):
            for impl in (impls if round_ % 2 == 0 else impls[::-1]):
                readings[impl].append(time_ms(calls[impl], smoke))
        for impl in impls:
            row[f"{impl}_ms"] = statistics.median(readings[impl])
        row["kernels_vs_triton"] = row["triton_ms"] / row["kernels_ms"]
        if "kernels-space_ms" in row:
            row["space_vs_triton"] = row["triton_ms"] / row["kernels-space_ms"]
        rows.append(row)
    return rows


def big_list_search(smoke: bool, scratch: Path) -> dict:
    """matmul over a list of more than 20 configs: triton.autotune's exhaustive pass against the search pipeline."""
    import triton

    import kernels
    from db import Store
    from examples import matmul
    from tuner.autotune_search import search_kernel

    configs = [triton.Config({"BLOCK_SIZE_M": bm, "BLOCK_SIZE_N": bn, "BLOCK_SIZE_K": bk, "GROUP_SIZE_M": 8},
                             num_stages=s, num_warps=w)
               for bm in (64, 128) for bn in (64, 128, 256) for bk in (32, 64) for s, w in ((3, 8), (4, 4))]
    shape = (16, 16, 16) if smoke else (2048, 2048, 2048)
    exhaustive = triton.autotune(configs=configs, key=["M", "N", "K"], do_bench=timer_for(smoke))(matmul.matmul_kernel.fn)
    call = make_call("matmul", shape, exhaustive)
    start = time.perf_counter()
    call()
    _sync()
    triton_s = time.perf_counter() - start
    triton_ms = time_ms(call, smoke)

    url = f"sqlite:///{scratch / 'big-list.db'}"
    searched = kernels.autotune(configs=configs, key=["M", "N", "K"], inputs=matmul.matmul_kernel.inputs, db=url,
                                do_bench=timer_for(smoke), name="examples.matmul.big_list", mode="off")(
        matmul.matmul_kernel.fn)
    trials = max(1, int(0.4 * len(configs)))
    key = kernels.Key({"M": shape[0], "N": shape[1], "K": shape[2]}, ("float16", "float16", "float16"))
    start = time.perf_counter()
    with Store(url) as store:
        (outcome,) = search_kernel(searched, "", [key], store, kernels.current_device(), trials=trials, seed=0,
                                   isolated=False)
    search_s = time.perf_counter() - start
    searched.clear()
    kernels_ms = time_ms(make_call("matmul", shape, searched), smoke)
    return {"configs": len(configs), "trials": trials, "shape": list(shape), "triton_tune_s": triton_s,
            "search_tune_s": search_s, "time_ratio": search_s / triton_s, "triton_ms": triton_ms,
            "search_ms": kernels_ms, "quality": triton_ms / kernels_ms, "search_config": str(searched.best_config),
            "error": outcome.error}


def incremental(family: str, shape: tuple, smoke: bool, scratch: Path) -> dict:
    kernel = wrappers(family, "kernels", f"sqlite:///{scratch / 'incremental.db'}", timer_for(smoke))
    kernel.mode = "incremental"
    call = make_call(family, shape, kernel)
    seconds = []
    while True:
        start = time.perf_counter()
        call()
        _sync()
        seconds.append(time.perf_counter() - start)
        if kernel.cache or len(seconds) > 100:
            break
    converged_ms = time_ms(call, smoke)
    return {"family": family, "shape": list(shape), "calls_to_converge": len(seconds),
            "worst_call_ms": max(seconds) * 1e3, "converged_call_ms": converged_ms,
            "worst_slowdown": max(seconds) * 1e3 / converged_ms, "config": str(kernel.best_config)}


def geomean(values: list[float]) -> float:
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else float("nan")


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.child:
        child(args.child)
        return 0
    if args.smoke:
        os.environ["TRITON_INTERPRET"] = "1"
    import optuna
    import torch
    import triton

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    shapes = SMOKE_SHAPES if args.smoke else SHAPES
    families = args.families.split(",")
    started = time.perf_counter()
    result: dict = {"gpu": torch.cuda.get_device_name() if _device() == "cuda" else "cpu (interpreter)",
                    "torch": torch.__version__, "triton": triton.__version__,
                    "date": time.strftime("%Y-%m-%d", time.gmtime()), "smoke": args.smoke,
                    "command": " ".join([Path(sys.argv[0]).name, *(argv if argv is not None else sys.argv[1:])])}
    parts: list[tuple[str, Callable[[Path], object]]] = [
        *((f"tuned.{f}", lambda d, f=f: tuned_times(f, shapes[f], args.smoke, d)) for f in families),
        ("incremental", lambda d: incremental(families[0], shapes[families[0]][0], args.smoke, d)),
        *(() if args.no_processes else ((f"first_call.{f}", lambda d, f=f: first_calls(f, shapes[f][0], args.smoke, d))
                                        for f in families)),
        *((("big_list", lambda d: big_list_search(args.smoke, d)),) if "matmul" in families else ()),
    ]
    result["skipped"] = []
    with tempfile.TemporaryDirectory(prefix="bench_autotune_") as folder:
        for name, part in parts:
            if time.perf_counter() - started > args.budget_s:
                result["skipped"].append(name)
                continue
            where, _, sub = name.partition(".")
            value = part(Path(folder))
            if sub:
                result.setdefault(where, {})[sub] = value
            else:
                result[where] = value
    space = [r["space_vs_triton"] for r in result["tuned"].get("layer_norm", [])]
    result["space_geomean"] = geomean(space) if space else None
    result["list_geomean"] = geomean([r["kernels_vs_triton"] for rows in result.get("tuned", {}).values() for r in rows])
    result["wall_s"] = time.perf_counter() - started
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        (Path(args.out) / "bench_autotune.json").write_text(json.dumps(result, indent=2))
    _print(result)
    return 0


def _print(result: dict) -> None:
    print(f"# {result['gpu']}, torch {result['torch']}, triton {result['triton']}, {result['date']}"
          + (" (smoke: numbers mean nothing)" if result["smoke"] else ""))
    for family, impls in result.get("first_call", {}).items():
        for impl, t in impls.items():
            lookup = t.get("second_process_lookup_ms")
            print(f"first call {family:10} {impl:13} first process {t['first_process_s']:7.2f} s   "
                  f"second process {t['second_process_s']:7.3f} s"
                  + (f" (database lookup {lookup:.1f} ms)" if lookup is not None else ""))
    for family, rows in result.get("tuned", {}).items():
        for r in rows:
            space = f"  space {r['kernels-space_ms']:.4f} ms ({r['space_vs_triton']:.2f}x)" if "space_vs_triton" in r else ""
            print(f"tuned {family:10} {'x'.join(map(str, r['shape'])):>14}  triton.autotune {r['triton_ms']:.4f} ms  "
                  f"kernels.autotune {r['kernels_ms']:.4f} ms ({r['kernels_vs_triton']:.2f}x){space}")
    if result.get("big_list"):
        b = result["big_list"]
        print(f"big list ({b['configs']} configs, {b['trials']} trials): tuning {b['search_tune_s']:.1f} s vs "
              f"{b['triton_tune_s']:.1f} s ({b['time_ratio']:.2f}x), quality {b['quality']:.2f}x")
    i = result.get("incremental")
    if i:
        print(f"incremental {i['family']}: converged after {i['calls_to_converge']} calls; slowest call: "
              f"{i['worst_call_ms']:.1f} ms = {i['worst_slowdown']:.0f}x the converged call")
    if result["skipped"]:
        print(f"skipped (over --budget-s): {', '.join(result['skipped'])}")
    print(f"geomean kernels/triton (list) {result['list_geomean']:.3f}x; space {result['space_geomean'] or float('nan'):.3f}x "
          f"(target >= 1.05x); wall {result['wall_s']:.0f} s")


if __name__ == "__main__":
    sys.exit(main())
