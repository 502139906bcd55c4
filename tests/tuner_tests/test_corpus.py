"""The model corpus (every problem valid, the split by model), `search --corpus`, and the cost model's loaders."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import kernels
from db import Store
from kernels import Config, DeviceInfo, Problem
from kernels._costmodel import Observation, fit
from kernels._fallback import choose_fallback
from tests.db_tests.conftest import make_record
from tuner import corpus
from tuner.cli import UserError, build_parser
from tuner.commands import _problems
from tuner.costmodel_data import from_database, from_rows, from_rows_file, from_sweeps, ranked_warm_start


def test_split_is_by_model_disjoint_and_covers_the_corpus() -> None:
    tuned, held_out = corpus.entries("tuned"), corpus.entries("held_out")
    assert {e.model for e in tuned}.isdisjoint({e.model for e in held_out})
    assert {e.model for e in held_out} == set(json.loads(corpus.CORPUS_FILE.read_text())["held_out_models"])
    keys = [e.problem.key for e in tuned + held_out]
    assert len(keys) == len(set(keys)) and set(keys) == {p.key for p in corpus.corpus_problems("all")}
    assert [e.problem.key for e in corpus.entries("tuned")] == [e.problem.key for e in tuned], "stable order"


def test_every_problem_is_a_linear_layer_in_both_half_types_at_every_token_count() -> None:
    document = json.loads(corpus.CORPUS_FILE.read_text())
    problems = corpus.corpus_problems("all")
    for problem in problems:
        kernels.MATMUL.check_problem(problem)
        assert problem.layout == "nt" and problem.dtype in ("fp16", "bf16")
    shapes = {(p.shape[1], p.shape[2]) for p in problems}
    expected = {(n, k) for model in document["models"] for _, n, k in model["layers"]}
    assert shapes == expected
    assert {p.shape[0] for p in problems} == set(document["token_counts"])
    assert len(problems) == len(expected) * len(document["token_counts"]) * len(document["dtypes"])


def test_gated_problems_are_each_silu_models_gate_and_up_pair_split_by_model() -> None:
    """Every SiLU-gated MLP gives a gated_matmul problem of the gate projection's (N, K): pairs by prefix,
    a stacked gate_up_proj halved; Gemma-2 (GELU-gated) gives none, as gated_matmul computes SiLU."""
    entries = corpus.gated_entries("all")
    pairs = {(e.model, e.layers, e.problem.shapes[0][1:]) for e in entries}
    assert pairs == {
        ("Llama-3-70B", ("gate_proj", "up_proj"), (28672, 8192)),
        ("Qwen2.5-7B", ("gate_proj", "up_proj"), (18944, 3584)),
        ("Qwen2.5-32B", ("gate_proj", "up_proj"), (27648, 5120)),
        ("Phi-3-mini", ("gate_up_proj",), (8192, 3072)),
        ("DeepSeek-V2-Lite", ("mlp.gate_proj", "mlp.up_proj"), (10944, 2048)),
        ("DeepSeek-V2-Lite", ("shared_experts.gate_proj", "shared_experts.up_proj"), (2816, 2048))}
    for entry in entries:
        kernels.GATED_MATMUL.check_problem(entry.problem)
        assert entry.problem.kernel == "gated_matmul" and entry.problem.layout == "nt"
    assert len(entries) == 6 * 7 * 2
    assert {e.model for e in corpus.gated_entries("held_out")} == {"Qwen2.5-32B"}
    assert [p.key for p in corpus.corpus_problems("tuned", "gated_matmul")] == [
        e.problem.key for e in corpus.gated_entries("tuned")]
    with pytest.raises(ValueError, match="matmul, gated_matmul and matmul_bias"):
        corpus.corpus_problems("all", "moe_matmul")


def test_qkv_problems_are_each_models_query_key_and_value_projections_stacked() -> None:
    """What kernels.patch runs for an attention module's projections: one matmul of N = Nq + Nk + Nv; Phi-3
    (qkv_proj, already among its Linears) and DeepSeek-V2-Lite (latent attention) have none."""
    entries = corpus.qkv_entries("all")
    assert {(e.model, e.problem.shapes[0][1:]) for e in entries} == {
        ("Llama-3-70B", (10240, 8192)), ("Qwen2.5-7B", (4608, 3584)), ("Qwen2.5-32B", (7168, 5120)),
        ("Gemma-2-9B", (8192, 3584))}
    assert all(e.problem.kernel == "matmul" and e.problem.layout == "nt" for e in entries)
    assert len(entries) == 4 * 7 * 2
    assert {e.model for e in corpus.qkv_entries("held_out")} == {"Qwen2.5-32B", "Gemma-2-9B"}
    assert [p.key for p in corpus.corpus_problems("tuned", qkv=True)] == [e.problem.key for e in corpus.qkv_entries("tuned")]
    with pytest.raises(ValueError, match="matmul problems"):
        corpus.corpus_problems("all", "gated_matmul", qkv=True)


def test_biased_qkv_problems_are_the_matmul_bias_calls_a_patched_qwen_makes() -> None:
    """Qwen2.5's q/k/v Linears carry a bias (the corpus file says so, with its source): kernels.patch runs
    the three as one kernels.matmul_bias call, so the corpus holds that problem, split by model as the rest."""
    entries = corpus.bias_entries("all")
    assert {(e.model, e.part, e.problem.shapes[0][1:]) for e in entries} == {
        ("Qwen2.5-7B", "tuned", (4608, 3584)), ("Qwen2.5-32B", "held_out", (7168, 5120))}
    assert all(e.problem.kernel == "matmul_bias" and e.problem.layout == "nt" for e in entries)
    assert len(entries) == 2 * 7 * 2
    assert [p.key for p in corpus.corpus_problems("held_out", "matmul_bias")] == [
        e.problem.key for e in corpus.bias_entries("held_out")]
    with pytest.raises(ValueError, match="biased ones"):
        corpus.corpus_problems("all", "matmul_bias", qkv=True)


def test_unknown_part_is_refused_with_the_choices() -> None:
    with pytest.raises(ValueError, match="tuned, held_out, all"):
        corpus.entries("test")


def test_unseen_models_pose_only_problems_the_corpus_never_does() -> None:
    unseen = json.loads(corpus.UNSEEN_FILE.read_text())
    document = json.loads(corpus.CORPUS_FILE.read_text())
    assert {m["name"] for m in unseen["models"]}.isdisjoint(m["name"] for m in document["models"])
    assert all(m["source"].startswith("https://") for m in unseen["models"])
    # Each kernel's unseen problems against every problem the corpus poses for that kernel, in any part.
    posed = {
        ("matmul", False): {p.key for p in corpus.corpus_problems("all")} | {p.key for p in corpus.corpus_problems("all", qkv=True)},
        ("matmul", True): {p.key for p in corpus.corpus_problems("all")} | {p.key for p in corpus.corpus_problems("all", qkv=True)},
        ("gated_matmul", False): {p.key for p in corpus.corpus_problems("all", "gated_matmul")},
        ("matmul_bias", False): {p.key for p in corpus.corpus_problems("all", "matmul_bias")},
    }
    for (kernel, qkv), corpus_keys in posed.items():
        problems = corpus.corpus_problems("unseen", kernel, qkv=qkv)
        assert problems, (kernel, qkv)
        assert corpus_keys.isdisjoint(p.key for p in problems), (kernel, qkv)
    assert {e.part for e in corpus.entries("unseen")} == {"unseen"}
    # "all" stays the corpus: the unseen models never join its tuned or held-out part.
    assert {e.model for e in corpus.entries("all")} == {m["name"] for m in document["models"]}


def test_unseen_leaves_out_a_shape_the_corpus_holds_and_keeps_the_rest_of_its_model() -> None:
    keys = {e.problem.key: e.model for e in corpus.entries("unseen")}
    # Qwen2.5-72B's attention is Llama-3-70B's (tuned): only its MLP shapes are unseen.
    assert "bf16:nt:8x8192x8192" not in keys and keys["bf16:nt:8x29568x8192"] == "Qwen2.5-72B"
    # Llama-3.2-3B's gate/up pair is Phi-3-mini's stacked gate_up (a tuned gated problem); as plain Linears
    # (matmul problems) nobody tuned them.
    assert keys["fp16:nt:1x8192x3072"] == "Llama-3.2-3B"
    assert "fp16:nt:1x8192x3072" not in {p.key for p in corpus.corpus_problems("unseen", "gated_matmul")}
    for problem in corpus.corpus_problems("unseen"):
        kernels.MATMUL.check_problem(problem)


def test_search_takes_the_unseen_models_and_a_shipped_table_refuses_them() -> None:
    args = build_parser().parse_args(["search", "--corpus", "unseen", "--dtype", "fp16"])
    assert _problems(args, H100) == [p for p in corpus.corpus_problems("unseen") if p.dtype == "fp16"]
    shipped = subprocess.run([sys.executable, str(ROOT / "scripts" / "ship_table.py"), "--device", "h100",
                              "--only", "unseen", "--db", "sqlite:///:memory:", "-o", "unused.json"],
                             capture_output=True, text=True, cwd=ROOT)
    assert shipped.returncode == 2 and "invalid choice: 'unseen'" in shipped.stderr


H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232448)
ROOT = Path(__file__).resolve().parents[2]


def test_search_corpus_flag_gives_the_part_narrowed_by_dtype() -> None:
    args = build_parser().parse_args(["search", "--corpus", "held_out", "--dtype", "bf16"])
    problems = _problems(args, H100)
    assert problems and problems == [p for p in corpus.corpus_problems("held_out") if p.dtype == "bf16"]
    with pytest.raises(UserError, match="--corpus"):
        _problems(build_parser().parse_args(["search", "--corpus", "all", "--shape", "16x16x16"]), H100)

# ---------------------------------------------------------------------------------------------
# Observation loaders
# ---------------------------------------------------------------------------------------------

THIN = Config.make(VARIANT="tiled", BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_SIZE_M=8, SPLIT_K=1, NUM_SM=132,
                   FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=5)
WIDE = THIN.replace(VARIANT="tma", BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, num_warps=8, num_stages=3)


def test_database_observations_take_every_trial_per_mode_against_the_record(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'tuner.db'}"
    with Store(url) as store:
        store.put(make_record(m=16, n=4096, k=4096, cublas_ms=0.02))
        store.put(make_record(m=16, n=4096, k=4096, cublas_ms=0.04, mode="eager"))
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(study_name=f"{H100.name}|matmul|fp16:nt:16x4096x4096", storage=storage)
    orphan = optuna.create_study(study_name=f"{H100.name}|matmul|fp16:nt:32x4096x4096", storage=storage)
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for s in (study, orphan):
        s.add_trial(optuna.trial.create_trial(params={"x": 0.1}, distributions=dist, value=0.016,
                                              user_attrs={"config": str(THIN), "status": "ok"}))
    study.add_trial(optuna.trial.create_trial(params={"x": 0.2}, distributions=dist, value=0.03,
                                              user_attrs={"config": str(WIDE), "status": "ok",
                                                          "eager_ms": 0.05, "graph_ms": 0.03}))
    study.add_trial(optuna.trial.create_trial(params={"x": 0.3}, distributions=dist, value=0.01,
                                              user_attrs={"config": str(WIDE), "status": "ok", "repeat": True}))
    obs = from_database(url)
    got = sorted((str(o.config) == str(THIN), o.mode, o.time_ms, o.cublas_ms) for o in obs)
    # a trial without per-mode times is graph mode; each mode's time goes against that mode's cuBLAS
    assert got == [(False, "eager", 0.05, 0.04), (False, "graph", 0.03, 0.02), (True, "graph", 0.016, 0.02)]


def test_rows_format_pairs_each_time_with_its_cublas_row(tmp_path: Path) -> None:
    rows = [{"problem_key": "bf16:nt:8x4096x4096", "config": "cublas", "mode": "eager", "time_ms": 0.05},
            {"problem_key": "bf16:nt:8x4096x4096", "config": str(THIN), "mode": "eager", "time_ms": 0.04},
            {"problem_key": "bf16:nt:8x4096x4096", "config": THIN.as_dict(), "mode": "graph", "time_ms": 0.02}]
    path = tmp_path / "rows.json"
    path.write_text(json.dumps(rows))
    obs = from_rows_file(str(path))
    assert [(o.config, o.mode, o.time_ms, o.cublas_ms) for o in obs] == [(THIN, "eager", 0.04, 0.05)]
    assert from_rows(rows, device="other GPU") == obs  # rows without a device belong to any
    path.write_text("{}")
    with pytest.raises(ValueError, match="JSON list"):
        from_rows_file(str(path))


def test_sweeps_give_graph_observations_that_a_model_ranks_with() -> None:
    obs = from_sweeps(str(ROOT / "benchmarks/sweeps/matmul-*.json"))
    assert obs and {o.mode for o in obs} == {"graph"} and {o.problem.key for o in obs} == {"fp16:nn:16x4096x4096"}
    model = fit(obs)
    problem = Problem.from_key("matmul", "fp16:nn:16x4096x4096")
    best = min(obs, key=lambda o: o.time_ms)
    candidates = [o.config for o in obs[:50]] + [best.config]
    assert model.rank(problem, candidates)[0][0] == best.config
    # the sweep's best ran at 0.925x cuBLAS's time on its own problem: the fallback takes it at a 2% margin,
    # not at 20%, and not on a problem 5 factors of 2 away in N and K
    assert choose_fallback(problem, "graph", [best.config], model, margin=0.02) == best.config
    assert choose_fallback(problem, "graph", [best.config], model, margin=0.2) is None
    far = Problem.from_key("matmul", "fp16:nn:16x131072x131072")
    assert choose_fallback(far, "graph", [best.config], model, margin=0.02) is None


def test_ranked_warm_start_takes_the_models_best_first_and_only_known_modes() -> None:
    problem = Problem.from_key("matmul", "fp16:nt:16x4096x4096")
    model = fit([Observation(problem, THIN, "graph", 0.9, 1.0), Observation(problem, WIDE, "graph", 1.4, 1.0)])
    assert ranked_warm_start(model, problem, [WIDE, THIN], count=1) == [THIN]
    assert ranked_warm_start(model, problem, [WIDE, THIN], mode="eager") == []


def test_leave_one_out_evaluation_scores_a_learnable_world_with_no_regret() -> None:
    from scripts import costmodel_eval

    def ratio(config: Config, m: int) -> float:
        return (0.8 if m <= 64 else 1.5) if config == THIN else (1.3 if m <= 64 else 0.9)

    obs = [Observation(Problem.from_key("matmul", f"fp16:nt:{m}x{n}x{n}"), c, "graph", ratio(c, m), 1.0)
           for m in (1, 8, 32, 128, 512, 2048) for n in (1024, 2048, 4096) for c in (THIN, WIDE)]
    rows = costmodel_eval.evaluate(obs, "graph", "problem", ["nearest", "knn"])
    for method in ("nearest", "knn"):
        assert len(rows[method]) == 18 and all(r["regret1"] == 1.0 and r["rho"] == pytest.approx(1.0) for r in rows[method])
    assert "| knn | 18 | 1.000 | 1.000 |" in costmodel_eval.summary_table(rows)
