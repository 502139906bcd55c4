"""Runtime lookup from a shared PostgreSQL: read once per process, refreshed on a TTL, and a server that
cannot be reached falls back to the shipped tables with one warning, never an exception."""

from __future__ import annotations

import logging
import socket
import time
from collections.abc import Iterator

import pytest

import kernels
from db import Store
from kernels.dispatch import Dispatcher
from kernels.gemm import MATMUL

from test_dispatch import SPLITK, TILED, _problem, make_record


@pytest.fixture(autouse=True)
def restore_dispatcher() -> Iterator[None]:
    yield
    kernels.refresh_every(None)
    kernels.use_database(None)


@pytest.fixture
def device(torch_device):
    return kernels.current_device(torch_device)


def test_tables_come_from_postgres_and_load_once(pg_url: str, device) -> None:
    problem = _problem("fp16:nn:16x32x64")
    with Store(pg_url) as store:
        store.put(make_record(device, problem.key, SPLITK))
    dispatcher = Dispatcher(pg_url, use_shipped=False)
    assert dispatcher.choose(MATMUL, problem, device).config == SPLITK
    with Store(pg_url) as store:
        store.put(make_record(device, problem.key, TILED), on_conflict="replace")
    assert dispatcher.choose(MATMUL, problem, device).config == SPLITK, "read once, until a refresh"
    dispatcher.clear()
    assert dispatcher.choose(MATMUL, problem, device).config == TILED


def test_ttl_refresh_picks_up_new_winners(pg_url: str, device) -> None:
    problem = _problem("fp16:nn:16x32x64")
    with Store(pg_url) as store:
        store.put(make_record(device, problem.key, SPLITK))
    kernels.use_database(pg_url, use_shipped=False)
    assert kernels.explain("matmul", problem, device).config == SPLITK
    with Store(pg_url) as store:
        store.put(make_record(device, problem.key, TILED), on_conflict="replace")
    kernels.refresh_every(0.2)
    deadline = time.monotonic() + 30
    while kernels.explain("matmul", problem, device).config != TILED:
        assert time.monotonic() < deadline, "the TTL never reloaded the table"
        time.sleep(0.1)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again when the block ends: nothing listens there


def test_unreachable_postgres_falls_back_with_one_warning(device, caplog, torch_device) -> None:
    pytest.importorskip("psycopg")
    url = f"postgresql+psycopg://nobody@127.0.0.1:{_closed_port()}/tuner?connect_timeout=2"
    kernels.use_database(url)
    with caplog.at_level(logging.WARNING, logger="kernels.dispatch"):
        for key in ("fp16:nn:16x32x64", "fp16:nn:32x32x64"):
            for kernel in ("matmul", "grouped_matmul"):
                choice = kernels.explain(kernel, kernels.Problem.from_key(kernel, key), device)
                assert choice.source != "database"
    warnings = [r for r in caplog.records if "tuned configs unavailable" in r.getMessage()]
    assert len(warnings) == 1 and "shipped tables" in warnings[0].getMessage()
