"""The search's warm start with the cost model: its best-ranked config comes early when the database's
trials favour it, today's list when they are too few, and a broken observation never stops a search.

The databases are real SQLite files filled by tune_problem itself (the test kernel of test_search,
timed by a per-problem table), so the observations are the trials a search writes.
"""

from __future__ import annotations

import logging

import optuna
import pytest

from db import Store
from kernels import CPU, Config, Problem
from kernels.dispatch import Dispatcher
from tuner import search
from tuner.search import Budget, open_study, tune_problem, warm_start_configs

from test_search import PROBLEM, Kernel, _space, fake_ms

optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(autouse=True)
def fresh_model_data(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test reads its database afresh (a process keeps what it read for MODEL_DATA_TTL_S)."""
    monkeypatch.setattr(search, "_OBSERVATIONS", {})

# (BLOCK_M, GROUP_SIZE_M, num_stages) of the configs the tables below favour.
X = (16, 1, 2)  # second best by 1% on every problem near PROBLEM, best on one far problem
WINNERS = [(32, 4, 3), (32, 1, 3), (16, 4, 4), (32, 4, 4)]  # each best on one near problem only
NEAR = [(32, 32, 64), (32, 64, 32), (64, 32, 32), (32, 32, 16)]  # one factor of 2 from PROBLEM's 32^3
FAR = (256, 256, 256)


def _key(config: Config) -> tuple[int, int, int]:
    return config["BLOCK_M"], config["GROUP_SIZE_M"], config.num_stages


def _tune_with_table(db_url: str, shape: tuple[int, int, int], best: tuple[int, int, int], second=None) -> None:
    """Tune ``shape`` with ``best`` timing 1.0, ``second`` 1.01 and every other config 2.0."""
    def time_of(config: Config) -> float:
        return 1.0 if _key(config) == best else 1.01 if _key(config) == second else 2.0
    kernel = Kernel(_space(), slowdown=lambda c: time_of(c) / fake_ms(c))
    problem = Problem("matmul", "fp32", "nn", (shape,))
    with Store(db_url) as store:
        tune_problem(kernel.spec, problem, CPU, store, budget=Budget(12), timer=kernel.timer,
                     eager_timer=kernel.eager_timer, seed=0)


def _fill(db_url: str, near: int) -> None:
    _tune_with_table(db_url, FAR, X)
    for shape, winner in zip(NEAR[:near], WINNERS):
        _tune_with_table(db_url, shape, winner, second=X)


def _warm(db_url: str) -> list[tuple[int, int, int]]:
    spec = Kernel(_space()).spec
    with Store(db_url) as store:
        return [_key(c) for c in warm_start_configs(spec, PROBLEM, CPU, store)]


@pytest.fixture(scope="module")
def favouring_db(tmp_path_factory) -> str:
    url = f"sqlite:///{tmp_path_factory.mktemp('model') / 'tuner.db'}"
    _fill(url, near=4)
    return url


def test_warm_start_puts_the_models_best_config_right_after_the_dispatched_one(favouring_db) -> None:
    warm = _warm(favouring_db)
    assert warm[1] == X, f"the config second-best on every near problem follows dispatch's pick: {warm}"


def test_without_the_model_the_favoured_config_would_not_be_tried_early(favouring_db, monkeypatch) -> None:
    monkeypatch.setattr(search, "MODEL_MIN_OBSERVATIONS", 10**9)
    warm = _warm(favouring_db)
    assert X not in warm[:4], f"today's list takes the nearest winners, not X: {warm}"


def test_too_few_observations_give_todays_warm_start(db_url) -> None:
    _tune_with_table(db_url, NEAR[0], WINNERS[0], second=X)
    spec = Kernel(_space()).spec
    with Store(db_url) as store:
        warm = warm_start_configs(spec, PROBLEM, CPU, store)
        winner = Config.from_dict(store.records(device=CPU.name)[0].triton_config)
    dispatched = Dispatcher(db_url).choose(spec, PROBLEM, CPU).config
    assert warm == search._valid_unique(spec, PROBLEM, CPU, [dispatched, winner, spec.default_config(PROBLEM, CPU)])


def test_a_broken_observation_does_not_stop_the_search(favouring_db, tmp_path, caplog) -> None:
    url = f"sqlite:///{tmp_path / 'broken.db'}"
    with open(favouring_db.removeprefix("sqlite:///"), "rb") as src, open(url.removeprefix("sqlite:///"), "wb") as dst:
        dst.write(src.read())
    near = Problem("matmul", "fp32", "nn", (NEAR[0],))
    study = open_study(optuna.storages.RDBStorage(url), CPU, near)
    study.add_trial(optuna.trial.create_trial(  # a negative time: Observation refuses it
        params=study.trials[0].params, distributions=study.trials[0].distributions, value=1.0,
        user_attrs={"status": "ok", "config": study.trials[0].user_attrs["config"], "graph_ms": -1.0}))
    kernel = Kernel(_space())
    with caplog.at_level(logging.WARNING, logger="tuner.search"), Store(url) as store:
        record = tune_problem(kernel.spec, PROBLEM, CPU, store, budget=Budget(3), timer=kernel.timer,
                              eager_timer=kernel.eager_timer, seed=0)
    assert record.config
    assert any("cost-model warm start" in r.message for r in caplog.records), "the failure is logged"


def test_a_process_reads_the_model_data_once_per_ttl(monkeypatch) -> None:
    """A CLI run or a fleet worker tunes problem after problem: the trials are read once, not per problem."""
    reads = []
    reader = lambda url, device: reads.append((url, device)) or ["an observation"]  # noqa: E731
    assert search._observations("sqlite:///a.db", "gpu", reader) == ["an observation"]
    assert search._observations("sqlite:///a.db", "gpu", reader) == ["an observation"]
    assert reads == [("sqlite:///a.db", "gpu")]
    monkeypatch.setattr(search, "MODEL_DATA_TTL_S", 0.0)
    search._observations("sqlite:///a.db", "gpu", reader)
    assert len(reads) == 2, "past the TTL the database is read again"
