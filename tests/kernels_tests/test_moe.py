"""The MoE GEMM (one token buffer, one weight tensor, device offsets): correctness, safety, errors, dispatch.

Runs under Triton's interpreter on a CPU (fp16: the interpreter's bf16 dot is wrong, GPU.md) or compiled
on a GPU. Dispatch tests read a real SQLite file.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch

import kernels
from db import Store
from kernels import moe
from kernels._device import interpreter_enabled
from kernels._spec import BASELINE, Config, Problem
from kernels.moe import MOE_MATMUL, balanced_problem, moe_matmul_with, problem_of

from test_dispatch import make_record  # tests/kernels_tests is on sys.path (rootdir-relative imports)

DEVICE = "cuda" if torch.cuda.is_available() and not interpreter_enabled() else "cpu"
TOLERANCE = 1e-2  # relative L2 error of an fp16 output; the interpreter measures ~3e-4

# Skewed, with empty experts first, in the middle and last; 40 tokens, N=48 and K=40 not tile multiples.
SKEWED = (0, 17, 1, 0, 22, 0)

SMALL_CONFIGS = (
    Config.make(BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, NUM_SM=4, num_warps=2, num_stages=2),  # programs loop
    Config.make(BLOCK_M=32, BLOCK_N=64, BLOCK_K=32, NUM_SM=16, num_warps=4, num_stages=3),  # programs idle
)


def _problem(rows=SKEWED, n: int = 48, k: int = 40, layout: str = "nn", dtype: str = "fp16") -> Problem:
    return Problem("moe_matmul", dtype, layout, tuple((m, n, k) for m in rows))


def _error(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.float().cpu() - ref.cpu()).norm() / ref.cpu().norm().clamp_min(1e-6))


@pytest.mark.parametrize("layout", ["nn", "nt"])
@pytest.mark.parametrize("config", SMALL_CONFIGS, ids=str)
def test_skewed_experts_with_empty_ones_match_torch(layout: str, config: Config) -> None:
    inputs = MOE_MATMUL.make_inputs(_problem(layout=layout), DEVICE, 0)
    out = MOE_MATMUL.run(config, inputs)
    assert out.shape == (40, 48) and out.dtype == torch.float16
    assert _error(out, MOE_MATMUL.reference(inputs)) <= TOLERANCE


@pytest.mark.gpu
@pytest.mark.skipif(DEVICE != "cuda", reason="needs a GPU: the interpreter's bf16 tl.dot is wrong (GPU.md)")
@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
@pytest.mark.parametrize("layout", ["nn", "nt"])
def test_moe_group_matches_torch_and_grouped_mm_on_the_gpu(dtype: str, layout: str) -> None:
    from tuner.suites import MOE_GPU

    problem = Problem.from_key("moe_matmul", f"{dtype}:{layout}:{MOE_GPU['16 experts skewed']}")
    inputs = MOE_MATMUL.make_inputs(problem, DEVICE, 5)
    ref = MOE_MATMUL.reference(inputs)
    tolerance = 3e-2 if dtype == "bf16" else TOLERANCE
    configs = SMALL_CONFIGS + (moe.default_config(problem, kernels.current_device(torch.device(DEVICE))),
                               Config.make(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, NUM_SM=132, num_warps=8, num_stages=3))
    for config in configs:
        assert _error(MOE_MATMUL.run(config, inputs), ref) <= tolerance, str(config)
    assert _error(MOE_MATMUL.baseline(inputs), ref) <= tolerance, "torch._grouped_mm or the loop"


def test_nt_layout_is_the_transposed_weight_view() -> None:
    x, w, offsets, _ = MOE_MATMUL.make_inputs(_problem(layout="nt"), DEVICE, 0)
    assert w.stride(1) == 1 and moe.weight_layout(w) == "t"
    assert problem_of(x, w, offsets) == _problem(layout="nt")


def test_offsets_past_the_buffer_or_backwards_are_clamped_not_read_out_of_bounds() -> None:
    x, w, _, _ = MOE_MATMUL.make_inputs(_problem(rows=(8, 8, 8)), DEVICE, 0)
    # Expert 1 ends before expert 0 (gets no rows); expert 2 claims rows past the 24 there are.
    offsets = torch.tensor([10, 4, 1000], dtype=torch.int32, device=DEVICE)
    out = moe_matmul_with(SMALL_CONFIGS[0], x, w, offsets)
    expect = torch.cat([x[:10].float() @ w[0].float(), x[10:].float() @ w[2].float()])
    assert _error(out, expect) <= TOLERANCE
    assert problem_of(x, w, offsets).shapes == ((10, 48, 40), (0, 48, 40), (14, 48, 40))


def test_int64_offsets_and_out_are_accepted() -> None:
    x, w, offsets, _ = MOE_MATMUL.make_inputs(_problem(), DEVICE, 1)
    out = torch.full((40, 48), float("nan"), dtype=torch.float16, device=DEVICE)
    result = moe_matmul_with(SMALL_CONFIGS[1], x, w, offsets.long(), out=out)
    assert result is out
    assert _error(out, MOE_MATMUL.reference((x, w, offsets))) <= TOLERANCE


def test_baseline_config_and_the_loop_baseline_agree_with_the_reference() -> None:
    inputs = MOE_MATMUL.make_inputs(_problem(), DEVICE, 2)
    ref = MOE_MATMUL.reference(inputs)
    assert _error(MOE_MATMUL.baseline(inputs), ref) <= TOLERANCE
    assert _error(moe_matmul_with(BASELINE, *inputs[:3]), ref) <= TOLERANCE
    out = torch.full_like(ref, float("nan"), dtype=torch.float16)
    assert moe_matmul_with(BASELINE, *inputs[:3], out=out) is out and _error(out, ref) <= TOLERANCE


def test_problem_of_reads_the_exact_split_and_balanced_problem_shares_its_distance_features() -> None:
    x, w, offsets, _ = MOE_MATMUL.make_inputs(_problem(), DEVICE, 0)
    exact = problem_of(x, w, offsets)
    assert exact == _problem()
    balanced = balanced_problem("fp16", "nn", 40, 6, 48, 40)
    assert [m for m, _, _ in balanced.shapes] == [7, 7, 7, 7, 6, 6]
    assert MOE_MATMUL.distance(exact, balanced) == 0.0, "dispatch finds the skewed record at distance 0"


@pytest.mark.parametrize("args, error, words", [
    (lambda x, w, o: (x.unsqueeze(0), w, o), ValueError, ["x as [tokens, K]"]),
    (lambda x, w, o: (x, w.float(), o), TypeError, ["one dtype", ".half()"]),
    (lambda x, w, o: (x, w, o.float()), ValueError, ["int32", "one end row per expert"]),
    (lambda x, w, o: (x, w, o[:-1]), ValueError, ["one end row per expert (6)"]),
    (lambda x, w, o: (x[:, :8], w, o), ValueError, ["K=8", "transpose(1, 2)"]),
    (lambda x, w, o: (x, [w], o), TypeError, ["w is a list"]),
])
def test_bad_operands_raise_errors_that_name_them(args, error, words) -> None:
    x, w, offsets, _ = MOE_MATMUL.make_inputs(_problem(), DEVICE, 0)
    with pytest.raises(error) as info:
        kernels.moe_matmul(*args(x, w, offsets))
    assert all(word in str(info.value) for word in words), str(info.value)


def test_group_of_unlike_experts_is_not_a_moe_problem() -> None:
    with pytest.raises(ValueError, match="shares one N and one K"):
        MOE_MATMUL.check_problem(Problem.from_key("moe_matmul", "fp16:nn:16x32x32+8x64x32"))
    with pytest.raises(ValueError, match="shares one N and one K"):
        MOE_MATMUL.make_inputs(Problem.from_key("moe_matmul", "fp16:nn:16x32x32+8x32x64"), DEVICE, 0)


# ---------------------------------------------------------------------------------------------- dispatch

@pytest.fixture
def db_dispatch(db_url: str) -> Iterator[str]:
    kernels.use_database(db_url, use_shipped=False)
    yield db_url
    kernels.use_database(None)


def test_moe_matmul_runs_the_config_tuned_for_its_tokens_experts_n_and_k(db_dispatch, monkeypatch) -> None:
    tuned = SMALL_CONFIGS[1]
    device = kernels.current_device(torch.device(DEVICE))
    with Store(db_dispatch) as store:  # tuned on the skewed split; the call below has another split
        store.put(make_record(device, _problem().key, tuned, kernel="moe_matmul"))
    launched: list[Config] = []
    real = moe.run_checked
    monkeypatch.setattr(moe, "run_checked", lambda config, *args: launched.append(config) or real(config, *args))
    x, w, _, _ = MOE_MATMUL.make_inputs(_problem(), DEVICE, 3)
    offsets = torch.tensor([5, 5, 20, 30, 30, 40], dtype=torch.int32, device=DEVICE)
    out = kernels.moe_matmul(x, w, offsets)
    assert launched == [tuned]
    assert _error(out, MOE_MATMUL.reference((x, w, offsets))) <= TOLERANCE
    assert kernels.explain("moe_matmul", balanced_problem("fp16", "nn", 40, 6, 48, 40), device).source \
        == f"nearest:{_problem().key}"


def test_moe_matmul_with_a_cublas_record_runs_the_baseline_where_it_needs_no_sync(db_dispatch, monkeypatch) -> None:
    """bf16 with K-major weights: the baseline is torch._grouped_mm on a GPU, which reads the offsets on the
    device (here, on the CPU, its loop stands in: a sync costs nothing there)."""
    device = kernels.current_device(torch.device(DEVICE))
    problem = _problem(layout="nt", dtype="bf16")
    with Store(db_dispatch) as store:
        store.put(make_record(device, problem.key, BASELINE, kernel="moe_matmul", triton_config=None))
    monkeypatch.setattr(moe, "run_checked", lambda *args: pytest.fail("the Triton kernel ran"))
    x, w, offsets, _ = MOE_MATMUL.make_inputs(problem, DEVICE, 4)
    out = torch.empty((40, 48), dtype=torch.bfloat16, device=DEVICE)
    assert kernels.moe_matmul(x, w, offsets, out=out) is out
    assert _error(out, MOE_MATMUL.reference((x, w, offsets))) <= 2e-2  # bf16 rounding of the output


def test_a_cublas_record_whose_baseline_would_sync_runs_the_triton_default(db_dispatch) -> None:
    """fp16 (or weights not K-major): the baseline is a loop over the experts that reads the end rows on the
    host, a sync per call that no CUDA graph can capture. Dispatch runs a Triton config there instead."""
    device = kernels.current_device(torch.device(DEVICE))
    problem = _problem()
    with Store(db_dispatch) as store:
        store.put(make_record(device, problem.key, BASELINE, kernel="moe_matmul", triton_config=None))
    choice = kernels.explain("moe_matmul", problem, device, "graph")
    assert choice.config == MOE_MATMUL.default_config(problem, device)
    assert choice.source.startswith("default:") and "syncs with the host" in choice.source
    assert not MOE_MATMUL.baseline_dispatchable(problem)
    assert MOE_MATMUL.baseline_dispatchable(_problem(layout="nt", dtype="bf16"))
    x, w, offsets, _ = MOE_MATMUL.make_inputs(problem, DEVICE, 4)
    assert _error(kernels.moe_matmul(x, w, offsets), MOE_MATMUL.reference((x, w, offsets))) <= TOLERANCE


def test_the_idle_sm_rule_counts_the_fewest_tiles_of_any_split_of_the_tokens() -> None:
    from kernels._spec import DeviceInfo

    h100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", alias="h100", compute_capability="9.0", sm_count=132,
                      shared_memory_bytes=232_448)
    # 4,208 tokens over 16 experts, N = 768. All tokens in one expert is the split with the fewest tiles.
    group = Problem("moe_matmul", "bf16", "nt", tuple((m, 768, 2048) for m in [4208] + [0] * 15))
    small_tiles = Config.make(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, NUM_SM=64, num_warps=4, num_stages=3)
    assert "leaves SMs idle" in moe.SPACE.violation(small_tiles, group, h100)  # 66 x 12 tiles at the least
    assert moe.SPACE.violation(small_tiles.replace(NUM_SM=128), group, h100) is None
    big_tiles = Config.make(BLOCK_M=128, BLOCK_N=256, BLOCK_K=64, NUM_SM=64, num_warps=8, num_stages=3)
    assert moe.SPACE.violation(big_tiles, group, h100) is None, "33 x 3 = 99 tiles cannot fill 132 SMs"


def test_timed_inputs_of_a_balanced_key_are_routed_at_random_and_an_explicit_split_is_kept() -> None:
    """Dispatch keys every call by the even split; a router never splits evenly, so the tuner times a
    random routing of the same tokens (seeded: the same seed gives the same split)."""
    from kernels.moe import balanced_problem, make_inputs

    problem = balanced_problem("fp16", "nt", 128, 8, 32, 16)
    ends = make_inputs(problem, "cpu", 3)[3]
    rows = [b - a for a, b in zip((0,) + ends[:-1], ends)]
    assert ends[-1] == 128 and len(rows) == 8 and max(rows) > 16, rows
    assert make_inputs(problem, "cpu", 3)[3] == ends and make_inputs(problem, "cpu", 4)[3] != ends
    skewed = Problem("moe_matmul", "fp16", "nt", ((100, 32, 16), (20, 32, 16), (8, 32, 16)))
    assert make_inputs(skewed, "cpu", 3)[3] == (100, 120, 128)


def test_an_untuned_bf16_moe_problem_far_from_every_record_runs_torch_grouped_mm_on_a_gpu(db_url) -> None:
    """Decode-sized experts (8 tokens each, N = 14336) must not take a prefill record's tiles (16 experts,
    N = 768): dispatch runs torch._grouped_mm there, the user's own call. A near record still serves, and
    fp16 (whose baseline is a loop that syncs) keeps the nearest config. The device is a GPU's DeviceInfo:
    dispatch decides from records alone, and nothing is launched."""
    from kernels._spec import DeviceInfo
    from kernels.dispatch import FAR_NEIGHBOUR, Dispatcher

    h100 = DeviceInfo(name="NVIDIA H100 80GB HBM3", alias="h100", compute_capability="9.0", sm_count=132,
                      shared_memory_bytes=232_448)
    tiles = Config.make(BLOCK_M=64, BLOCK_N=64, BLOCK_K=64, NUM_SM=132, num_warps=4, num_stages=3)
    prefill = balanced_problem("bf16", "nt", 4096, 16, 768, 2048)
    decode = balanced_problem("bf16", "nt", 64, 8, 14336, 4096)
    with Store(db_url) as store:
        store.put(make_record(h100, prefill.key, tiles, kernel="moe_matmul"))
        store.put(make_record(h100, prefill.key.replace("bf16", "fp16"), tiles, kernel="moe_matmul"))
    dispatcher = Dispatcher(db_url, use_shipped=False)
    assert MOE_MATMUL.transfer_distance(decode, prefill) > FAR_NEIGHBOUR
    far = dispatcher.choose(MOE_MATMUL, decode, h100, "graph")
    assert far.config == BASELINE and far.source.startswith("baseline: the nearest record")
    near = balanced_problem("bf16", "nt", 4000, 16, 768, 2048)
    assert dispatcher.choose(MOE_MATMUL, near, h100, "graph").config == tiles, "a near record still serves"
    fp16 = balanced_problem("fp16", "nt", 64, 8, 14336, 4096)
    assert not MOE_MATMUL.baseline_dispatchable(fp16)
    assert dispatcher.choose(MOE_MATMUL, fp16, h100, "graph").config == tiles, "no sync-free baseline: nearest"
    empty = Dispatcher(f"sqlite:///{db_url.split(':///')[1]}.empty.db", use_shipped=False)
    assert empty.choose(MOE_MATMUL, decode, h100, "eager").config == BASELINE, "no record at all: the baseline"
    # Where torch._grouped_mm is not one launch (an A100: torch copies the offsets to the host and loops),
    # or cannot take the rows (N not a multiple of 8), the nearest config or the default runs.
    a100 = DeviceInfo(name="NVIDIA A100-SXM4-80GB", alias="a100", compute_capability="8.0", sm_count=108,
                      shared_memory_bytes=167_936)
    assert not empty.choose(MOE_MATMUL, decode, a100, "graph").source.startswith("baseline")
    odd = balanced_problem("bf16", "nt", 64, 8, 14330, 4096)
    assert dispatcher.choose(MOE_MATMUL, odd, h100, "graph").config == tiles


# ------------------------------------------------------------------------------------ a repeated call's plan

def _count_whole_path(monkeypatch) -> list[Config]:
    """The configs the whole (first-call) path launched: ``moe.launch``, which a kept plan does not call."""
    whole: list[Config] = []
    real = moe.launch
    monkeypatch.setattr(moe, "launch", lambda config, *args: whole.append(config) or real(config, *args))
    return whole


def test_a_repeated_call_runs_its_kept_plan_until_dispatch_s_answers_change(db_dispatch, monkeypatch) -> None:
    """The first call of a signature checks, resolves and keeps a plan; the next ones launch it, with the same
    result. A clear, another record, or a pin makes it stale: the next call takes the whole path again and
    runs the new answer."""
    device = kernels.current_device(torch.device(DEVICE))
    first, second = SMALL_CONFIGS[0], SMALL_CONFIGS[1]
    with Store(db_dispatch) as store:
        store.put(make_record(device, _problem().key, first, kernel="moe_matmul"))
    kernels.clear_cache()
    whole = _count_whole_path(monkeypatch)
    x, w, offsets, _ = MOE_MATMUL.make_inputs(_problem(), DEVICE, 5)
    want = MOE_MATMUL.reference((x, w, offsets))
    outs = [kernels.moe_matmul(x, w, offsets) for _ in range(3)]
    assert whole == [first]
    assert all(_error(out, want) <= TOLERANCE for out in outs)
    assert len({out.data_ptr() for out in outs}) == 3  # a fresh output per call, as the whole path gives

    with Store(db_dispatch) as store:
        store.put(make_record(device, _problem().key, second, kernel="moe_matmul", time_ms=0.001))
    kernels.clear_cache()
    kernels.moe_matmul(x, w, offsets)
    kernels.moe_matmul(x, w, offsets)
    assert whole == [first, second]

    with moe.pinning([first], x, w) as (pin_first,):
        pin_first()
        assert _error(kernels.moe_matmul(x, w, offsets), want) <= TOLERANCE
        kernels.moe_matmul(x, w, offsets)
    assert whole == [first, second, first]
    kernels.moe_matmul(x, w, offsets)  # the pin's end is a change too: the stored record again
    assert whole == [first, second, first, second]


def test_a_kept_plan_serves_only_its_signature_and_aligned_operands(db_dispatch, monkeypatch) -> None:
    """Another shape, dtype or stride is another signature (its own first call); an operand off the 16-byte
    alignment the plan's kernel was specialized for runs the checked launch; both give the right result."""
    whole = _count_whole_path(monkeypatch)
    x, w, offsets, _ = MOE_MATMUL.make_inputs(_problem(), DEVICE, 6)
    kernels.moe_matmul(x, w, offsets)
    kernels.moe_matmul(x, w, offsets)
    assert len(whole) == 1
    shifted = torch.empty(x.numel() + 1, dtype=x.dtype, device=DEVICE)[1:].view_as(x).copy_(x)  # 2 bytes off
    assert shifted.data_ptr() % 16 and shifted.stride() == x.stride()
    assert _error(kernels.moe_matmul(shifted, w, offsets), MOE_MATMUL.reference((x, w, offsets))) <= TOLERANCE
    assert len(whole) == 2
    w_t = w.transpose(1, 2).contiguous().transpose(1, 2)  # the same values, K-major: another signature
    assert _error(kernels.moe_matmul(x, w_t, offsets), MOE_MATMUL.reference((x, w, offsets))) <= TOLERANCE
    assert len(whole) == 3
    with pytest.raises(ValueError, match="one end row per expert"):  # a hit needs offsets' shape too
        kernels.moe_matmul(x, w, offsets[:-1])


def test_record_mode_counts_every_call_a_kept_plan_serves(db_dispatch, tmp_path) -> None:
    x, w, offsets, _ = MOE_MATMUL.make_inputs(_problem(), DEVICE, 7)
    kernels.moe_matmul(x, w, offsets)  # the plan is kept before recording starts
    with kernels.recording(f"sqlite:///{tmp_path / 'rec.db'}"):
        for _ in range(4):
            kernels.moe_matmul(x, w, offsets)
        from kernels._record_mode import RECORDER
        counts = {key: n for key, n in RECORDER.counts.items() if key[0] != "moe_gated_matmul" and len(key) == 8}
    assert sorted(counts.values()) == [4]


@pytest.mark.gpu
def test_a_kept_plan_whose_baseline_is_torch_grouped_mm_calls_it_alone(db_dispatch) -> None:
    """bf16, K-major experts, int32 offsets, the baseline pinned: the plan is ``torch._grouped_mm`` itself, no
    checks around it, and its result is torch's; an int64 offsets call is another signature, cast as before."""
    problem = _problem(layout="nt", dtype="bf16")
    x, w, offsets, _ = MOE_MATMUL.make_inputs(problem, "cuda", 8)
    assert offsets.dtype == torch.int32
    from kernels import _grouped_dispatch
    with moe.pinning([BASELINE], x, w) as (pin,):
        pin()
        kernels.moe_matmul(x, w, offsets)
        plan = _grouped_dispatch._READY[_grouped_dispatch._signature(False, x, w, offsets)]
        assert plan.kernel is None and plan.checked is moe.grouped_mm_call
        assert torch.equal(kernels.moe_matmul(x, w, offsets), torch._grouped_mm(x, w, offs=offsets))
        wide = offsets.to(torch.int64)
        assert torch.equal(kernels.moe_matmul(x, w, wide), torch._grouped_mm(x, w, offs=offsets))
        wide_plan = _grouped_dispatch._READY[_grouped_dispatch._signature(False, x, w, wide)]
        assert wide_plan.checked is not moe.grouped_mm_call


def test_the_direct_call_runs_a_kept_plan_only_where_nothing_watches_it(db_dispatch, monkeypatch) -> None:
    """``kernels.ops.moe_matmul_call`` (what transformers' experts and ``kernels.nn`` run) takes a kept plan
    before the operator's wrappers; a dispatch mode, a torch function mode or a gradient goes through the
    operator (observed by wrapping the module's globals)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from kernels import ops

    x, w, offsets, _ = MOE_MATMUL.make_inputs(_problem(), DEVICE, 9)
    want = MOE_MATMUL.reference((x, w, offsets))
    ops.moe_matmul_call(x, w, offsets, True)  # the first call keeps the plan
    seen: list[str] = []
    real_op, real_body = ops.moe_matmul, ops._moe_matmul
    monkeypatch.setattr(ops, "moe_matmul", lambda *a: seen.append("op") or real_op(*a))
    monkeypatch.setattr(ops, "_moe_matmul", lambda *a: seen.append("body") or real_body(*a))
    assert _error(ops.moe_matmul_call(x, w, offsets, True), want) <= TOLERANCE
    assert seen == []  # the kept plan, no wrapper

    class Watch(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    class Passing(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    for mode in (Watch, Passing):
        seen.clear()
        with mode():
            assert _error(ops.moe_matmul_call(x, w, offsets, True), want) <= TOLERANCE
        assert seen[0] == "op", mode
    seen.clear()
    out = ops.moe_matmul_call(x, w.clone().requires_grad_(), offsets, True)
    assert seen[0] == "op" and out.requires_grad  # the operator, with its backward
    seen.clear()
    ops.moe_matmul_call(x, w, offsets, False)  # rows past the last end zeroed: the direct body fills them
    assert seen == ["body"]
