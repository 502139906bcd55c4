"""tune_problem on a tiny space with a known optimum: budget, resuming, pruning, failures, repeats.

The kernel's correctness is test_gemm's business; here the spec runs torch.matmul (on CPU tensors,
on any machine) so that only the search's bookkeeping is under test.
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter

import optuna
import pytest
from optuna.trial import TrialState

from db import Store
import kernels
from kernels import BASELINE, CPU, Config, DeviceInfo, KernelSpec, Param, Problem, SearchSpace
from kernels.dispatch import Dispatcher
from kernels.gemm import MATMUL
from tuner import search
from tuner.search import (Budget, NoWinner, Progress, SearchStats, _neighbours, failure_summary, make_sampler,
                          measured_trials, open_study, study_name, tune_problem, warm_start_configs)
from tuner.space import suggest_config
from tuner.workers import CheckPool

optuna.logging.set_verbosity(optuna.logging.WARNING)

PROBLEM = Problem("matmul", "fp32", "nn", ((32, 32, 32),))
BASELINE_MS = 10.0


def _space(block_n=(32,), constraints=()) -> SearchSpace:
    """12 configs (BLOCK_M x GROUP_SIZE_M x num_stages) times ``block_n``; the rest fixed."""
    params = (Param("VARIANT", ("tiled",)), Param("BLOCK_M", (16, 32)), Param("BLOCK_N", block_n),
              Param("BLOCK_K", (32,)), Param("GROUP_SIZE_M", (1, 4)), Param("SPLIT_K", (1,)),
              Param("NUM_SM", (132,)), Param("FLATTEN", (False,)), Param("EPILOGUE_SUBTILE", (False,)),
              Param("num_warps", (4,)), Param("num_stages", (2, 3, 4)))
    return SearchSpace(params=params, constraints=(*MATMUL.space.constraints, *constraints),
                       ignored=MATMUL.space.ignored)


def _wide_tiles_need_three_stages(config: Config, problem: Problem, device: DeviceInfo) -> str | None:
    """A constraint on a pair of values: each value is valid in some config, so narrowing the space
    (tuner.space.narrowed) cannot take it out, and the sampler still draws invalid configs."""
    if config["BLOCK_M"] == 32 and (config.num_stages != 3 or config["GROUP_SIZE_M"] != 4):
        return f"BLOCK_M=32 with {config.num_stages} stages is ruled out (test constraint)"
    return None


OPTIMUM = dict(BLOCK_M=32, GROUP_SIZE_M=4, num_stages=3)


def fake_ms(config: Config) -> float:
    """A time with one minimum, at OPTIMUM, and no ties."""
    return (1.0 + 0.1 * (config["BLOCK_M"] != 32) + 0.01 * abs(config.num_stages - 3)
            + 0.001 * (config["GROUP_SIZE_M"] != 4) + 0.0001 * (config["BLOCK_N"] != 32))


class Kernel:
    """A KernelSpec built from the dense GEMM's, whose runs and timings are recorded.

    ``timer`` is a test double for bench.gpu_timer (CUDA events cannot run on a CPU, and wall-clock
    times under the interpreter are noise): it runs the candidate and returns fake_ms of the config
    that ran, so the optimum of the search is known.
    """

    def __init__(self, space: SearchSpace, fails=lambda config: False, slowdown=lambda config: 1.0) -> None:
        self.fails = fails
        self.slowdown = slowdown
        self.runs: Counter[Config] = Counter()
        self.timed: list[Config] = []
        self.eager_timed: list[Config] = []
        self.quick_timed: list[Config] = []
        self._last: Config | None = None
        self.spec: KernelSpec = dataclasses.replace(MATMUL, space=space, seeds=lambda p, d: [],
                                                    run=self._run, baseline=self._baseline)

    def _run(self, config: Config, inputs: tuple):
        self._last = config
        self.runs[config] += 1
        if self.fails(config):
            raise RuntimeError(f"boom on BLOCK_M={config['BLOCK_M']}")
        return MATMUL.baseline(inputs)

    def _baseline(self, inputs: tuple):
        self._last = BASELINE
        return MATMUL.baseline(inputs)

    def timer(self, fn) -> float:
        self._last = None
        fn()
        if self._last == BASELINE:
            return BASELINE_MS
        self.timed.append(self._last)
        return fake_ms(self._last) * self.slowdown(self._last)

    def eager_timer(self, call, inputs) -> float:
        """Stands in for timing.eager_ms: the call on the first input set, a time 10% above the graph one
        (host time on top); cuBLAS through our dispatch path counts as the baseline."""
        self._last = None
        call(inputs[0])
        if self._last in (None, BASELINE):
            return BASELINE_MS * 1.1
        self.eager_timed.append(self._last)
        return fake_ms(self._last) * self.slowdown(self._last) * 1.1

    def quick_timer(self, fn) -> float:
        """Stands in for bench.quick_gpu_timer: a rough time, here 1% off the full one."""
        self._last = None
        fn()
        self.quick_timed.append(self._last)
        return fake_ms(self._last) * self.slowdown(self._last) * 1.01


def _tune(kernel: Kernel, db_url: str, trials: int, **options):
    with Store(db_url) as store:
        return tune_problem(kernel.spec, PROBLEM, CPU, store, budget=Budget(trials), timer=kernel.timer,
                            eager_timer=kernel.eager_timer, seed=0, **options)


def _study(db_url: str) -> optuna.Study:
    return open_study(optuna.storages.RDBStorage(db_url), CPU, PROBLEM)


def _states(study: optuna.Study) -> Counter:
    return Counter(t.state for t in study.trials)


def _is_optimum(config: Config | dict) -> bool:
    config = Config.from_dict(config) if isinstance(config, dict) else config
    return all(config[name] == value for name, value in OPTIMUM.items())


def test_search_stores_the_optimum_with_every_record_field(db_url) -> None:
    kernel = Kernel(_space())
    record = _tune(kernel, db_url, trials=36)
    assert _is_optimum(record.config) and record.config == record.triton_config
    assert record.time_ms == pytest.approx(fake_ms(Config.from_dict(record.config)))
    assert record.triton_ms == record.time_ms
    assert (record.device_name, record.device_alias, record.compute_capability) == ("cpu", "cpu", "")
    assert record.sm_count == CPU.sm_count and record.cuda_version == ""
    assert (record.kernel, record.problem_key, record.dtype, record.layout) == ("matmul", PROBLEM.key, "fp32", "nn")
    assert record.shapes == PROBLEM.shapes
    assert record.trials == 12, "--trials counts distinct configs; the space has only 12"
    assert record.cublas_ms == BASELINE_MS
    assert record.tflops == pytest.approx(PROBLEM.flops / (record.time_ms * 1e-3) / 1e12)
    assert record.torch_version and record.triton_version
    with Store(db_url) as store:
        assert store.get("cpu", "matmul", PROBLEM.key) == record


def test_budget_of_the_space_size_measures_every_config(db_url) -> None:
    kernel = Kernel(_space())
    record = _tune(kernel, db_url, trials=12)
    assert len(set(kernel.timed)) == 12
    assert _is_optimum(record.config)


def test_repeats_are_answered_from_the_study(db_url) -> None:
    kernel = Kernel(_space())
    _tune(kernel, db_url, trials=30)
    assert len(kernel.timed) == len(set(kernel.timed)), "a config was timed twice"
    assert len(kernel.eager_timed) == len(set(kernel.eager_timed)), "a config was timed twice in eager mode"
    assert max(kernel.runs.values()) == 3, "each config runs once to check and once to time per mode"
    study = _study(db_url)
    complete = study.get_trials(states=(TrialState.COMPLETE,))
    configs = [t.user_attrs["config"] for t in complete]
    assert len(set(configs)) == 12 < len(configs), "the sampler repeated itself on a 12-config space"
    assert all(t.user_attrs.get("repeat") for t in complete[12:] if configs.count(t.user_attrs["config"]) > 1
               and configs.index(t.user_attrs["config"]) < complete.index(t)), "repeats are marked as such"
    assert len(measured_trials(study)) == 12, "repeats cost nothing and do not count against --trials"


def test_resumed_search_keeps_finished_trials_and_measures_only_new_configs(db_url) -> None:
    first = Kernel(_space())
    assert _tune(first, db_url, trials=4).trials == 4
    assert len(first.timed) == 4
    second = Kernel(_space())
    record = _tune(second, db_url, trials=8)
    assert record.trials == 8
    study = _study(db_url)
    assert len(measured_trials(study)) == 8
    assert not set(first.timed) & set(second.timed), "a config of the first run was measured again"
    assert len(second.timed) <= 4
    again = Kernel(_space())
    assert _tune(again, db_url, trials=8).trials == 8
    assert again.timed == [], "a finished budget measures nothing new"


def test_invalid_configs_are_pruned_and_do_not_count(db_url) -> None:
    kernel = Kernel(_space(constraints=(_wide_tiles_need_three_stages,)))  # 7 valid configs of 12, OPTIMUM one of them
    record = _tune(kernel, db_url, trials=6)
    study = _study(db_url)
    states = _states(study)
    assert len(measured_trials(study)) == 6 == record.trials == len(set(kernel.timed))
    assert states[TrialState.PRUNED] >= 1
    pruned = study.get_trials(states=(TrialState.PRUNED,))
    assert all(t.user_attrs["status"] == "invalid" and "test constraint" in t.user_attrs["reason"] for t in pruned)
    assert all(_wide_tiles_need_three_stages(config, PROBLEM, CPU) is None for config in kernel.runs), \
        "an invalid config was run"


def test_the_sampler_never_draws_a_value_no_valid_config_has(db_url) -> None:
    kernel = Kernel(_space(block_n=(32, 64)))  # BLOCK_N=64 is wider than N=32: half the space is invalid
    record = _tune(kernel, db_url, trials=6)
    study = _study(db_url)
    assert record.trials == 6 and _states(study)[TrialState.PRUNED] == 0
    assert all(t.params["BLOCK_N"] == 0 for t in study.trials), "only index 0 of BLOCK_N = (32,) is drawn"
    assert all(t.distributions["BLOCK_N"].high == 0 for t in study.trials)
    assert all(config["BLOCK_N"] == 32 for config in kernel.runs)


def test_crashing_candidate_is_recorded_as_failed_and_the_search_goes_on(db_url) -> None:
    kernel = Kernel(_space(), fails=lambda config: config["BLOCK_M"] == 16)
    record = _tune(kernel, db_url, trials=24)
    assert _is_optimum(record.config)
    failed = _study(db_url).get_trials(states=(TrialState.FAIL,))
    assert failed, "some BLOCK_M=16 config must have been tried"
    for trial in failed:
        assert trial.user_attrs["status"] == "error"
        assert trial.user_attrs["reason"] == "RuntimeError: boom on BLOCK_M=16"
        assert "BLOCK_M: 16" in trial.user_attrs["config"]
    assert all(count == 1 for config, count in kernel.runs.items() if config["BLOCK_M"] == 16), \
        "a failed config was run again instead of answered from the study"


def test_timer_reading_nan_or_inf_fails_its_trial_and_a_resumed_search_goes_on(db_url) -> None:
    # The test double of the GPU timer reads NaN for num_stages 3 (the optimum's) and inf for num_stages 4:
    # a timer fault, not a speed. Optuna fails a NaN objective on its own, and the trial had kept status "ok"
    # with no value: a resumed search then crashed comparing its missing time.
    broken = {3: float("nan"), 4: float("inf")}
    first = Kernel(_space(), slowdown=lambda config: broken.get(config.num_stages, 1.0))
    record = _tune(first, db_url, trials=6)
    assert record.config["num_stages"] == 2
    study = _study(db_url)
    faulty = [t for t in study.trials if Config.parse(t.user_attrs["config"]).num_stages in broken]
    assert faulty, "some config with a broken timing must have been tried"
    for trial in faulty:
        assert trial.state == TrialState.FAIL and trial.user_attrs["status"] == "error", trial.user_attrs
        assert "ms" in trial.user_attrs["reason"] and "timer" in trial.user_attrs["reason"]
    resumed = _tune(Kernel(_space()), db_url, trials=8)
    assert resumed.trials == 8


def test_search_whose_winner_time_is_implausible_stores_nothing(db_url) -> None:
    # A timer glitch: every config measures 1e-30 of its time, far under any device's floor.
    kernel = Kernel(_space(), slowdown=lambda config: 1e-30)
    with pytest.raises(NoWinner, match="not plausible"):
        _tune(kernel, db_url, trials=3)
    with Store(db_url) as store:
        assert store.records() == []


def test_search_where_nothing_runs_raises(db_url) -> None:
    kernel = Kernel(_space(), fails=lambda config: True)
    with pytest.raises(NoWinner, match="no config of matmul ran correctly") as info:
        _tune(kernel, db_url, trials=3)
    assert "RuntimeError: boom" in str(info.value), "the message says how the configs failed"
    with Store(db_url) as store:
        assert store.records() == []


def test_no_winner_counts_each_failed_config_once(db_url) -> None:
    # Budget 12 on a 12-config space where all fail: the sampler proposes failed configs again, and those
    # repeats (answered from the study, not run) were counted as failures too: 20 failures "in 12 trials".
    with pytest.raises(NoWinner) as info:
        _tune(Kernel(_space(), fails=lambda config: True), db_url, trials=12)
    assert any(t.user_attrs.get("repeat") for t in _study(db_url).trials), "the test needs repeats"
    counts = re.findall(r"(\d+)x error", str(info.value))
    assert "in 12 trials" in str(info.value) and sum(map(int, counts)) == 12, str(info.value)


def test_no_winner_says_how_to_measure_the_failed_configs_again(db_url) -> None:
    # The study keeps each failed config's verdict, so rerunning after fixing the cause (a broken compiler, a
    # busy GPU) answers them from the study and fails at once: the message must say the way out.
    with pytest.raises(NoWinner) as info:
        _tune(Kernel(_space(), fails=lambda config: True), db_url, trials=3)
    with pytest.raises(NoWinner):
        _tune(Kernel(_space()), db_url, trials=3)  # the cause is gone, but nothing is measured again
    message = str(info.value)
    name = study_name(CPU, PROBLEM)
    assert "optuna delete-study" in message and db_url in message and name in message
    optuna.delete_study(study_name=name, storage=db_url)  # what the message says to do
    assert _tune(Kernel(_space()), db_url, trials=3).trials == 3


def test_progress_reports_each_trial(db_url) -> None:
    seen: list[Progress] = []
    _tune(Kernel(_space()), db_url, trials=5, on_trial=seen.append)
    assert [p.trial for p in seen] == [1, 2, 3, 4, 5]
    assert all(p.budget == 5 and p.problem == PROBLEM and p.status == "ok" for p in seen)
    best = [p.best_ms for p in seen]
    assert best == sorted(best, reverse=True), "the best time never gets worse"


def test_tuned_neighbour_is_a_warm_start(db_url) -> None:
    kernel = Kernel(_space())
    with Store(db_url) as store:
        neighbour = Problem("matmul", "fp32", "nn", ((32, 32, 64),))
        tune_problem(kernel.spec, neighbour, CPU, store, budget=Budget(36), timer=kernel.timer, seed=0)
    kernel.timed.clear()
    _tune(kernel, db_url, trials=1)
    assert len(kernel.timed) == 1 and _is_optimum(kernel.timed[0]), "the neighbour's winner is tried first"


def test_the_same_shapes_in_the_other_half_precision_dtype_are_a_warm_start(db_url) -> None:
    kernel = Kernel(_space())
    fp16, bf16 = (dataclasses.replace(PROBLEM, dtype=dtype) for dtype in ("fp16", "bf16"))
    with Store(db_url) as store:
        fp16_winner = tune_problem(kernel.spec, fp16, CPU, store, budget=Budget(36), timer=kernel.timer, seed=0)
        first = warm_start_configs(kernel.spec, bf16, CPU, store)
    assert _is_optimum(fp16_winner.config)
    assert Config.from_dict(fp16_winner.config) in first[:2], "fp16's winner is among bf16's first trials"


def test_without_the_shipped_table_a_fresh_database_starts_from_default_and_seeds(db_url) -> None:
    """The shipped h100 table has this problem; ``use_shipped=False`` keeps its winner out of the start."""
    spec = kernels.get_kernel("matmul")
    problem = Problem.from_key("matmul", "fp16:nn:16x4096x4096")
    h100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", alias="h100", compute_capability="9.0", sm_count=132,
                      shared_memory_bytes=232_448)
    shipped = Dispatcher(db_url).choose(spec, problem, h100)
    assert shipped.source == "shipped" and not kernels.is_baseline(shipped.config), \
        "the test needs a problem the shipped table has, with a Triton winner"
    with Store(db_url) as store:
        warm = warm_start_configs(spec, problem, h100, store)
        cold = warm_start_configs(spec, problem, h100, store, use_shipped=False)
    shipped_config = spec.space.canonical(shipped.config, problem)
    default_and_seeds = search._valid_unique(spec, problem, h100, [spec.default_config(problem, h100)]
                                             + spec.seeds(problem, h100))
    assert cold == default_and_seeds
    assert warm == [shipped_config] + [c for c in default_and_seeds if c != shipped_config]


def test_a_cublas_winner_in_the_shipped_table_is_left_out_of_the_warm_start(db_url) -> None:
    """The shipped h100 table keeps cuBLAS for 1000x1000x1000 (graph mode). Its config has no tile parameters,
    which the problem's folds once read: the search crashed before its first trial (2026-11-23)."""
    spec = kernels.get_kernel("matmul")
    problem = Problem.from_key("matmul", "fp16:nn:1000x1000x1000")
    h100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", alias="h100", compute_capability="9.0", sm_count=132,
                      shared_memory_bytes=232_448)
    assert kernels.is_baseline(Dispatcher(db_url).choose(spec, problem, h100, "graph").config), \
        "the test needs a problem whose shipped winner is cuBLAS"
    with Store(db_url) as store:
        warm = warm_start_configs(spec, problem, h100, store)
    assert warm and not any(kernels.is_baseline(c) for c in warm)
    assert all(spec.space.violation(c, problem, h100) is None for c in warm)
    assert spec.space.canonical(kernels.BASELINE, problem) == kernels.BASELINE


def _steps_apart(a: Config, b: Config, space: SearchSpace) -> list[int]:
    """How many value steps each differing parameter of ``a`` and ``b`` lies apart."""
    def value(config: Config, p) -> object:  # a variant that ignores a defaulted parameter leaves it out
        return config.get(p.name, p.default)

    return [abs(p.values.index(value(a, p)) - p.values.index(value(b, p))) for p in space.params
            if value(a, p) != value(b, p)]


def test_neighbours_are_one_step_in_one_parameter_knobs_first() -> None:
    space = MATMUL.space
    config = space.canonical(Config.make(VARIANT="tma", BLOCK_M=128, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8,
                                         SPLIT_K=1, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False,
                                         num_warps=8, num_stages=3))
    found = _neighbours(config, space)
    assert found and all(_steps_apart(config, n, space) == [1] for n in found)
    assert len(found) == len(set(found)) and config not in found
    assert {n.num_stages for n in found[:2]} == {2, 4}, "num_stages is stepped first"
    assert all(space.canonical(n) == n for n in found)


def test_polish_tries_neighbours_of_the_best_so_far(db_url) -> None:
    kernel = Kernel(_space(block_n=(32, 64, 128, 256)))
    _tune(kernel, db_url, trials=20)
    trials = sorted(_study(db_url).trials, key=lambda t: t.number)
    polished = [t for t in trials if t.user_attrs.get("polish")]
    assert polished, "the polish took some asks"
    space = kernel.spec.space
    for t in polished:
        done = [u for u in trials if u.number < t.number and u.state == TrialState.COMPLETE]
        assert len(done) >= search.POLISH_AFTER
        best = Config.parse(min(done, key=lambda u: u.value).user_attrs["config"])
        assert _steps_apart(best, Config.parse(t.user_attrs["config"]), space) == [1]


def test_polish_off_leaves_every_ask_to_the_sampler(db_url, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "POLISH_EVERY", 0)
    _tune(Kernel(_space(block_n=(32, 64, 128, 256))), db_url, trials=20)
    assert not [t for t in _study(db_url).trials if t.user_attrs.get("polish")]


class _ContestBench:
    """Stands in for the GPU bench's side-by-side timing (no GPU here): returns the given times in turn."""

    problem = PROBLEM

    def __init__(self, *results: tuple[list[float], float]) -> None:
        self.results = list(results)
        self.contests: list[list[Config]] = []

    def contest(self, configs: list[Config], mode: str = "graph", graph: Config | None = None
                ) -> tuple[list[float], float]:
        self.contests.append(list(configs))
        return self.results.pop(0)


A, B = Config.make(BLOCK_M=16), Config.make(BLOCK_M=32)


def test_the_contest_picks_the_fastest_finalist_side_by_side() -> None:
    bench = _ContestBench(([0.0212, 0.0205], 0.0227))
    (winner, contest_ms), baseline_ms = search.head_to_head(bench, [(A, 0.0203), (B, 0.0206)])
    assert winner == (B, 0.0206) and (contest_ms, baseline_ms) == (0.0205, 0.0227)
    assert bench.contests == [[A, B]]


def test_a_contest_far_off_the_search_is_timed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "CONTEST_PAUSE_S", 0.0)
    disturbed = _ContestBench(([0.0691], 0.0227), ([0.0204], 0.0227))
    assert search.head_to_head(disturbed, [(A, 0.0203)]) == (((A, 0.0203), 0.0204), 0.0227)
    assert len(disturbed.contests) == 2
    calm = _ContestBench(([0.0210], 0.0227))
    assert search.head_to_head(calm, [(A, 0.0203)]) == (((A, 0.0203), 0.0210), 0.0227)
    assert len(calm.contests) == 1
    # 1.44x off, as one moe_matmul contest on the H100 was: not believed either.
    mild = _ContestBench(([0.0552, 0.0560], 0.0618), ([0.0386, 0.0390], 0.0604))
    assert search.head_to_head(mild, [(A, 0.0384), (B, 0.0385)]) == (((A, 0.0384), 0.0386), 0.0604)
    # A believed attempt decides, even when a disturbed one before it had a lower best.
    believed = _ContestBench(([0.0116, 0.0130], 0.020), ([0.0125, 0.0120], 0.019))
    assert search.head_to_head(believed, [(A, 0.0100), (B, 0.0110)]) == (((B, 0.0110), 0.0120), 0.019)


def test_a_contest_disturbed_every_time_keeps_its_calmest_attempt(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(search, "CONTEST_PAUSE_S", 0.0)
    bench = _ContestBench(([0.0822, 0.0900], 0.14), ([0.0700, 0.0650], 0.12), ([0.0800, 0.0810], 0.13))
    (winner, contest_ms), baseline_ms = search.head_to_head(bench, [(A, 0.0061), (B, 0.0062)])
    assert len(bench.contests) == search.CONTEST_ATTEMPTS == 3
    assert (winner, contest_ms, baseline_ms) == ((B, 0.0062), 0.0650, 0.12), "the attempt with the lowest best"


def test_finalists_are_the_distinct_fully_timed_configs_near_the_best(db_url) -> None:
    kernel = Kernel(_space(block_n=(32, 64, 128, 256)))
    _tune(kernel, db_url, trials=20)
    study = _study(db_url)
    chosen = search.finalists(study, most=3, within=0.05)
    assert 1 <= len(chosen) <= 3 and len({c for c, _ in chosen}) == len(chosen)
    times = [ms for _, ms in chosen]
    assert times == sorted(times) and times[-1] <= times[0] * 1.05
    full = [t for t in study.trials if t.state == TrialState.COMPLETE and t.user_attrs.get("status") == "ok"
            and t.user_attrs.get("timing") != "quick"]
    assert times[0] == min(t.value for t in full), "the best fully timed config leads"
    assert search.finalists(study, most=1) == chosen[:1]


def test_eager_finalists_must_have_run_near_cublas_on_the_gpu() -> None:
    """An eager win of a config that is slower on the GPU holds only on a host as slow as the tuning one."""
    study = optuna.create_study()
    distribution = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for n, (graph_ms, eager_ms) in enumerate(((0.030, 0.018), (0.020, 0.019), (0.021, 0.020))):
        config = Config.make(BLOCK_M=16 * (n + 1))
        study.add_trial(optuna.trial.create_trial(
            params={"x": 0.5}, distributions=distribution, value=graph_ms,
            user_attrs={"status": "ok", "config": str(config), "eager_ms": eager_ms, "graph_ms": graph_ms}))
    fastest_eager = search.finalists(study, most=1, within=0.5, mode="eager")
    assert fastest_eager[0][0]["BLOCK_M"] == 16, "without a limit the GPU-slow config leads"
    near_cublas = search.finalists(study, most=3, within=0.5, mode="eager", gpu_limit_ms=0.0206)
    assert [c["BLOCK_M"] for c, _ in near_cublas] == [32]


def test_time_budget_stops_the_search(db_url) -> None:
    kernel = Kernel(_space())
    with Store(db_url) as store:
        record = tune_problem(kernel.spec, PROBLEM, CPU, store, budget=Budget(trials=10_000, seconds=0.5),
                              timer=kernel.timer, seed=0)
    assert 1 <= record.trials < 10_000


def test_unknown_sampler_names_the_choices() -> None:
    with pytest.raises(ValueError, match="tpe, random, gp, cmaes"):
        make_sampler("annealing", seed=0)


def test_study_name_is_readable_and_bounded() -> None:
    assert study_name(CPU, PROBLEM) == "cpu|matmul|fp32:nn:32x32x32"
    huge = Problem("grouped_matmul", "fp16", "nn", tuple((i + 1, 64, 64) for i in range(200)))
    name = study_name(CPU, huge)
    assert len(name) <= 512 and name != study_name(CPU, Problem("grouped_matmul", "fp16", "nn",
                                                                 tuple((i + 2, 64, 64) for i in range(200))))


def test_clearly_slower_candidates_get_only_a_quick_timing(db_url) -> None:
    kernel = Kernel(_space(), slowdown=lambda config: 3.0 if config["BLOCK_M"] == 16 else 1.0)
    finished: list[SearchStats] = []
    record = _tune(kernel, db_url, trials=12, quick_timer=kernel.quick_timer, on_finish=finished.append)
    assert _is_optimum(record.config)
    assert _is_optimum(kernel.timed[-1]) or any(_is_optimum(c) for c in kernel.timed), "the winner had a full timing"
    slow = [c for c in kernel.quick_timed if c["BLOCK_M"] == 16]
    assert slow, "the six 3x slower configs were all measured"
    assert not any(c["BLOCK_M"] == 16 for c in kernel.timed[1:]), "a 3x slower config got a full timing"
    quick = [t for t in _study(db_url).get_trials(states=(TrialState.COMPLETE,)) if t.user_attrs.get("timing")]
    assert {t.user_attrs["timing"] for t in quick} == {"quick"}
    assert all("BLOCK_M: 16" in t.user_attrs["config"] for t in quick)
    assert all(t.value == pytest.approx(3.03 * fake_ms(Config.parse(t.user_attrs["config"]))) for t in quick), \
        "an early-stopped trial keeps its quick time"
    assert finished[0].early_stopped == len(quick) and finished[0].measured == 12


def test_killed_search_leaves_no_running_trial_behind(db_url) -> None:
    kernel = Kernel(_space())
    study = _study(db_url)
    orphan = study.ask()  # asked, then the process was killed before the tell
    suggest_config(orphan, kernel.spec.space)
    record = _tune(kernel, db_url, trials=3)
    study = _study(db_url)
    assert not study.get_trials(states=(TrialState.RUNNING,))
    dead = study.trials[orphan.number]
    assert dead.state == TrialState.FAIL and dead.user_attrs["interrupted"]
    assert record.trials == 3 == len(measured_trials(study)), "the interrupted trial is not counted"
    remeasured = [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if t.params == dead.params]
    assert remeasured, "the interrupted config was asked again"
    assert "interrupted" not in failure_summary(study) and failure_summary(study) == "none recorded"


class SpyPool(CheckPool):
    """A real CheckPool (workers check the real kernel under the interpreter) that records how many
    candidates were in flight at each submit."""

    peak = 0

    def submit(self, problem, config, seed=0) -> None:
        super().submit(problem, config, seed)
        self.peak = max(self.peak, len(self._pending))


def test_pipelined_search_with_worker_pool_keeps_ahead_in_flight(db_url) -> None:
    kernel = Kernel(_space())
    finished: list[SearchStats] = []
    with SpyPool(workers=3) as pool:
        record = _tune(kernel, db_url, trials=12, pool=pool, ahead=2, on_finish=finished.append)
        assert pool.peak == 2 and pool.in_flight == 0
    assert _is_optimum(record.config) and record.trials == 12
    assert len(set(kernel.timed)) == 12
    assert max(kernel.runs.values()) == 2, "checked in a worker, a candidate is only timed here (once per mode)"
    stats = finished[0]
    assert stats.measured == 12 and stats.compile_wait_s > 0 and stats.search_s >= stats.compile_wait_s
    assert not _study(db_url).get_trials(states=(TrialState.RUNNING,))


def test_a_search_that_fails_midway_leaves_the_shared_pool_clean_for_the_next_problem(db_url) -> None:
    # The CLI and fleet workers keep one CheckPool for all their problems and go on after one fails. A failure
    # with candidates in flight (here the progress display's pipe closed, as under `search ... | head`) left
    # their verdicts in the pool, where the next problem's search took them for its own.
    def closed_pipe(progress: Progress) -> None:
        raise BrokenPipeError("the progress display's pipe is closed")

    with CheckPool(workers=3) as pool:
        with pytest.raises(BrokenPipeError):
            _tune(Kernel(_space()), db_url, trials=12, pool=pool, ahead=3, on_trial=closed_pipe)
        kernel = Kernel(_space())
        other = Problem("matmul", "fp32", "nn", ((32, 32, 64),))
        with Store(db_url) as store:
            record = tune_problem(kernel.spec, other, CPU, store, budget=Budget(6), timer=kernel.timer,
                                  eager_timer=kernel.eager_timer, seed=0, pool=pool, ahead=3)
        assert record.trials == 6 and pool.in_flight == 0
    study = open_study(optuna.storages.RDBStorage(db_url), CPU, other)
    assert len(measured_trials(study)) == 6 and all(t.user_attrs["status"] == "ok" for t in measured_trials(study))


def test_gp_sampler_learns_the_constraints_instead_of_repeating_an_invalid_config(db_url) -> None:
    pytest.importorskip("scipy", reason="Optuna's GP sampler needs scipy (the `samplers` extra)")
    kernel = Kernel(_space(constraints=(_wide_tiles_need_three_stages,)))  # 7 valid configs of 12, OPTIMUM one of them
    record = _tune(kernel, db_url, trials=12, sampler="gp")
    study = _study(db_url)
    assert _is_optimum(record.config), "GP found the optimum (and then converged on it)"
    assert record.trials == len(measured_trials(study)) >= 4
    invalid = [t for t in study.trials if t.user_attrs.get("status") == "invalid"]
    assert invalid and all(t.state == TrialState.COMPLETE and t.constraints == {"valid": 1.0} for t in invalid)
    measured = [t for t in study.get_trials(states=(TrialState.COMPLETE,)) if t.user_attrs["status"] == "ok"]
    assert all(t.constraints == {"valid": 0.0} for t in measured)
    assert len(invalid) < 100, "GP kept proposing invalid configs"


def test_search_with_a_pool_times_in_the_isolated_timing_worker(db_url, monkeypatch) -> None:
    from tuner import search, workers

    made = []

    class Spy(workers.IsolatedBench):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(search, "IsolatedBench", Spy)
    problem = Problem("matmul", "fp16", "nn", ((16, 32, 32),))
    with Store(db_url) as store, CheckPool(workers=2) as pool:
        record = tune_problem(MATMUL, problem, CPU, store, budget=Budget(3), seed=0, pool=pool)
    assert len(made) == 1, "the real kernel, with no test timer, is timed in the worker"
    assert record.trials == 3 and record.time_ms > 0
    study = open_study(optuna.storages.RDBStorage(db_url), CPU, problem)
    assert all(t.user_attrs["status"] == "ok" for t in measured_trials(study))


def _benches_held_in_the_timing_worker() -> int:
    """Runs in the timing worker: how many problems' benches (and their rotating inputs) it still holds."""
    from tuner import workers

    return len(workers._BENCHES)


def test_a_finished_search_frees_its_inputs_in_the_timing_worker(db_url) -> None:
    # Bench.release frees a problem's rotating inputs (up to 4 GiB of GPU memory) once it is done; timed in the
    # timing worker, the search had nothing to call, and the worker kept them while the next problem's compile
    # workers ran on the same GPU.
    problem = Problem("matmul", "fp16", "nn", ((16, 32, 32),))
    with Store(db_url) as store, CheckPool(workers=2) as pool:
        tune_problem(MATMUL, problem, CPU, store, budget=Budget(2), seed=0, pool=pool)
        assert pool.timing.call(_benches_held_in_the_timing_worker) == 0


def test_a_search_that_fails_frees_its_inputs_in_the_timing_worker(db_url) -> None:
    # A search that ended in an error (here the progress display's pipe closed; NoWinner or a contest's error
    # alike) kept its bench, and so its rotating inputs, in the timing worker for the rest of the run: a fleet
    # worker that met a few such problems held a few times 4 GiB of GPU memory.
    def closed_pipe(progress: Progress) -> None:
        raise BrokenPipeError("the progress display's pipe is closed")

    problem = Problem("matmul", "fp16", "nn", ((16, 32, 32),))
    with Store(db_url) as store, CheckPool(workers=2) as pool:
        with pytest.raises(BrokenPipeError):
            # One trial, one in flight: nothing is left in flight when it fails, so the pool is not closed.
            tune_problem(MATMUL, problem, CPU, store, budget=Budget(1), seed=0, pool=pool, ahead=1,
                         on_trial=closed_pipe)
        assert pool.timing.call(_benches_held_in_the_timing_worker) == 0


def test_an_interrupted_trial_of_an_older_space_is_asked_again_by_its_config(db_url) -> None:
    """A study begun when the sampler drew from the whole space (BLOCK_N 32 or 64) resumes under the
    space narrowed to the problem (BLOCK_N=64 is invalid for N=32): the interrupted config is asked
    again by what it is, and one the narrowed space cannot ask is dropped, not crashed on."""
    wide = _space(block_n=(32, 64))
    study = _study(db_url)
    for block_n in (32, 64):
        orphan = study.ask()
        config = suggest_config(orphan, wide)
        config = config.replace(BLOCK_N=block_n)
        orphan.set_user_attr("config", str(config))
    kernel = Kernel(wide)
    _tune(kernel, db_url, trials=3)
    study = _study(db_url)
    dead = [t for t in study.trials if t.user_attrs.get("interrupted")]
    assert len(dead) == 2 and all(t.state == TrialState.FAIL for t in dead)
    asked_again = Config.parse(dead[0].user_attrs["config"])
    assert asked_again in kernel.runs, "the valid interrupted config was measured"
    assert all(config["BLOCK_N"] == 32 for config in kernel.runs)


def test_narrowing_keeps_categorical_choices_and_integer_kinds() -> None:
    """What keeps a study that an older version began resumable: Optuna refuses a categorical
    parameter whose choices change, and a parameter whose kind changes, within one study."""
    from tuner.space import is_ordinal, narrowed

    h100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", alias="h100", compute_capability="9.0", sm_count=132,
                      shared_memory_bytes=232_448)
    problem = Problem.from_key("matmul", "fp16:nn:3333x257x4099")  # rows not 16-byte aligned: no TMA
    space = narrowed(MATMUL.space, problem, h100)
    assert space.param("VARIANT").values == MATMUL.space.param("VARIANT").values, "tma stays a choice"
    small_m = narrowed(MATMUL.space, Problem.from_key("matmul", "fp16:nn:16x4096x4096"), h100)
    assert small_m.param("BLOCK_M").values == (16,) and is_ordinal(small_m.param("BLOCK_M"))
    assert small_m.param("GROUP_SIZE_M").values == (1,)


def test_the_sampled_space_is_fixed_when_the_study_begins_and_kept_with_it(db_url) -> None:
    kernel = Kernel(_space(block_n=(32, 64)))  # BLOCK_N=64 is invalid for N=32
    _tune(kernel, db_url, trials=2)
    study = _study(db_url)
    assert study.user_attrs[search.SAMPLED_VALUES]["BLOCK_N"] == [32]
    assert search.sampled_space(study, kernel.spec, PROBLEM, CPU).param("BLOCK_N").values == (32,)
    again = Kernel(_space(block_n=(32, 64)))
    assert _tune(again, db_url, trials=4).trials == 4, "it resumes over the same lists"
    assert all(config["BLOCK_N"] == 32 for config in again.runs)


def test_a_study_begun_before_narrowing_goes_on_over_the_whole_space(db_url) -> None:
    kernel = Kernel(_space(block_n=(32, 64)))
    study = _study(db_url)
    trial = study.ask()  # drawn from the whole space, as versions before narrowing did
    config = suggest_config(trial, kernel.spec.space)
    trial.set_user_attr("config", str(config))
    study.tell(trial, 1.5)
    assert search.sampled_space(study, kernel.spec, PROBLEM, CPU) is kernel.spec.space
    assert _tune(kernel, db_url, trials=3).trials >= 3, "no distribution clash on resume"
    study = _study(db_url)
    assert search.SAMPLED_VALUES not in study.user_attrs


def test_a_study_begun_before_a_variant_was_added_goes_on_over_its_own_choices(db_url) -> None:
    # A study with no stored lists, begun when VARIANT had fewer choices and a parameter did not exist:
    # Optuna refuses a categorical whose choices change within a study, so it goes on over what it drew.
    before = Kernel(_space(block_n=(32, 64)))
    study = _study(db_url)
    trial = study.ask()
    config = suggest_config(trial, before.spec.space)
    trial.set_user_attr("config", str(config))
    study.tell(trial, 1.5)
    grown = dataclasses.replace(before.spec.space, params=tuple(
        dataclasses.replace(p, values=(*p.values, "gemv")) if p.name == "VARIANT" else p
        for p in before.spec.space.params) + (Param("GEMV_BLOCK_N", (1, 2, 4), default=1),))
    space = search.sampled_space(_study(db_url), dataclasses.replace(before.spec, space=grown), PROBLEM, CPU)
    assert space.param("VARIANT").values == before.spec.space.param("VARIANT").values
    assert space.param("GEMV_BLOCK_N").values == (1,)


def test_stored_lists_without_a_new_parameter_keep_its_default(db_url) -> None:
    kernel = Kernel(_space(block_n=(32, 64)))
    assert _tune(kernel, db_url, trials=2).trials == 2
    grown = dataclasses.replace(kernel.spec.space, params=kernel.spec.space.params
                                + (Param("GEMV_BLOCK_N", (1, 2, 4), default=1),))
    space = search.sampled_space(_study(db_url), dataclasses.replace(kernel.spec, space=grown), PROBLEM, CPU)
    assert space.param("GEMV_BLOCK_N").values == (1,)
    assert space.param("BLOCK_N").values == tuple(_study(db_url).user_attrs[search.SAMPLED_VALUES]["BLOCK_N"])


def test_the_stored_winner_carries_the_portable_values_of_its_fold() -> None:
    h100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", alias="h100", compute_capability="9.0", sm_count=132,
                      shared_memory_bytes=232_448)
    problem = Problem.from_key("matmul", "fp16:nn:16x4096x4096")
    found = MATMUL.space.canonical(Config.make(VARIANT="tma", BLOCK_M=16, BLOCK_N=128, BLOCK_K=64, GROUP_SIZE_M=8,
                                               SPLIT_K=1, NUM_SM=264, FLATTEN=False, EPILOGUE_SUBTILE=False,
                                               num_warps=4, num_stages=4), problem)
    assert (found["NUM_SM"], found["GROUP_SIZE_M"]) == (32, 1)
    record = search._winner_record(MATMUL, problem, h100, (found, 0.020), baseline_ms=0.023, trials=25)
    assert (record.config["NUM_SM"], record.config["GROUP_SIZE_M"]) == (132, 8)
    assert record.triton_config == record.config


def test_verdicts_of_a_study_begun_before_a_fold_are_keyed_by_the_folded_config() -> None:
    problem = Problem.from_key("matmul", "fp16:nn:16x4096x4096")  # one row of tiles: GROUP_SIZE_M folds to 1
    asked = Config.make(VARIANT="tiled", BLOCK_M=16, BLOCK_N=64, BLOCK_K=256, GROUP_SIZE_M=8, SPLIT_K=1, NUM_SM=132,
                        FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=5)
    study = optuna.create_study(direction="minimize")
    trial = study.ask()
    trial.set_user_attr("config", str(asked))
    trial.set_user_attr("status", "ok")
    study.tell(trial, 0.0213)
    verdicts = search._verdicts(study, MATMUL.space, problem)
    folded = MATMUL.space.canonical(asked, problem)
    assert folded["GROUP_SIZE_M"] == 1 and list(verdicts) == [str(folded)]
    assert verdicts[str(folded)].time_ms == 0.0213


H100 = DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232_448)
THIN = Problem.from_key("matmul", "fp16:nt:16x256x4096")


class _GpuBench(_ContestBench):
    """Stands in for the GPU's timers (no GPU here): torch.matmul at 0.020 ms in both modes, our cuBLAS
    path at 0.021 ms eager alone and 0.0205 ms in a contest (so a test sees which one was kept), every
    config in a contest at the times given, and back to back on the GPU (``Bench.back_to_back``) each
    config at ``stream_ms`` against cuBLAS's 0.015 ms."""

    contest_cublas_ms = 0.0205

    problem = THIN

    def __init__(self, config_ms: float, stream_ms: float = 0.015) -> None:
        super().__init__()
        self.config_ms, self.stream_ms = config_ms, stream_ms
        self.streamed: list[Config] = []

    def back_to_back(self, config: Config) -> tuple[float, float]:
        self.streamed.append(config)
        return self.stream_ms, 0.015

    def release(self) -> None:
        pass

    def contest(self, configs: list[Config], rounds: int | None = None, mode: str = "graph",
                graph: Config | None = None) -> tuple[list[float], float]:
        self.contests.append(list(configs))
        return [self.contest_cublas_ms if kernels.is_baseline(c) else self.config_ms for c in configs], 0.020

    def baseline_ms(self, mode: str = "graph") -> float:
        return 0.020

    def time(self, config: Config, mode: str = "graph") -> float:
        return 0.021


def _trial_study(*configs: tuple[Config, float, float]) -> optuna.Study:
    """A study whose trials are (config, GPU ms, eager ms), as the search leaves them."""
    study = optuna.create_study()
    distribution = {"x": optuna.distributions.FloatDistribution(0, 1)}
    for config, graph_ms, eager_ms in configs:
        study.add_trial(optuna.trial.create_trial(
            params={"x": 0.5}, distributions=distribution, value=graph_ms,
            user_attrs={"status": "ok", "config": str(config), "eager_ms": eager_ms, "graph_ms": graph_ms}))
    return study


def test_with_no_config_near_cublas_on_the_gpu_cublas_wins_eager_without_a_contest() -> None:
    """A config 1.5x slower than cuBLAS on the GPU but quicker eager (host time) must not win eager calls,
    even when it is the only config with an eager time."""
    host_fast = MATMUL.default_config(THIN, H100)
    bench = _GpuBench(config_ms=0.030)
    records = search.decide_modes(MATMUL, THIN, H100, bench, _trial_study((host_fast, 0.030, 0.012)))
    assert kernels.is_baseline(Config.from_dict(records["graph"].config))
    assert kernels.is_baseline(Config.from_dict(records["eager"].config))
    assert bench.contests[1:] == [[BASELINE]], "no Triton config may contend eager: cuBLAS against torch alone"
    assert records["eager"].time_ms == 0.0205, "a cuBLAS winner stores what kernels.matmul's cuBLAS path costs"


def test_eager_finalists_enter_the_contest_in_the_form_dispatch_holds() -> None:
    """Stored winners are portable (GROUP_SIZE_M 8 where one M block makes the group size moot): the
    eager contest pins them beside the graph winner in that form, so that where the two are one kernel,
    one plan serves both modes, as in dispatch."""
    canonical = MATMUL.default_config(THIN, H100).replace(GROUP_SIZE_M=1)
    portable = canonical.replace(GROUP_SIZE_M=8)
    assert search._portable_finalists(MATMUL, THIN, H100, [(canonical, 0.010), (portable, 0.011)]) == [(portable, 0.010)]
    bench = _GpuBench(config_ms=0.015)
    records = search.decide_modes(MATMUL, THIN, H100, bench, _trial_study((canonical, 0.015, 0.014)))
    assert Config.from_dict(records["graph"].config) == portable
    assert bench.contests[1] == [portable, BASELINE]
    assert Config.from_dict(records["eager"].config) == portable


class _QuickCublasBench(_GpuBench):
    """As _GpuBench, but our cuBLAS path costs less than torch.matmul eager (0.018 alone, 0.0175 ms in a
    contest, against 0.020 ms): the C++ path of a host-bound call (kernels/_native.py) on the GPU's timers,
    stood in for here."""

    contest_cublas_ms = 0.0175

    def time(self, config: Config, mode: str = "graph") -> float:
        return 0.018 if mode == "eager" else 0.020


def test_an_eager_cublas_winner_stores_what_our_cublas_path_costs_not_torch_matmuls() -> None:
    """A fresh process measures a cuBLAS eager pick at our path's time against torch.matmul's: the record
    must say that speed-up, not 1.00x (before: 129 host-bound picks stored 1.00x, measured 1.03x median)."""
    config = MATMUL.default_config(THIN, H100)
    records = search.decide_modes(MATMUL, THIN, H100, _QuickCublasBench(config_ms=0.019),
                                  _trial_study((config, 0.019, 0.019)))
    eager = records["eager"]
    assert kernels.is_baseline(Config.from_dict(eager.config))
    assert eager.time_ms == 0.0175 and eager.cublas_ms == 0.020, "the contest's time, beside torch.matmul"
    assert eager.speedup == pytest.approx(0.020 / 0.0175)


def test_a_triton_config_must_beat_our_cublas_path_where_it_was_timed() -> None:
    """0.0185 ms beats torch.matmul's 0.020 ms by the margin, but not our own cuBLAS path's 0.018 ms,
    which dispatch would run instead: cuBLAS wins."""
    config = MATMUL.default_config(THIN, H100)
    record = search._winner_record(MATMUL, THIN, H100, (config, 0.0185), 0.020, 5, "eager", cublas_ms=0.018)
    assert kernels.is_baseline(Config.from_dict(record.config)) and record.time_ms == 0.018
    # Without a timing of our path (graph mode), torch.matmul's time is the yardstick, as before.
    graph = search._winner_record(MATMUL, THIN, H100, (config, 0.0185), 0.020, 5, "graph")
    assert not kernels.is_baseline(Config.from_dict(graph.config)) and graph.time_ms == 0.0185


class _RankedContestBench(_QuickCublasBench):
    """As _QuickCublasBench, but each config has its own contest time in eager mode (``eager_ms``)."""

    def __init__(self, eager_ms: dict[Config, float]) -> None:
        super().__init__(config_ms=0.019)
        self.eager_ms = eager_ms

    def contest(self, configs: list[Config], rounds: int | None = None, mode: str = "graph",
                graph: Config | None = None) -> tuple[list[float], float]:
        times, baseline_ms = super().contest(configs, rounds, mode, graph)
        if mode == "eager":
            times = [self.eager_ms.get(c, t) for c, t in zip(configs, times)]
        return times, baseline_ms


def test_an_eager_cublas_winner_keeps_the_contests_fastest_triton_config_and_its_contest_time() -> None:
    """Our cuBLAS path wins the eager contest; the record's best Triton config and time are the contest's
    (as in every other outcome of a contest), not the search's first finalist at the search's own time."""
    first = MATMUL.default_config(THIN, H100)
    second = first.replace(num_stages=first.num_stages + 1)
    assert MATMUL.space.violation(second, THIN, H100) is None
    bench = _RankedContestBench({first: 0.0200, second: 0.0188})
    records = search.decide_modes(MATMUL, THIN, H100, bench,
                                  _trial_study((first, 0.0190, 0.0190), (second, 0.0191, 0.0192)))
    eager = records["eager"]
    assert kernels.is_baseline(Config.from_dict(eager.config)) and eager.time_ms == 0.0175
    assert bench.contests[1] == [first, second, BASELINE]
    assert Config.from_dict(eager.triton_config) == second and eager.triton_ms == 0.0188


def test_with_no_contest_a_cublas_eager_winner_still_stores_our_paths_time() -> None:
    """No Triton config ran near cuBLAS on the GPU: cuBLAS wins eager without a contest (_cublas_record),
    and stores our path's time, here under torch.matmul's."""
    slow = MATMUL.default_config(THIN, H100)
    bench = _QuickCublasBench(config_ms=0.030)
    records = search.decide_modes(MATMUL, THIN, H100, bench, _trial_study((slow, 0.030, 0.012)))
    assert kernels.is_baseline(Config.from_dict(records["eager"].config))
    assert records["eager"].time_ms == 0.0175 and records["eager"].speedup > 1.0
    assert bench.contests[-1] == [BASELINE], "our path timed side by side with torch.matmul, no Triton config"


def test_an_eager_winner_slower_back_to_back_on_the_gpu_gives_way_to_cublas() -> None:
    """The eager contest's winner (a cheaper launch on a host-bound tuning box) runs 5% behind cuBLAS back to
    back on the GPU: on a faster host it would lose, so cuBLAS wins eager. Within the margin (1%) it keeps
    its win."""
    config = MATMUL.default_config(THIN, H100)
    slower = _GpuBench(config_ms=0.015, stream_ms=0.01575)
    records = search.decide_modes(MATMUL, THIN, H100, slower, _trial_study((config, 0.015, 0.015)))
    assert slower.streamed, "the eager winner was timed back to back"
    assert kernels.is_baseline(Config.from_dict(records["eager"].config))
    assert records["eager"].time_ms == 0.0205, "cuBLAS as our path ran in the contest"
    assert records["eager"].triton_ms == 0.015, "the config's contest time is kept beside it"
    close = _GpuBench(config_ms=0.015, stream_ms=0.0151)
    records = search.decide_modes(MATMUL, THIN, H100, close, _trial_study((config, 0.015, 0.015)))
    assert not kernels.is_baseline(Config.from_dict(records["eager"].config))


class _TwoFinalistsBench(_GpuBench):
    """Two Triton finalists: ``fast`` wins the contest but runs 5% behind cuBLAS back to back; ``steady``
    is a little slower in the contest and holds back to back."""

    def __init__(self, fast: Config, steady: Config) -> None:
        super().__init__(config_ms=0.015)
        self.times = {fast: (0.015, 0.01575), steady: (0.016, 0.015)}

    def contest(self, configs: list[Config], rounds: int | None = None, mode: str = "graph",
                graph: Config | None = None) -> tuple[list[float], float]:
        self.contests.append(list(configs))
        return [self.contest_cublas_ms if kernels.is_baseline(c) else self.times[c][0] for c in configs], 0.020

    def back_to_back(self, config: Config) -> tuple[float, float]:
        self.streamed.append(config)
        return self.times[config][1], 0.015


def test_a_contest_winner_that_fails_back_to_back_gives_way_to_the_next_finalist_that_holds() -> None:
    from tuner.quick import redecide

    fast = MATMUL.default_config(THIN, H100)
    steady = fast.replace(num_warps=8)
    ranked = [(fast, 0.015), (steady, 0.016)]
    bench = _TwoFinalistsBench(fast, steady)
    assert search.eager_winner(MATMUL, bench, ranked, 0.0205) == (steady, 0.016)
    assert bench.streamed == [fast, steady]
    assert search.eager_winner(MATMUL, bench, ranked, 0.0162) is None, "steady does not beat cuBLAS by 2%"
    records = redecide(MATMUL, THIN, H100, [fast, steady], _TwoFinalistsBench(fast, steady))
    assert Config.from_dict(records["eager"].config) == MATMUL.space.portable(
        steady, THIN, H100, MATMUL.portable_values(H100))


def test_the_quick_redecision_applies_the_same_back_to_back_rule() -> None:
    from tuner.quick import redecide

    config = MATMUL.default_config(THIN, H100)
    slower = _GpuBench(config_ms=0.015, stream_ms=0.016)
    records = redecide(MATMUL, THIN, H100, [config], slower)
    assert slower.streamed == [config]
    assert kernels.is_baseline(Config.from_dict(records["eager"].config))
    assert not kernels.is_baseline(Config.from_dict(records["graph"].config)), "graph: no host, no such rule"


def test_recheck_replaces_a_stored_eager_winner_that_loses_back_to_back_and_keeps_one_that_holds() -> None:
    """scripts/redecide.py --fast-host-only: a table decided before the back-to-back rule is checked
    against it, with no contest of its Triton configs; cuBLAS replaces the winners that fail."""
    from tuner.quick import recheck_eager

    config = MATMUL.default_config(THIN, H100)
    stored = search._winner_record(MATMUL, THIN, H100, (config, 0.015), 0.020, 9, "eager")
    assert not kernels.is_baseline(Config.from_dict(stored.config))
    slower = _GpuBench(config_ms=0.015, stream_ms=0.017)
    replaced = recheck_eager(MATMUL, THIN, H100, stored, graph=config, bench=slower)
    assert kernels.is_baseline(Config.from_dict(replaced.config)) and replaced.mode == "eager"
    assert replaced.time_ms == 0.0205 and replaced.cublas_ms == 0.020 and replaced.trials == 9
    assert slower.contests == [[BASELINE]], "cuBLAS alone is timed, beside torch.matmul"
    assert recheck_eager(MATMUL, THIN, H100, stored, bench=_GpuBench(config_ms=0.015, stream_ms=0.015)) is None
    assert recheck_eager(MATMUL, THIN, H100, replaced, bench=slower) is None, "cuBLAS already"


def test_recheck_with_a_recontest_keeps_a_winner_only_where_it_still_beats_our_cublas_path_eager() -> None:
    """scripts/redecide.py --fast-host-only --recontest: a winner that holds back to back meets our cuBLAS
    path in an eager contest again; the record comes back with the times of now, whoever wins."""
    from tuner.quick import recheck_eager

    config = MATMUL.default_config(THIN, H100)
    stored = search._winner_record(MATMUL, THIN, H100, (config, 0.015), 0.020, 9, "eager")
    still_faster = _GpuBench(config_ms=0.016)  # holds back to back (0.015 against cuBLAS's 0.015)
    kept = recheck_eager(MATMUL, THIN, H100, stored, graph=config, bench=still_faster, recontest=True)
    assert Config.from_dict(kept.config) == Config.from_dict(stored.config)
    assert kept.time_ms == 0.016 and kept.cublas_ms == 0.020, "the winner's time now, not the stored 0.015"
    assert still_faster.contests == [[config, BASELINE]] and still_faster.streamed == [config]
    host_bound_win = _GpuBench(config_ms=0.0202)  # 0.0205 for our cuBLAS path: less than WIN_MARGIN
    replaced = recheck_eager(MATMUL, THIN, H100, stored, bench=host_bound_win, recontest=True)
    assert kernels.is_baseline(Config.from_dict(replaced.config)) and replaced.time_ms == 0.0205
    assert replaced.triton_ms == 0.0202, "the best Triton config is kept beside, with its time now"
    fails = _GpuBench(config_ms=0.010, stream_ms=0.017)  # fails back to back: no contest of the config
    assert kernels.is_baseline(Config.from_dict(
        recheck_eager(MATMUL, THIN, H100, stored, bench=fails, recontest=True).config))
    assert fails.contests == [[BASELINE]]
    # Beats our cuBLAS path (0.025 in this contest) by far, but not torch.matmul (0.020) by WIN_MARGIN: both
    # run at::mm, so the win is the two's spread, and cuBLAS keeps the place.
    spread_win = _GpuBench(config_ms=0.0198)
    spread_win.contest_cublas_ms = 0.025
    assert kernels.is_baseline(Config.from_dict(
        recheck_eager(MATMUL, THIN, H100, stored, bench=spread_win, recontest=True).config))


@pytest.fixture(autouse=True)
def _no_pause_between_eager_passes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The pause between eager recontests waits for another phase of a GPU box's host; the stand-in
    timers here have no host to wait for."""
    monkeypatch.setattr(search, "EAGER_PASS_PAUSE_S", 0.0)


class _PhasedBench(_GpuBench):
    """As _GpuBench, but each eager contest of one config against cuBLAS times the config at the next of
    ``phases`` (the host's phases, stood in for: no GPU here); torch.matmul at 0.020 ms, our cuBLAS path
    at 0.0205 ms."""

    def __init__(self, *phases: float) -> None:
        super().__init__(config_ms=phases[0])
        self.phases = list(phases)

    def contest(self, configs: list[Config], rounds: int | None = None, mode: str = "graph",
                graph: Config | None = None) -> tuple[list[float], float]:
        if mode == "eager" and len(configs) == 2 and kernels.is_baseline(configs[1]):
            self.config_ms = self.phases.pop(0)
        return super().contest(configs, rounds, mode, graph)


def test_an_eager_winner_must_win_every_pass_or_cublas_takes_its_place() -> None:
    """The deciding contest met a slow phase of the host (0.015 ms against torch.matmul's 0.020); the second
    pass met a fast one, where the config no longer beats torch.matmul by WIN_MARGIN: cuBLAS wins eager,
    and the third pass is not run."""
    config = MATMUL.default_config(THIN, H100)
    bench = _PhasedBench(0.015, 0.0198, 0.015)
    records = search.decide_modes(MATMUL, THIN, H100, bench, _trial_study((config, 0.015, 0.015)))
    eager = records["eager"]
    assert kernels.is_baseline(Config.from_dict(eager.config)) and eager.time_ms == 0.0205
    assert eager.triton_ms == 0.0198, "the config's time in the pass it lost is kept beside cuBLAS"
    eager_contests = [c for c in bench.contests[1:] if c[-1] == BASELINE and len(c) == 2]
    assert len(eager_contests) == 2, "the deciding contest and the pass that lost; no third"
    assert not kernels.is_baseline(Config.from_dict(records["graph"].config)), "graph winners are not recontested"


def test_an_eager_winner_that_wins_every_pass_stores_its_median_pass() -> None:
    config = MATMUL.default_config(THIN, H100)
    bench = _PhasedBench(0.015, 0.017, 0.016)
    records = search.decide_modes(MATMUL, THIN, H100, bench, _trial_study((config, 0.015, 0.015)))
    eager = records["eager"]
    assert Config.from_dict(eager.config) == MATMUL.space.portable(config, THIN, H100, MATMUL.portable_values(H100))
    assert eager.time_ms == 0.016 and eager.speedup == pytest.approx(0.020 / 0.016), "the median pass"
    assert not bench.phases, "three contests in all"
    once = _PhasedBench(0.015, 0.0198)
    records = search.decide_modes(MATMUL, THIN, H100, once, _trial_study((config, 0.015, 0.015)), eager_passes=1)
    assert records["eager"].time_ms == 0.015 and once.phases == [0.0198], "one pass: the deciding contest alone"


def test_the_quick_redecision_contests_an_eager_winner_again_too() -> None:
    from tuner.quick import redecide

    config = MATMUL.default_config(THIN, H100)
    records = redecide(MATMUL, THIN, H100, [config], _PhasedBench(0.015, 0.0198, 0.015))
    assert kernels.is_baseline(Config.from_dict(records["eager"].config)), "lost the second contest"
    kept = redecide(MATMUL, THIN, H100, [config], _PhasedBench(0.015, 0.016, 0.017))
    assert not kernels.is_baseline(Config.from_dict(kept["eager"].config)) and kept["eager"].time_ms == 0.016


def test_confirm_eager_leaves_cublas_winners_and_the_cpu_alone() -> None:
    config = MATMUL.default_config(THIN, H100)
    bench = _PhasedBench(0.030)
    cublas = search._winner_record(MATMUL, THIN, H100, (config, 0.030), 0.020, 9, "eager")
    assert kernels.is_baseline(Config.from_dict(cublas.config))
    assert search.confirm_eager(MATMUL, THIN, H100, bench, cublas, None, passes=2) is cublas
    triton = search._winner_record(MATMUL, THIN, CPU, (config, 0.015), 0.020, 9, "eager")
    assert search.confirm_eager(MATMUL, THIN, CPU, bench, triton, None, passes=2) is triton
    assert bench.contests == [], "nothing timed"


class _GpuBoundBench(_GpuBench):
    """As _GpuBench for a GPU-bound problem (no GPU here): torch.matmul at 0.110 ms a call eager and in
    graphs, our cuBLAS path at 0.105 ms in a contest (the two's spread), the config at ``config_ms`` in a
    contest and ``stream_ms`` back to back against cuBLAS's 0.110 ms."""

    contest_cublas_ms = 0.105

    def back_to_back(self, config: Config) -> tuple[float, float]:
        self.streamed.append(config)
        return self.stream_ms, 0.110

    def contest(self, configs: list[Config], rounds: int | None = None, mode: str = "graph",
                graph: Config | None = None) -> tuple[list[float], float]:
        times, _ = super().contest(configs, rounds, mode, graph)
        return times, 0.110

    def baseline_ms(self, mode: str = "graph") -> float:
        return 0.110

    def time(self, config: Config, mode: str = "graph") -> float:
        return 0.105 if mode == "eager" else 0.110


def test_a_gpu_bound_eager_win_must_show_back_to_back_on_the_gpu() -> None:
    """On a GPU-bound call an eager time is the GPU's: a config that won the eager contest (0.100 against
    0.110 ms) but only ties cuBLAS back to back (within FAST_HOST_MARGIN) won on the contest's spread, and
    cuBLAS takes eager; one that beats cuBLAS back to back by WIN_MARGIN keeps its place."""
    config = MATMUL.default_config(THIN, H100)
    ties = _GpuBoundBench(config_ms=0.100, stream_ms=0.1095)
    assert not search.holds_on_a_fast_host(MATMUL, ties, config)
    records = search.decide_modes(MATMUL, THIN, H100, ties, _trial_study((config, 0.100, 0.100)))
    assert kernels.is_baseline(Config.from_dict(records["eager"].config))
    wins = _GpuBoundBench(config_ms=0.100, stream_ms=0.104)
    assert search.holds_on_a_fast_host(MATMUL, wins, config)
    records = search.decide_modes(MATMUL, THIN, H100, wins, _trial_study((config, 0.100, 0.100)))
    assert not kernels.is_baseline(Config.from_dict(records["eager"].config))


def test_a_gpu_bound_cublas_eager_winner_stores_torch_matmuls_time() -> None:
    """Our cuBLAS path ran 0.105 ms against torch.matmul's 0.110 ms in the contest: on a GPU-bound call both
    run one kernel, so the record says 1.00x, not the spread. Host-bound, our path's time stands
    (test_an_eager_cublas_winner_stores_what_our_cublas_path_costs_not_torch_matmuls)."""
    config = MATMUL.default_config(THIN, H100)
    records = search.decide_modes(MATMUL, THIN, H100, _GpuBoundBench(config_ms=0.120),
                                  _trial_study((config, 0.120, 0.120)))
    eager = records["eager"]
    assert kernels.is_baseline(Config.from_dict(eager.config))
    assert eager.time_ms == eager.cublas_ms == 0.110 and eager.speedup == 1.0
    record = search._winner_record(MATMUL, THIN, H100, (config, 0.120), 0.110, 5, "eager", cublas_ms=0.112)
    assert record.time_ms == 0.112, "the contest's time, until judged GPU-bound by a GPU time"
    assert search.at_par_when_gpu_bound(record, 0.110).speedup == 1.0, "nor a loss of the spread's other sign"
    # Judged by the graph record's (GPU) time, not the eager one: a baseline slowed past 50 us by its host
    # (several launches on a slow host) keeps our path's time.
    assert search.at_par_when_gpu_bound(record, 0.030) is record
    assert search.at_par_when_gpu_bound(record, None) is record


def test_caches_keyed_by_address_hold_the_tuners_whole_input_rotation() -> None:
    """Eager timing rotates up to MAX_ROTATION input sets; a cache keyed by operand addresses smaller than
    that misses on every timed call, a cost the user's calls on recycled buffers do not pay."""
    from kernels import gemm, grouped
    from tuner import timing

    assert gemm._TENSORMAPS_PER_OPERAND >= timing.MAX_ROTATION
    assert grouped.TABLES._capacity >= timing.MAX_ROTATION * (search.FINALISTS + 1)


def test_a_baseline_dispatch_cannot_run_as_timed_never_wins() -> None:
    """moe_matmul in fp16: the timed baseline loops over the experts with host-side end rows; dispatch would
    have to sync to run it. It stays the yardstick (cublas_ms) while the fastest Triton config is stored."""
    from kernels.moe import MOE_MATMUL

    problem = Problem("moe_matmul", "fp16", "nt", ((40, 64, 64), (24, 64, 64)))
    assert not MOE_MATMUL.baseline_dispatchable(problem)
    config = MOE_MATMUL.default_config(problem, H100)
    slower = search._winner_record(MOE_MATMUL, problem, H100, (config, 0.030), 0.020, 5, "graph")
    assert Config.from_dict(slower.config) == MOE_MATMUL.space.portable(config, problem, H100,
                                                                        MOE_MATMUL.portable_values(H100))
    assert slower.cublas_ms == 0.020 and slower.time_ms == 0.030
    bf16 = Problem("moe_matmul", "bf16", "nt", problem.shapes)
    assert kernels.is_baseline(Config.from_dict(
        search._winner_record(MOE_MATMUL, bf16, H100, (config, 0.030), 0.020, 5, "graph").config))


def test_where_the_baseline_is_a_loop_of_launches_the_eager_contest_is_held_anyway(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """grouped_matmul's baseline loops over its GEMMs (KernelSpec.baseline_when_untuned is False): its eager
    time is mostly host time, which one launch of ours does not pay, so a GPU-slower config still contends."""
    monkeypatch.setattr(search, "CONTEST_PAUSE_S", 0.0)  # the stand-in's eager contest disagrees with the search
    loop_baseline = dataclasses.replace(MATMUL, baseline_when_untuned=False)
    bench = _GpuBench(config_ms=0.030)
    config = MATMUL.default_config(THIN, H100)
    search.decide_modes(loop_baseline, THIN, H100, bench, _trial_study((config, 0.030, 0.012)))
    assert len(bench.contests) > 1 and all(contest[0] == config for contest in bench.contests[1:]), \
        "after the graph contest, the eager one, with the GPU-slower config"


class _BackToBack:
    """The GPU timer's back-to-back answer (no GPU here): our config at ``ours`` ms a call, the baseline at
    ``theirs``."""

    problem = "a test problem"

    def __init__(self, ours: float, theirs: float) -> None:
        self.ours, self.theirs = ours, theirs

    def back_to_back(self, config: Config) -> tuple[float, float]:
        return self.ours, self.theirs


def test_a_baseline_of_several_launches_is_taken_at_its_fast_host_floor() -> None:
    """DeepSeek-V2-Lite's gated 2816x2048 MLP at 8 tokens (H100, 2026-11-26): the one-launch kernel 19.7 us on
    the GPU, cuBLAS and the gating pass 18.6 us, yet the baseline's two launches cost more host time than
    that on every host met. The gated kernel's eager winner holds there; the same GPU times for matmul's
    one-launch baseline do not."""
    gated, matmul = kernels.GATED_MATMUL, MATMUL
    assert gated.baseline_host_floor_ms > 0.0186 and matmul.baseline_host_floor_ms == 0
    config = gated.default_config(Problem("gated_matmul", "bf16", "nt", ((8, 2816, 2048),)), H100)
    assert search.holds_on_a_fast_host(gated, _BackToBack(0.0197, 0.0186), config)
    assert not search.holds_on_a_fast_host(matmul, _BackToBack(0.0197, 0.0186), config)
    assert not search.holds_on_a_fast_host(gated, _BackToBack(0.0240, 0.0186), config), "over the floor too"
    assert search.eager_gpu_limit_ms(gated, 0.0186) >= 0.0197 > search.eager_gpu_limit_ms(matmul, 0.0186)
    assert search.eager_gpu_limit_ms(gated, 0.100) == search.eager_gpu_limit_ms(matmul, 0.100), "GPU-bound alike"
