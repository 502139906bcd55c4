"""Device naming and --device matching: canonical names to aliases, and refusing a mismatch."""

from __future__ import annotations

import pytest
import torch

import kernels._device as device_module
from kernels._device import CPU, alias_of, current_device, interpreter_enabled, resolve_device
from kernels._spec import DeviceInfo

HAS_GPU = torch.cuda.is_available()
H100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", alias="h100", compute_capability="9.0", sm_count=132,
                  shared_memory_bytes=232_448)


@pytest.mark.parametrize("name, alias", [
    ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA H100 PCIe", "h100"),
    ("NVIDIA H200", "h200"),
    ("NVIDIA A100-SXM4-80GB", "a100"),
    ("NVIDIA A100-PCIE-40GB", "a100"),
    ("NVIDIA A10G", "a10g"),
    ("NVIDIA A10", "a10"),
    ("NVIDIA GH200 480GB", "gh200"),
    ("NVIDIA L40S", "l40s"),
    ("NVIDIA L4", "l4"),
    ("Tesla T4", "t4"),
    ("NVIDIA GeForce RTX 4090", "rtx4090"),
    ("AMD Instinct MI300X", "mi300x"),
    ("cpu", "cpu"),
])
def test_alias_of_known_cards(name: str, alias: str) -> None:
    assert alias_of(name) == alias


def test_alias_of_unknown_card_is_a_stable_slug() -> None:
    assert alias_of("Some Vendor X9000 (rev 2)") == "some-vendor-x9000-rev-2"
    assert alias_of("Some Vendor X9000 (rev 2)") == alias_of("Some Vendor X9000 (rev 2)")


def test_current_device_of_a_cpu_tensor_device_is_cpu() -> None:
    assert current_device("cpu") is CPU
    assert current_device(torch.device("cpu")).is_cpu


@pytest.mark.skipif(HAS_GPU, reason="without a GPU the tests run under the interpreter")
def test_resolve_cpu_under_the_interpreter() -> None:
    assert interpreter_enabled()
    assert resolve_device("cpu") is CPU
    assert resolve_device(" CPU ") is CPU
    assert current_device() is CPU


@pytest.mark.skipif(HAS_GPU, reason="without a GPU the tests run under the interpreter")
def test_resolve_gpu_alias_without_gpu_points_to_device_cpu() -> None:
    with pytest.raises(ValueError, match="--device h100") as info:
        resolve_device("h100")
    assert "--device cpu" in str(info.value)


def test_resolve_cpu_without_the_interpreter_says_how_to_enable_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    with pytest.raises(ValueError, match="TRITON_INTERPRET=1"):
        resolve_device("cpu")


@pytest.fixture
def pretend_h100(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make resolve_device see an H100 and no interpreter, whatever this machine has."""
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(device_module, "_gpu_info", lambda index: H100)


def test_resolve_matching_alias_name_or_auto_returns_the_gpu(pretend_h100: None) -> None:
    assert resolve_device("h100") is H100
    assert resolve_device("H100") is H100
    assert resolve_device("NVIDIA H100 80GB HBM3") is H100
    assert resolve_device("auto") is H100


def test_resolve_mismatch_names_both_devices_and_the_fix(pretend_h100: None) -> None:
    with pytest.raises(ValueError) as info:
        resolve_device("a100")
    message = str(info.value)
    assert "--device a100" in message
    assert "NVIDIA H100 80GB HBM3" in message and "(h100)" in message
    assert "pass --device h100" in message


@pytest.mark.gpu
def test_resolve_auto_on_a_real_gpu_matches_current_device() -> None:
    if interpreter_enabled():
        pytest.skip("TRITON_INTERPRET is set")
    here = resolve_device("auto")
    assert here == current_device()
    assert resolve_device(here.alias) == here
    assert here.alias == alias_of(here.name)
    other = "a100" if here.alias != "a100" else "h100"
    with pytest.raises(ValueError, match=here.alias):
        resolve_device(other)
