"""CUDA-graph capture of every dense variant, and of the grouped and MoE kernels, through the public
calls: resolved before the capture, replayed on new data in the captured buffers, right every time.
"""

from __future__ import annotations

import pytest
import torch

import kernels
from db import Store
from kernels import BASELINE, Config, _plans

pytestmark = pytest.mark.gpu

_BASE = dict(GROUP_SIZE_M=8, SPLIT_K=1, NUM_SM=132, FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=3)
CASES = {
    "cublas": ((96, 128, 64), "nn", BASELINE),
    "tiled": ((96, 128, 64), "nt", Config.from_dict({**_BASE, "VARIANT": "tiled", "BLOCK_M": 64, "BLOCK_N": 64,
                                                     "BLOCK_K": 32})),
    "splitk": ((16, 256, 1024), "nn", Config.from_dict({**_BASE, "VARIANT": "splitk", "BLOCK_M": 16, "BLOCK_N": 64,
                                                        "BLOCK_K": 64, "SPLIT_K": 4})),
    "tma": ((256, 256, 128), "nt", Config.from_dict({**_BASE, "VARIANT": "tma", "BLOCK_M": 64, "BLOCK_N": 64,
                                                     "BLOCK_K": 64})),
    "repack": ((100, 90, 99), "nn", Config.from_dict({**_BASE, "VARIANT": "repack", "BLOCK_M": 64, "BLOCK_N": 64,
                                                       "BLOCK_K": 32})),
    "gemv": ((1, 1000, 4100), "nt", Config.from_dict({**_BASE, "VARIANT": "gemv", "BLOCK_M": 16, "BLOCK_N": 32,
                                                      "BLOCK_K": 32, "GROUP_SIZE_M": 1, "GEMV_BLOCK_N": 4,
                                                      "GEMV_BLOCK_K": 1024})),
}


def _operands(shape, layout, seed):
    m, n, k = shape
    gen = torch.Generator(device="cuda").manual_seed(seed)
    a = torch.randn(m, k, device="cuda", generator=gen).half()
    b = (torch.randn(n, k, device="cuda", generator=gen).half().t() if layout[1] == "t"
         else torch.randn(k, n, device="cuda", generator=gen).half())
    return a, b


def _capture(fn):
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for mode in kernels.MODES:  # resolve and compile both modes' plans before capturing
            with kernels.dispatch_mode(mode):
                fn()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    return graph, out


@pytest.mark.parametrize("name", list(CASES))
def test_every_variant_captures_and_replays_right(name: str) -> None:
    shape, layout, config = CASES[name]
    a, b = _operands(shape, layout, 0)
    with _plans.pinned(config, a, b):
        graph, out = _capture(lambda: kernels.matmul(a, b))
        for seed in (1, 2):
            fresh_a, fresh_b = _operands(shape, layout, seed)
            a.copy_(fresh_a)
            b.copy_(fresh_b)
            out.fill_(float("nan"))
            graph.replay()
            torch.cuda.synchronize()
            ref = fresh_a.float() @ fresh_b.float()
            assert (out.float() - ref).norm() <= 5e-3 * ref.norm(), f"{name} replay {seed}"


def test_capture_uses_the_graph_winner_and_eager_calls_the_eager_one(tmp_path) -> None:
    device = kernels.current_device()
    key = "fp16:nn:96x128x64"
    tiled = CASES["tiled"][2]
    from test_dispatch import make_record

    with Store(f"sqlite:///{tmp_path / 'modes.db'}") as store:
        store.put_many([make_record(device, key, BASELINE, mode="eager"), make_record(device, key, tiled, mode="graph")])
    kernels.use_database(f"sqlite:///{tmp_path / 'modes.db'}", use_shipped=False)
    try:
        a, b = _operands((96, 128, 64), "nn", 0)
        kernels.matmul(a, b)
        assert _plans.plan_of(a, b, "eager") is _plans._CUBLAS
        graph, out = _capture(lambda: kernels.matmul(a, b))
        assert getattr(_plans.plan_of(a, b, "graph"), "config", None) == tiled
        graph.replay()
        torch.cuda.synchronize()
        ref = a.float() @ b.float()
        assert (out.float() - ref).norm() <= 5e-3 * ref.norm()
    finally:
        kernels.use_database(None)


def test_grouped_and_moe_calls_capture_and_replay_right() -> None:
    gen = torch.Generator(device="cuda").manual_seed(0)
    As = [torch.randn(m, 64, device="cuda", generator=gen).half() for m in (32, 0, 80)]
    Bs = [torch.randn(64, 48, device="cuda", generator=gen).half() for _ in As]
    graph, outs = _capture(lambda: kernels.grouped_matmul(As, Bs))
    for a in As:
        a.mul_(2)
    graph.replay()
    torch.cuda.synchronize()
    for out, a, b in zip(outs, As, Bs):
        ref = a.float() @ b.float()
        assert (out.float() - ref).norm() <= 5e-3 * max(ref.norm(), 1e-6)
    x = torch.randn(96, 64, device="cuda", generator=gen).half()
    w = torch.randn(3, 64, 48, device="cuda", generator=gen).half()
    offsets = torch.tensor([32, 32, 96], device="cuda", dtype=torch.int32)
    graph, y = _capture(lambda: kernels.moe_matmul(x, w, offsets))
    x.mul_(-1)
    graph.replay()
    torch.cuda.synchronize()
    ref = torch.cat([x[:32].float() @ w[0].float(), x[32:96].float() @ w[2].float()])
    assert (y.float() - ref).norm() <= 5e-3 * ref.norm()


def test_the_capture_check_answers_on_the_default_stream_a_side_stream_and_inside_a_capture() -> None:
    """kernels._modes.capturing reads the current stream first (the default stream cannot be captured)
    and asks CUDA only on other streams."""
    from kernels import _modes

    seen = {}
    assert not _modes.capturing()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        assert not _modes.capturing()
    x = torch.ones(8, device="cuda")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        seen["inside"] = _modes.capturing()
        x.add_(1)
    assert seen["inside"] is True and not _modes.capturing()
