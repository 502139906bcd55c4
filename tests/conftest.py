"""Run every kernel under Triton's interpreter when there is no GPU, and skip GPU-only tests there.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at collection.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
import torch

from tests.gpu_turn import gpu_turn

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Where a GPU is present triton compiles for it, so a test of CPU tensors under the interpreter cannot run;
    # nor can one that faults a kernel on purpose in the test process: after an illegal address the process's
    # CUDA context is gone, and every later GPU test of the same pytest worker fails (a GPU run of 2026-11-28:
    # 105 failures, most of them that one cascade).
    if HAS_GPU:
        skip = pytest.mark.skip(reason="runs under Triton's interpreter; CI and GPU-less machines run it")
        marker = "interpreter"
    else:
        skip = pytest.mark.skip(reason="needs a CUDA GPU (this machine has none)")
        marker = "gpu"
    for item in items:
        if marker in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=HAS_GPU)
def _gpu_turn(request: pytest.FixtureRequest) -> Iterator[None]:
    """On a GPU machine, a ``timing`` test has the GPU to itself; the others share it (tests/gpu_turn.py)."""
    with gpu_turn(alone=request.node.get_closest_marker("timing") is not None):
        yield


@pytest.fixture
def torch_device() -> torch.device:
    """Where kernels run in tests: the GPU when there is one, else the CPU under the interpreter."""
    return torch.device("cuda") if HAS_GPU else torch.device("cpu")


@pytest.fixture
def db_url(tmp_path) -> str:
    """A real SQLite file per test."""
    return f"sqlite:///{tmp_path / 'tuner.db'}"


@pytest.fixture(scope="session")
def pg_server():
    """One real PostgreSQL server on loopback for the session; skipped without a server binary,
    except in CI (env CI set), where the PostgreSQL tests must run."""
    from tests.pg_server import start_for_tests

    server = start_for_tests()
    yield server
    server.stop()


@pytest.fixture
def pg_url(pg_server) -> str:
    """A fresh, empty PostgreSQL database for one test."""
    return pg_server.fresh_url()


BACKENDS = ["sqlite", "postgresql"]


@pytest.fixture
def backend_url(request: pytest.FixtureRequest, tmp_path) -> str:
    """A fresh database of the backend named by the test's ``backend`` parameter."""
    if request.param == "postgresql":
        return request.getfixturevalue("pg_url")
    return f"sqlite:///{tmp_path / 'tuner.db'}"
