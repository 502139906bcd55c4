"""Dispatch modes: the eager and graph winners of a problem, picked by whether the stream captures,
by ``dispatch_mode`` or by KERNELS_MODE; and the policy for dense problems nobody tuned.

There is no CUDA here, so "the stream is capturing" is a test double: ``kernels._modes.capturing`` is
replaced by a function that says so. Everything else is real: SQLite files, the dispatcher, the
kernels under the interpreter.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import kernels
from db import Store
from kernels import _modes, _plans
from kernels._spec import BASELINE, Config, DeviceInfo, Problem, is_baseline
from kernels.dispatch import Dispatcher
from kernels.gemm import MATMUL

from test_dispatch import SPLITK, TILED, WIDE, _inputs, launched, make_record  # noqa: F401 (fixture)

# A GPU as the dispatcher sees it; choose() needs no GPU to run, only its name and limits.
H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232448)


@pytest.fixture(autouse=True)
def fresh_dispatch() -> Iterator[None]:
    kernels.use_database(None)
    yield
    kernels.use_database(None)


def _store(db_url: str, *records) -> None:
    with Store(db_url) as store:
        store.put_many(list(records), on_conflict="replace")


def _problem(key: str) -> Problem:
    return Problem.from_key("matmul", key)


def _choose(db_url: str, key: str, mode: str, device: DeviceInfo = H100):
    return Dispatcher(db_url, use_shipped=False).choose(MATMUL, _problem(key), device, mode)


# --------------------------------------------------------------------------------------- mode selection

def test_mode_is_eager_outside_a_capture_and_graph_inside(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_modes, "ENV_MODE", None)
    monkeypatch.setattr(_modes, "capturing", lambda: False)
    assert _modes.current(on_cuda=True) == "eager"
    monkeypatch.setattr(_modes, "capturing", lambda: True)  # stand-in for a CUDA stream capture
    assert _modes.current(on_cuda=True) == "graph"
    assert _modes.current(on_cuda=False) == "eager", "CPU tensors are never captured"


def test_dispatch_mode_overrides_the_capture_check_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_modes, "capturing", lambda: True)
    monkeypatch.setattr(_modes, "ENV_MODE", "eager")
    assert _modes.current(on_cuda=True) == "eager", "KERNELS_MODE=eager wins over the capture check"
    with kernels.dispatch_mode("graph"):
        assert _modes.current(on_cuda=False) == "graph"
        with kernels.dispatch_mode("auto"):
            assert _modes.current(on_cuda=True) == "graph", "auto: back to the capture check"
        assert _modes.current(on_cuda=True) == "graph"
    assert _modes.current(on_cuda=True) == "eager"
    with pytest.raises(ValueError, match="eager, graph, auto"):
        with kernels.dispatch_mode("fast"):
            pass


def test_environment_variable_is_validated(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KERNELS_MODE", "graph")
    assert _modes._mode_from_env() == "graph"
    monkeypatch.setenv("KERNELS_MODE", "fastest")
    with pytest.raises(ValueError, match="KERNELS_MODE='fastest'.*eager, graph or auto"):
        _modes._mode_from_env()


def test_each_mode_runs_its_own_winner_through_the_public_call(db_url, torch_device, launched,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    device = kernels.current_device(torch_device)
    key = "fp16:nn:16x64x64"
    _store(db_url, make_record(device, key, TILED, mode="eager"), make_record(device, key, WIDE, mode="graph"))
    kernels.use_database(db_url, use_shipped=False)
    a, b = _inputs(16, 64, 64, torch_device)
    ref = a.double() @ b.double()
    for mode, config in (("eager", TILED), ("graph", WIDE), ("eager", TILED)):
        launched.clear()
        with kernels.dispatch_mode(mode):
            out = kernels.matmul(a, b)
        assert (out.double() - ref).norm() <= 5e-3 * ref.norm()
        if launched:  # the checked path reports its launches; a direct plan launches without it
            assert launched[0][1] == config
        plan = _plans.plan_of(a, b, mode)
        assert getattr(plan, "config", None) == config
    # The two modes' plans differ here, so each call asks the mode (tests/kernels_tests/test_capture.py
    # checks on the GPU that a real capture gets the graph winner).
    assert _plans.plan_of(a, b, "eager") is not _plans.plan_of(a, b, "graph")


def test_a_signature_whose_modes_agree_runs_one_plan_without_asking_the_mode(db_url, torch_device,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    device = kernels.current_device(torch_device)
    key = "fp16:nn:16x64x64"
    _store(db_url, make_record(device, key, TILED, mode="eager"), make_record(device, key, TILED, mode="graph"))
    kernels.use_database(db_url, use_shipped=False)
    asked = []
    monkeypatch.setattr(_modes, "capturing", lambda: asked.append(1) or False)
    a, b = _inputs(16, 64, 64, torch_device)
    kernels.matmul(a, b)
    assert _plans.plan_of(a, b, "eager") is _plans.plan_of(a, b, "graph")
    assert asked == []


# ------------------------------------------------------------------------------------------ exact records

def test_an_exact_record_of_the_mode_asked_wins(db_url) -> None:
    key = "fp16:nt:16x4096x4096"
    _store(db_url, make_record(H100, key, TILED, mode="eager"), make_record(H100, key, SPLITK, mode="graph"))
    assert _choose(db_url, key, "eager").config == TILED
    assert _choose(db_url, key, "graph").config == SPLITK
    assert _choose(db_url, key, "graph").record_mode == "graph"


def test_eager_uses_a_graph_record_unless_its_host_cost_would_show(db_url) -> None:
    tma = Config.from_dict({**TILED.as_dict(), "VARIANT": "tma", "NUM_SM": 132})
    _store(db_url, make_record(H100, "fp16:nn:512x4096x4096", TILED, mode="graph"),
           make_record(H100, "fp16:nn:64x4096x4096", tma, mode="graph", time_ms=0.02),
           make_record(H100, "fp16:nn:8192x8192x8192", tma, mode="graph", time_ms=1.75))
    chosen = _choose(db_url, "fp16:nn:512x4096x4096", "eager")
    assert chosen.config == TILED and chosen.record_mode == "graph"
    assert _choose(db_url, "fp16:nn:8192x8192x8192", "eager").config == tma, "1.75 ms of GPU hides the host"
    small = _choose(db_url, "fp16:nn:64x4096x4096", "eager")
    assert is_baseline(small.config), "a 20 us TMA call would show its descriptor-building host time"


# ------------------------------------------------------------------------------------ untuned dense problems

def test_a_gpu_with_no_records_gets_cublas_from_the_first_call(db_url) -> None:
    for mode in ("eager", "graph"):
        chosen = _choose(db_url, "bf16:nt:8x5120x5120", mode)
        assert chosen.config == BASELINE and chosen.source.startswith("cublas")


def test_untuned_problem_takes_a_near_record_only_where_it_beat_cublas_clearly(db_url) -> None:
    _store(db_url,
           make_record(H100, "fp16:nt:16x4096x4096", SPLITK, mode="graph", time_ms=0.020, cublas_ms=0.024),
           make_record(H100, "fp16:nt:16x4096x4096", TILED, mode="eager", time_ms=0.023, cublas_ms=0.024),
           make_record(H100, "fp16:nt:64x4096x4096", SPLITK, mode="graph", time_ms=0.023, cublas_ms=0.024),
           make_record(H100, "fp16:nt:64x4096x4096", BASELINE, mode="eager", time_ms=0.024, cublas_ms=0.024))
    near = "fp16:nt:12x4096x4096"  # within the tile's 16 rows: the same programs (24 rows would double them)
    graph = _choose(db_url, near, "graph")
    assert graph.config == SPLITK and graph.source == "nearest:fp16:nt:16x4096x4096"
    # Eager takes the graph evidence (split-K's host cost is torch's); an eager win is no evidence.
    assert _choose(db_url, near, "eager").config == SPLITK
    assert is_baseline(_choose(db_url, "fp16:nt:96x4096x4096", "graph").config), "4% is within the noise"
    assert is_baseline(_choose(db_url, "fp16:nt:96x4096x4096", "eager").config)
    far = "fp16:nt:2048x4096x4096"  # 7 doublings of M away: the thin-M winner says nothing there
    assert is_baseline(_choose(db_url, far, "graph").config)


def test_untuned_problem_ignores_records_where_cublas_won(db_url) -> None:
    _store(db_url, make_record(H100, "bf16:nt:128x8192x8192", BASELINE, mode="graph", time_ms=0.06, cublas_ms=0.06,
                               triton_config=TILED.as_dict(), triton_ms=0.07))
    assert is_baseline(_choose(db_url, "bf16:nt:128x8192x4096", "graph").config)


def test_untuned_problem_skips_a_near_config_that_does_not_fit_it(db_url) -> None:
    big = Config.from_dict({**TILED.as_dict(), "BLOCK_M": 128, "BLOCK_N": 128})
    _store(db_url, make_record(H100, "fp16:nn:128x128x4096", big, mode="graph", time_ms=0.01, cublas_ms=0.02))
    chosen = _choose(db_url, "fp16:nn:16x128x4096", "graph")  # BLOCK_M=128 > what 16 rows need
    assert is_baseline(chosen.config)


def test_untuned_eager_call_takes_a_near_host_bound_eager_win_that_survives_the_growth(db_url) -> None:
    """No graph evidence (cuBLAS won on the GPU there), but in eager mode a tiled config beat torch.matmul
    by 20% on a host-bound call (18 us against 22 us, under HOST_BOUND_MS)."""
    _store(db_url,
           make_record(H100, "fp16:nt:32x3584x3584", BASELINE, mode="graph", time_ms=0.018, cublas_ms=0.018),
           make_record(H100, "fp16:nt:32x3584x3584", TILED, mode="eager", time_ms=0.018, cublas_ms=0.022))
    smaller = _choose(db_url, "fp16:nt:32x3072x3584", "eager")
    assert smaller.config == TILED and smaller.source == "eager-near:fp16:nt:32x3584x3584"
    assert is_baseline(_choose(db_url, "fp16:nt:32x3072x3584", "graph").config), "graph mode has no evidence"
    # 1.14x the work: 0.018 x 1.14 x 1.05 = 0.0216, still under torch.matmul's 0.022 there
    assert _choose(db_url, "fp16:nt:32x4096x3584", "eager").config == TILED
    # 2x the work: past HOST_BOUND_MORE_WORK
    assert is_baseline(_choose(db_url, "fp16:nt:32x7168x3584", "eager").config)


def test_untuned_eager_call_ignores_eager_wins_that_are_slim_gpu_bound_or_host_heavy(db_url) -> None:
    tma = Config.from_dict({**TILED.as_dict(), "VARIANT": "tma"})
    _store(db_url,
           make_record(H100, "fp16:nt:8x3584x3584", TILED, mode="eager", time_ms=0.0195, cublas_ms=0.020),  # 2.5%
           make_record(H100, "fp16:nt:128x3584x3584", tma, mode="eager", time_ms=0.015, cublas_ms=0.020),
           make_record(H100, "fp16:nt:2048x3584x3584", TILED, mode="eager", time_ms=0.09, cublas_ms=0.11))
    for key in ("fp16:nt:8x3072x3584", "fp16:nt:128x3072x3584", "fp16:nt:2048x3072x3584"):
        assert is_baseline(_choose(db_url, key, "eager").config), key


def test_explain_refuses_a_mode_that_is_not_eager_or_graph(db_url) -> None:
    """"auto" is a dispatch_mode, not a mode records are tuned in: asked for it, explain had looked up no record
    and answered as for an untuned problem (cuBLAS) where both modes' records said TILED."""
    key = "fp16:nt:32x4096x4096"
    _store(db_url, *(make_record(H100, key, TILED, mode=mode) for mode in ("eager", "graph")))
    kernels.use_database(db_url, use_shipped=False)
    assert kernels.explain("matmul", _problem(key), H100, "graph").config == TILED
    for mode in ("auto", "Graph"):
        with pytest.raises(ValueError, match=f"mode {mode!r} .*eager or graph"):
            kernels.explain("matmul", _problem(key), H100, mode)


# A one-row weight-streaming config (kernels.gemm's gemv) and another, as tuned records of one-row problems
_GEMV = dict(VARIANT="gemv", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, SPLIT_K=1, NUM_SM=132,
             FLATTEN=False, EPILOGUE_SUBTILE=False, num_stages=2)
GEMV_A = Config.make(**_GEMV, GEMV_BLOCK_N=4, GEMV_BLOCK_K=2048, num_warps=4)
GEMV_B = Config.make(**_GEMV, GEMV_BLOCK_N=8, GEMV_BLOCK_K=1024, num_warps=8)
# Weights far apart (more than UNTUNED_NEAR_WEIGHTS from each other and from the problems asked below)
_ONE_ROW_WEIGHTS = ((576, 2048), (1024, 8192), (3072, 3072), (28672, 8192), (8192, 28672), (16384, 3072),
                    (2048, 10944), (576, 16384), (10944, 512))


def _one_row_records(configs: list, time_ms: float = 1.0, cublas_ms: float = 1.1, eager: list | None = None,
                     streaming: bool = False) -> list:
    """A graph and an eager record per weight in _ONE_ROW_WEIGHTS, each mode's winner the config at that position
    (None: cuBLAS) of ``configs``, or for eager of ``eager`` where given. ``streaming``: cuBLAS's time is a launch
    plus the weight at 2.6 TB/s, as on the H100, and a winner's 0.9 of it, in place of the two times given."""
    records = []
    for mode, winners in (("graph", configs), ("eager", configs if eager is None else eager)):
        for (n, k), config in zip(_ONE_ROW_WEIGHTS, winners):
            won = config is not None
            cublas = 0.006 + 2.0 * n * k / 2.6e9 if streaming else cublas_ms
            ours = 0.9 * cublas if streaming else time_ms
            records.append(make_record(H100, f"bf16:nt:1x{n}x{k}", config if won else BASELINE, mode=mode,
                                       time_ms=ours if won else cublas, cublas_ms=cublas))
    return records


def test_an_untuned_one_row_problem_far_from_every_record_takes_the_config_most_one_row_problems_won(db_url) -> None:
    """5 of 8 one-row records won by one gemv config: a one-row problem near none of them takes it, in both
    modes (gemv is not host-heavy); a problem of another row count does not; a near record still comes first."""
    _store(db_url, *_one_row_records([GEMV_A] * 5 + [GEMV_B, None, None]))
    for mode in ("graph", "eager"):
        chosen = _choose(db_url, "fp16:nt:1x5120x5120", mode)
        assert chosen.config == GEMV_A and chosen.source == "consensus:5 of 8 tuned nt problems with M = 1", mode
    assert is_baseline(_choose(db_url, "fp16:nt:8x5120x5120", "graph").config), "one-row wins say nothing of M = 8"
    assert is_baseline(_choose(db_url, "fp16:nn:1x5120x5120", "graph").config), "nor of another layout"
    near = _choose(db_url, "bf16:nt:1x3072x3584", "graph")  # 0.22 from 3072x3072, whose winner is GEMV_A too
    assert near.source == "nearest:bf16:nt:1x3072x3072"


def test_half_type_one_row_wins_make_no_consensus_for_an_fp32_problem(db_url) -> None:
    """8 of 9 bf16 one-row records won by one gemv config: an fp16 problem takes it (the other half type carries
    over), an fp32 one does not: nothing carries from a half type to fp32 (KernelSpec.transfer_distance)."""
    _store(db_url, *_one_row_records([GEMV_A] * 8 + [None]))
    for mode in ("graph", "eager"):
        assert _choose(db_url, "fp16:nt:1x5120x5120", mode).config == GEMV_A, mode
        chosen = _choose(db_url, "fp32:nt:1x5120x5120", mode)
        assert is_baseline(chosen.config), (mode, chosen.source)


def test_no_consensus_without_a_majority_enough_records_or_clear_wins(db_url, tmp_path) -> None:
    far = "fp16:nt:1x5120x5120"
    _store(db_url, *_one_row_records([GEMV_A] * 4 + [GEMV_B] * 2 + [None] * 2))  # 4 of 8: no majority
    assert is_baseline(_choose(db_url, far, "graph").config)
    few = f"sqlite:///{tmp_path}/few.db"
    _store(few, *_one_row_records([GEMV_A] * 6 + [None]))  # 6 of 7: under CONSENSUS_LEAST
    assert is_baseline(_choose(few, far, "graph").config)
    slim = f"sqlite:///{tmp_path}/slim.db"  # every win by 1%, under CONSENSUS_WIN_MARGIN
    _store(slim, *_one_row_records([GEMV_A] * 8, time_ms=1.0, cublas_ms=1.01))
    assert is_baseline(_choose(slim, far, "graph").config)
    clear = f"sqlite:///{tmp_path}/clear.db"  # the same records won by 3%: the consensus stands
    _store(clear, *_one_row_records([GEMV_A] * 8, time_ms=1.0, cublas_ms=1.03))
    assert _choose(clear, far, "graph").config == GEMV_A


# ------------------------------------------------------------------ untuned epilogue (bias, gated) problems

GATED_TILE = Config.make(BLOCK_M=16, BLOCK_N=64, BLOCK_K=128, GROUP_SIZE_M=8, num_warps=4, num_stages=4)


def _choose_epilogue(db_url: str, kernel: str, key: str, mode: str):
    spec = kernels.get_kernel(kernel)
    return Dispatcher(db_url, use_shipped=False).choose(spec, Problem.from_key(kernel, key), H100, mode)


@pytest.mark.parametrize("kernel", ["gated_matmul", "matmul_bias"])
def test_an_untuned_epilogue_problem_runs_the_baseline_not_the_default_tile(db_url, kernel) -> None:
    """With its gated problems on the default tile, a 70B layer's prefill ran 1.38x slower than torch's
    (H100, 2026-11-24): with no evidence, an untuned problem gets the baseline."""
    for mode in ("eager", "graph"):
        chosen = _choose_epilogue(db_url, kernel, "bf16:nt:2048x28672x8192", mode)
        assert is_baseline(chosen.config) and chosen.source.startswith("cublas"), (mode, chosen)


def test_an_untuned_gated_problem_takes_a_near_graph_win_and_ignores_slim_ones(db_url) -> None:
    _store(db_url,
           make_record(H100, "bf16:nt:8x28672x8192", GATED_TILE, kernel="gated_matmul", mode="graph",
                       time_ms=0.30, cublas_ms=0.36),
           make_record(H100, "bf16:nt:32x28672x8192", GATED_TILE, kernel="gated_matmul", mode="graph",
                       time_ms=0.35, cublas_ms=0.36))
    near = _choose_epilogue(db_url, "gated_matmul", "bf16:nt:12x28672x8192", "graph")
    assert near.config == GATED_TILE and near.source == "nearest:bf16:nt:8x28672x8192"
    assert is_baseline(_choose_epilogue(db_url, "gated_matmul", "bf16:nt:40x28672x8192", "graph").config), \
        "a 3% win is within the noise: no evidence"
    # An eager call takes no host-bound eager evidence here: only matmul has the cheap direct launch.
    _store(db_url, make_record(H100, "bf16:nt:1x4096x4096", GATED_TILE, kernel="gated_matmul", mode="eager",
                               time_ms=0.015, cublas_ms=0.030))
    assert is_baseline(_choose_epilogue(db_url, "gated_matmul", "bf16:nt:1x3584x4096", "eager").config)


def test_an_untuned_moe_problem_still_takes_the_default_kernel(db_url) -> None:
    """MoE's baseline can be a Python loop of launches (fp16), which the default config beats."""
    spec = kernels.get_kernel("moe_matmul")
    problem = kernels.moe.balanced_problem("fp16", "nn", 64, 8, 128, 256)
    chosen = Dispatcher(db_url, use_shipped=False).choose(spec, problem, H100, "graph")
    assert not is_baseline(chosen.config) and chosen.source == "default"


H200 = DeviceInfo("NVIDIA H200", "h200", "9.0", 132, 232448)
_PHI3_GEMV = Config.make(**_GEMV, GEMV_BLOCK_N=8, GEMV_BLOCK_K=1024, num_warps=8)
_PHI3_TILE = Config.from_dict({**TILED.as_dict(), "BLOCK_M": 16, "BLOCK_N": 128, "BLOCK_K": 128, "num_stages": 4})


def test_a_near_win_is_not_carried_where_the_configs_critical_path_grows_more_than_cublass_time(db_url) -> None:
    """The H200's records of Phi-3's stacked q/k/v (9216x3072; gemv won by 9% at one row, a 16x128 tile by 8% at
    eight) sent Gemma-2's (8192x3584) there, where they ran 0.90-0.94x cuBLAS: gemv's K blocks of 1024 go 3.5
    times into 3584 (4 steps, 3 before), and the tile's 64 programs, one wave, each walk a K 17% longer while the
    bytes grew 4%. The same records still serve a problem where the config's path grows with cuBLAS's time."""
    _store(db_url,
           make_record(H200, "fp16:nt:1x9216x3072", _PHI3_GEMV, mode="graph", time_ms=0.0110, cublas_ms=0.0120),
           make_record(H200, "fp16:nt:8x9216x3072", _PHI3_TILE, mode="graph", time_ms=0.0120, cublas_ms=0.0130),
           # a host-bound eager win (18%) that its work ratio alone (4% more bytes) would carry
           make_record(H200, "fp16:nt:8x9216x3072", _PHI3_TILE, mode="eager", time_ms=0.0110, cublas_ms=0.0130))
    for key in ("fp16:nt:1x8192x3584", "fp16:nt:8x8192x3584"):
        for mode in ("graph", "eager"):
            chosen = _choose(db_url, key, mode, H200)
            assert is_baseline(chosen.config) and chosen.source.startswith("cublas"), (key, mode, chosen.source)
    # Same K, N 11% wider: gemv's path and cuBLAS's bytes grow alike, so the 9% win carries.
    wider = _choose(db_url, "fp16:nt:1x10240x3072", "graph", H200)
    assert wider.config == _PHI3_GEMV and wider.source == "nearest:fp16:nt:1x9216x3072"
    # Along M, within the tile's 16 rows: the same programs, so the win carries.
    assert _choose(db_url, "fp16:nt:12x9216x3072", "graph", H200).config == _PHI3_TILE


# The H100's shipped record of 16x4096x4096 (bf16, nt, graph): a 16x32 tile, 256 deep, that beat cuBLAS.
_SMALL_M_TILE = Config.from_dict({**TILED.as_dict(), "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256,
                                  "GROUP_SIZE_M": 8, "num_stages": 6})


def test_a_near_win_is_not_carried_across_token_counts_where_a_new_row_of_tiles_adds_waves(db_url) -> None:
    """24x4608x4096 took 16x4096x4096's 16-row tile (won with 128 programs, one wave on 132 SMs) and ran at
    0.68-0.74x cuBLAS on the H100 in every mode: 24 rows need two rows of tiles, 288 programs in three waves,
    while cuBLAS's bytes grew 12%. Its own token count, a little wider, still takes the tile."""
    _store(db_url,
           make_record(H100, "bf16:nt:16x4096x4096", _SMALL_M_TILE, mode="graph", time_ms=0.0200, cublas_ms=0.0230),
           make_record(H100, "bf16:nt:16x4096x4096", _SMALL_M_TILE, mode="eager", time_ms=0.0200, cublas_ms=0.0230))
    for mode in ("graph", "eager"):
        chosen = _choose(db_url, "bf16:nt:24x4608x4096", mode)
        assert is_baseline(chosen.config) and chosen.source.startswith("cublas"), (mode, chosen.source)
    same_rows = _choose(db_url, "bf16:nt:16x4224x4096", "graph")  # 132 programs: still one wave
    assert same_rows.config == _SMALL_M_TILE and same_rows.source == "nearest:bf16:nt:16x4096x4096"


# The H100's record of DeepSeek-V2-Lite's shared-expert down projection at 32 rows (graph, shipped table)
_DEEPSEEK_TILE = Config.from_dict({**TILED.as_dict(), "BLOCK_M": 16, "BLOCK_N": 32, "BLOCK_K": 256, "num_stages": 5})


def test_a_near_win_is_not_carried_where_its_programs_spill_past_one_wave(db_url) -> None:
    """Its 16x32 tile won 32x2048x2816 by 12% with 128 programs on 132 SMs; Gemma-2-2B's 32x2304x2048 (an
    unseen model) took it and ran at 0.85-0.87x cuBLAS: 144 programs, 12 SMs with two. Shared evenly, the
    programs' path shrinks with K (0.79x) and the win seems to carry; counted in whole waves it grows (1.45x),
    and the larger of the two is the one dispatch believes. A neighbour that stays within one wave still
    takes it."""
    _store(db_url, make_record(H100, "bf16:nt:32x2048x2816", _DEEPSEEK_TILE, mode="graph",
                               time_ms=0.01264, cublas_ms=0.01421))
    spilled = _choose(db_url, "bf16:nt:32x2304x2048", "graph")
    assert is_baseline(spilled.config) and spilled.source.startswith("cublas"), spilled.source
    within = _choose(db_url, "bf16:nt:32x2048x3072", "graph")  # 128 programs, one more K step, 9% more bytes
    assert within.config == _DEEPSEEK_TILE and within.source == "nearest:bf16:nt:32x2048x2816"


def test_a_consensus_config_serves_no_k_its_blocks_fill_worse_than_where_it_won(db_url) -> None:
    """GEMV_A (K blocks of 2048) won K = 2048, 8192, 3072 (three quarters full) and 28672. K = 2304 fills its
    second block to one eighth: the H100 ran Gemma-2-2B's 9216x2304 that way at 0.86-0.90x cuBLAS. K = 5120
    (five sixths full) is within what it won."""
    _store(db_url, *_one_row_records([GEMV_A] * 5 + [GEMV_B, None, None]))
    for mode in ("graph", "eager"):
        thin = _choose(db_url, "bf16:nt:1x5120x2304", mode)
        assert is_baseline(thin.config) and "fills K to 0.56 here" in thin.source, (mode, thin.source)
        assert _choose(db_url, "bf16:nt:1x5120x5120", mode).config == GEMV_A, mode


def test_an_eager_call_takes_the_consensus_only_at_a_k_fill_its_eager_contests_won_unless_the_host_paces_it(
        db_url, tmp_path) -> None:
    """GEMV_A won every graph contest of _one_row_records' first five weights, K = 3072 (three quarters full)
    among them, but 3072x3072's eager contest went to GEMV_B: on the H100 GEMV_A ran 5120x3072 and 8192x3072 at
    0.97x torch.matmul's eager call, 1.02-1.03x in graph replays. Its eager wins fill K at least to 1: an eager
    call at K = 3072 takes cuBLAS, a graph call GEMV_A; at K = 4096 both take GEMV_A. Where cuBLAS's GPU time
    (bounded by its graph time on the quickest record of at least as much work) is under the fastest host's
    torch.matmul call, the host paces the eager call and hides the GPU time: the graph wins speak for it (the
    H100 ran 1024x3072 at 2.6x torch.matmul eagerly that way)."""
    graph_winners = [GEMV_A] * 5 + [GEMV_B, None, None, None]
    eager_winners = [GEMV_A, GEMV_A, GEMV_B, GEMV_A, GEMV_A, GEMV_B, None, None, None]
    _store(db_url, *_one_row_records(graph_winners, eager=eager_winners))  # cuBLAS 1.1 ms: GPU-bound
    assert _choose(db_url, "bf16:nt:1x5120x3072", "graph").config == GEMV_A
    gpu_bound = _choose(db_url, "bf16:nt:1x5120x3072", "eager")
    assert is_baseline(gpu_bound.config) and gpu_bound.source == \
        "cublas: the M = 1 consensus fills K to 0.75 here; it won eager contests only at fills of 1.00 or more"
    full = _choose(db_url, "bf16:nt:1x5120x4096", "eager")  # K blocks full, as where its eager contests went to it
    assert full.config == GEMV_A and full.source.startswith("consensus"), full.source
    assert is_baseline(_choose(db_url, "bf16:nt:1x1024x3072", "eager").config)
    none_eager = f"sqlite:///{tmp_path}/none_eager.db"  # every eager contest went to cuBLAS
    _store(none_eager, *_one_row_records(graph_winners, eager=[None] * 9))
    assert _choose(none_eager, "bf16:nt:1x5120x4096", "graph").config == GEMV_A
    assert _choose(none_eager, "bf16:nt:1x5120x4096", "eager").source == \
        "cublas: the M = 1 consensus won no eager contest where it won the graph one"
    streaming = f"sqlite:///{tmp_path}/streaming.db"
    _store(streaming, *_one_row_records(graph_winners, eager=eager_winners, streaming=True))
    paced = _choose(streaming, "bf16:nt:1x1024x3072", "eager")  # 10944x512 (more bytes): cuBLAS 10.3 us
    assert paced.config == GEMV_A and paced.source.startswith("consensus"), paced.source
    assert is_baseline(_choose(streaming, "bf16:nt:1x5120x3072", "eager").config), "2048x10944's cuBLAS: 23 us"


GATED_ROW = Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, GEMV_BLOCK_N=2, GEMV_BLOCK_K=1024,
                        num_warps=4, num_stages=2)


def test_the_gated_one_row_loop_is_judged_by_its_own_k_blocks(db_url) -> None:
    """gated_matmul's one-row loop (GEMV_BLOCK_N > 0, no VARIANT) walks K in GEMV_BLOCK_K steps, as matmul's gemv
    does; read as a tile, its K steps would be BLOCK_K = 32 wide and always full. It won five one-row problems
    whose K its 1024-wide blocks fill whole: K = 2560 (the third block half full) is not among them, K = 4096 is."""
    records = []
    for mode in ("graph", "eager"):
        for (n, k), won in zip(_ONE_ROW_WEIGHTS, [True] * 5 + [False] * 4):
            records.append(make_record(H100, f"bf16:nt:1x{n}x{k}", GATED_ROW if won else BASELINE,
                                       kernel="gated_matmul", mode=mode, time_ms=1.0 if won else 1.1, cublas_ms=1.1))
    _store(db_url, *records)
    for mode in ("graph", "eager"):
        full = _choose_epilogue(db_url, "gated_matmul", "bf16:nt:1x5120x4096", mode)
        assert full.config == GATED_ROW and full.source.startswith("consensus"), (mode, full.source)
        half = _choose_epilogue(db_url, "gated_matmul", "bf16:nt:1x5120x2560", mode)
        assert is_baseline(half.config) and "fills K to 0.83 here" in half.source, (mode, half.source)
