"""Fixtures the kernel tests share."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import kernels


@pytest.fixture
def own_database(db_url: str) -> Iterator[None]:
    """Dispatch reads this test's own SQLite file and no shipped table, then the default again."""
    kernels.use_database(db_url, use_shipped=False)
    yield
    kernels.use_database(None)
