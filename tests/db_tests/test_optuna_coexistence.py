from __future__ import annotations

from pathlib import Path

import optuna
import sqlalchemy
import pytest

from db import Store

from .conftest import make_record


def run_study(url: str, name: str) -> optuna.Study:
    storage = optuna.storages.RDBStorage(url)
    study = optuna.create_study(storage=storage, study_name=name, load_if_exists=True,
                                sampler=optuna.samplers.RandomSampler(seed=0))
    study.optimize(lambda trial: (trial.suggest_int("BLOCK_M", 16, 256) - 64) ** 2, n_trials=3)
    return study


@pytest.mark.parametrize("store_first", [True, False], ids=["store_first", "optuna_first"])
def test_tables_coexist_with_optuna_storage(db_url: str, tmp_path: Path, store_first: bool) -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if store_first:
        Store(db_url).close()
    run_study(db_url, "matmul/fp16:nt:16x4096x4096")

    with Store(db_url) as store:
        store.put(make_record())
        assert store.records() == [make_record()]
    study = run_study(db_url, "matmul/fp16:nt:16x4096x4096")  # reopens and resumes the study

    assert len(study.trials) == 6
    with Store.open_readonly(db_url) as reader:
        assert reader.records() == [make_record()]
    engine = sqlalchemy.create_engine(db_url)
    tables = set(sqlalchemy.inspect(engine).get_table_names())
    engine.dispose()
    assert {"tuner_records", "studies", "trials", "version_info", "alembic_version"} <= tables
