"""Fuzzing ``kernels.matmul`` on the CPU under Triton's interpreter: random shapes (zero sizes too),
strides, dtypes, devices and ranks. Each call gives the right product, or raises ValueError or
TypeError with a message; nothing else escapes and nothing hangs."""

from __future__ import annotations

import pytest
import torch
from hypothesis import event, given, settings
from hypothesis import strategies as st

import kernels

from .conftest import examples, time_limit

pytestmark = pytest.mark.fuzz

# float32 runs as TF32 on a GPU; the interpreter computes in float32. Tolerances per dtype.
# bf16 is accepted but not value-checked here: Triton 3.6's interpreter computes tl.dot on bf16 wrongly
# (a known interpreter trap; the GPU tests check bf16 values).
TOLERANCE = {torch.float16: 2e-2, torch.float32: 1e-3, torch.bfloat16: None}
DTYPES = [torch.float16, torch.float32, torch.float64, torch.int32, torch.bool, torch.bfloat16]
SIZES = st.integers(0, 9)


@pytest.fixture(autouse=True, scope="module")
def empty_database(tmp_path_factory):
    kernels.use_database(f"sqlite:///{tmp_path_factory.mktemp('dispatch') / 'none.db'}")
    yield
    kernels.use_database(None)


@st.composite
def operand(draw, rows: int, cols: int, dtype: torch.dtype, device: str) -> object:
    """A tensor of logical shape (rows, cols) in one of several memory layouts, or something else."""
    # Half the operands are 2-D layouts the kernel takes, so that many cases reach the kernel.
    form = draw(st.sampled_from(["row", "transposed", "strided", "expanded"]) | st.sampled_from(
        ["row", "transposed", "strided", "expanded", "rank1", "rank3", "rank0", "list"]))
    if form == "list":
        return [[1.0] * cols for _ in range(rows)]
    make = (lambda *shape: torch.randn(*shape).to(dtype)) if dtype.is_floating_point else \
        (lambda *shape: torch.randint(0, 2, shape).to(dtype))
    if form == "rank0":
        return make(1).reshape(()).to(device)
    if form == "rank1":
        return make(rows * cols).to(device)
    if form == "rank3":
        return make(1, rows, cols).to(device)
    if form == "transposed":
        return make(cols, rows).to(device).t()
    if form == "strided":
        return make(rows, cols * 2).to(device)[:, ::2]
    if form == "expanded" and cols > 0:
        return make(rows, 1).to(device).expand(rows, cols)
    return make(rows, cols).to(device)


@settings(max_examples=examples(60))
@given(data=st.data(), m=SIZES, n=SIZES, k=SIZES, k_b=st.none() | SIZES,
       dtype_a=st.sampled_from(DTYPES[:2]) | st.sampled_from(DTYPES), dtype_b=st.none() | st.sampled_from(DTYPES),
       device_b=st.none() | st.sampled_from(["cpu", "meta"]))
def test_matmul_is_right_or_raises_value_or_type_error(data, m, n, k, k_b, dtype_a, dtype_b, device_b) -> None:
    torch.manual_seed(15)
    a = data.draw(operand(m, k, dtype_a, "cpu"), label="a")
    b = data.draw(operand(k if k_b is None else k_b, n, dtype_b or dtype_a, device_b or "cpu"), label="b")
    with time_limit(120):
        try:
            c = kernels.matmul(a, b)
        except (ValueError, TypeError) as exc:
            assert str(exc), "the error must say what is wrong"
            event(f"refused: {type(exc).__name__}")
            return
    event(f"computed {a.dtype}")
    # Accepted: then the operands were valid and the product must be right.
    assert isinstance(a, torch.Tensor) and a.dim() == 2 and a.dtype in TOLERANCE and b.device == a.device
    expected = a.float() @ b.float()
    assert c.shape == expected.shape and c.dtype == a.dtype
    tolerance = TOLERANCE[a.dtype]
    if tolerance is not None:
        torch.testing.assert_close(c.float(), expected, atol=tolerance * max(k, 1), rtol=tolerance)


def test_a_cached_signature_with_b_on_another_device_still_raises_value_error() -> None:
    # Found by the fuzzer: the call-plan key left out b's device, so after a (cpu, cpu) call the same
    # shapes with b on another device skipped the checks and launched on b's foreign pointer.
    a, b = torch.randn(5, 5).half(), torch.randn(5, 7).half()
    kernels.matmul(a, b)
    with pytest.raises(ValueError, match="b is on meta"):
        kernels.matmul(a, b.to("meta"))
