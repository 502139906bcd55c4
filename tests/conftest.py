"""Run every kernel under Triton's interpreter when there is no GPU, and skip GPU-only tests there.

TRITON_INTERPRET must be set before triton is first imported, so it is set here, at collection.
"""

from __future__ import annotations

import os

import pytest
import torch

HAS_GPU = torch.cuda.is_available()
if not HAS_GPU:
    os.environ["TRITON_INTERPRET"] = "1"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if HAS_GPU:
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (this machine has none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def torch_device() -> torch.device:
    """Where kernels run in tests: the GPU when there is one, else the CPU under the interpreter."""
    return torch.device("cuda") if HAS_GPU else torch.device("cpu")


@pytest.fixture
def db_url(tmp_path) -> str:
    """A real SQLite file per test."""
    return f"sqlite:///{tmp_path / 'tuner.db'}"
