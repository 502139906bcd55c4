"""The storage faults run on a real SQLite file and on a real PostgreSQL database (``db_url``); tests
marked ``sqlite_only`` (a full disk, file permissions, SQLite's write lock, corrupt files) on SQLite alone.
Tests that stop the server get one of their own (``restartable_pg``), so the session's server stays up."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.pg_server import PgServer, start_for_tests


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "db_url" in metafunc.fixturenames:
        sqlite_only = metafunc.definition.get_closest_marker("sqlite_only") is not None
        metafunc.parametrize("db_url", ["sqlite"] if sqlite_only else ["sqlite", "postgresql"], indirect=True)


@pytest.fixture
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "postgresql":
        return request.getfixturevalue("pg_url")
    return f"sqlite:///{tmp_path / 'tuner.db'}"


@pytest.fixture(scope="module")
def restartable_pg() -> Iterator[PgServer]:
    """A PostgreSQL server that the tests of one module may stop and start again."""
    server = start_for_tests()
    yield server
    server.stop()
