"""Runtime dispatch from a real SQLite file: exact hits, nearest tuned problems, defaults, the cache.

The package ships tuned tables (kernels/tables/); on a GPU they would answer for it, so tests of the
user's database turn them off and the shipped tables have tests of their own.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest
import torch
import triton

import kernels
from db import Record, Store, dump_document, load_document
from kernels import dispatch as dispatch_module
from kernels import _plans, gemm
from kernels._spec import BASELINE, Config, DeviceInfo, Problem, is_baseline
from kernels import CPU
from kernels.dispatch import SHIPPED_TABLES, Dispatcher
from kernels.gemm import MATMUL

_FULL = dict(VARIANT="tiled", BLOCK_M=16, BLOCK_N=32, BLOCK_K=32, GROUP_SIZE_M=1, SPLIT_K=1, NUM_SM=132,
             FLATTEN=False, EPILOGUE_SUBTILE=False, num_warps=4, num_stages=2)
SPLITK = Config.from_dict({**_FULL, "VARIANT": "splitk", "SPLIT_K": 2, "GROUP_SIZE_M": 4})
TILED = Config.from_dict(_FULL)
WIDE = Config.from_dict({**_FULL, "BLOCK_N": 64})  # valid only where N > 32


def make_record(device: DeviceInfo, key: str, config: Config, kernel: str = "matmul", **changes: Any) -> Record:
    """A plausible tuned record of ``kernel`` for the problem ``key`` on ``device``."""
    problem = Problem.from_key(kernel, key)
    values: dict[str, Any] = dict(
        device_name=device.name, device_alias=device.alias, compute_capability=device.compute_capability,
        sm_count=device.sm_count, kernel=kernel, problem_key=key, dtype=problem.dtype, layout=problem.layout,
        shapes=problem.shapes, config=config.as_dict(), time_ms=0.5, tflops=1.0, cublas_ms=0.6,
        triton_config=config.as_dict(), triton_ms=0.5, torch_version="2.11.0", triton_version="3.6.0",
        cuda_version="", trials=8, created_at=datetime(2025, 1, 31, tzinfo=timezone.utc))
    values.update(changes)
    if "tflops" not in changes:  # the record must agree with itself (db.plausibility_problems)
        values["tflops"] = problem.flops / (values["time_ms"] * 1e-3) / 1e12
    return Record(**values)


@pytest.fixture
def device(torch_device: torch.device) -> DeviceInfo:
    return kernels.current_device(torch_device)


@pytest.fixture
def put(db_url: str, device: DeviceInfo):
    """Store records for this device in the test's database."""
    def put(key: str, config: Config, **changes: Any) -> None:
        with Store(db_url) as store:
            store.put(make_record(device, key, config, **changes), on_conflict="replace")
    return put


@pytest.fixture(autouse=True)
def restore_dispatcher() -> Iterator[None]:
    yield
    kernels.use_database(None)


@pytest.fixture
def launched(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Config]]:
    """(variant, config) of every Triton launch by the dense GEMM from now on."""
    calls: list[tuple[str, Config]] = []
    for variant, launch in list(gemm._LAUNCHERS.items()):
        def spy(config, a, b, c, variant=variant, launch=launch):
            calls.append((variant, config))
            launch(config, a, b, c)
        monkeypatch.setitem(gemm._LAUNCHERS, variant, spy)
    return calls


def _inputs(m: int, n: int, k: int, torch_device, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=gen) / k ** 0.5).half().to(torch_device)
    b = torch.randn(k, n, generator=gen).half().to(torch_device)
    return a, b


def _assert_right(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> None:
    ref = a.cpu().double() @ b.cpu().double()
    assert torch.isfinite(out).all()
    assert (out.cpu().double() - ref).norm() <= 5e-3 * ref.norm()  # fp16 output rounding ~3e-4


def _problem(key: str) -> Problem:
    return Problem.from_key("matmul", key)


def _ran(a: torch.Tensor, b: torch.Tensor) -> Config:
    """The config of the plan kernels.matmul runs on such operands now (the same on a CPU under the
    interpreter and on a GPU, where a plan launches the compiled kernel directly)."""
    plan = _plans.plan_of(a, b, "eager")
    if plan is None and _plans.FAST.cublas_everywhere:  # a GPU with nothing tuned: torch.mm at once, no plan
        return BASELINE
    return BASELINE if plan is torch.mm else plan.config


@pytest.fixture
def cpu_put(db_url: str):
    """Store records for the CPU, whose untuned problems take the nearest tuned config (the rule these
    tests check; on a GPU a dense problem nobody tuned follows the evidence rule of test_modes.py)."""
    def put(key: str, config: Config, **changes: Any) -> None:
        with Store(db_url) as store:
            store.put(make_record(CPU, key, config, **changes), on_conflict="replace")
    return put


# ------------------------------------------------------------------------------------------------ choose

def test_exact_hit_comes_from_the_database(db_url, put, device) -> None:
    put("fp16:nn:16x32x64", SPLITK)
    choice = Dispatcher(db_url, use_shipped=False).choose(MATMUL, _problem("fp16:nn:16x32x64"), device)
    assert choice.source == "database" and choice.config == SPLITK


def test_untuned_problem_takes_nearest_tuned_config(db_url, cpu_put) -> None:
    cpu_put("fp16:nn:16x32x64", SPLITK)
    cpu_put("fp16:nn:4096x4096x4096", TILED)
    choice = Dispatcher(db_url, use_shipped=False).choose(MATMUL, _problem("fp16:nn:17x32x64"), CPU)
    assert choice.source == "nearest:fp16:nn:16x32x64" and choice.config == SPLITK


def test_other_dtype_or_layout_is_never_nearest(db_url, cpu_put) -> None:
    cpu_put("fp32:nn:16x32x32", TILED)
    cpu_put("fp16:nt:16x32x32", TILED)
    problem = _problem("fp16:nn:16x32x32")
    choice = Dispatcher(db_url, use_shipped=False).choose(MATMUL, problem, CPU)
    assert choice.source == "default" and choice.config == MATMUL.default_config(problem, CPU)


def test_the_same_shapes_in_the_other_half_type_are_nearer_than_other_shapes(db_url, cpu_put) -> None:
    cpu_put("bf16:nn:16x32x64", SPLITK)
    cpu_put("fp16:nn:64x32x64", TILED)  # two factors of 2 in M away: distance 2 against bf16's 1
    choice = Dispatcher(db_url, use_shipped=False).choose(MATMUL, _problem("fp16:nn:16x32x64"), CPU)
    assert choice.source == "nearest:bf16:nn:16x32x64" and choice.config == SPLITK


def test_records_of_another_device_are_not_used(db_url) -> None:
    other = DeviceInfo("NVIDIA A100-SXM4-80GB", "a100", "8.0", 108, 166_912)
    with Store(db_url) as store:
        store.put(make_record(other, "fp16:nn:16x32x32", TILED))
    choice = Dispatcher(db_url, use_shipped=False).choose(MATMUL, _problem("fp16:nn:16x32x32"), CPU)
    assert choice.source == "default"


def test_nearest_config_invalid_for_the_problem_is_skipped(db_url, cpu_put) -> None:
    cpu_put("fp16:nn:16x64x32", WIDE)  # nearest (distance 1) but BLOCK_N=64 is too wide for N=32
    cpu_put("fp16:nn:64x32x64", TILED)  # farther (distance sqrt 5), valid
    problem = _problem("fp16:nn:16x32x32")
    assert MATMUL.space.violation(WIDE, problem, CPU) is not None
    choice = Dispatcher(db_url, use_shipped=False).choose(MATMUL, problem, CPU)
    assert choice.source == "nearest:fp16:nn:64x32x64" and choice.config == TILED


def test_nearest_cublas_winner_is_taken_as_is(db_url, cpu_put) -> None:
    cpu_put("fp16:nn:16x32x64", BASELINE)
    choice = Dispatcher(db_url, use_shipped=False).choose(MATMUL, _problem("fp16:nn:16x32x32"), CPU)
    assert choice.source == "nearest:fp16:nn:16x32x64" and choice.config == BASELINE


def test_missing_database_file_gives_defaults_and_creates_nothing(tmp_path) -> None:
    missing = tmp_path / "nowhere" / "tuner.db"
    kernels.use_database(f"sqlite:///{missing}", use_shipped=False)
    problem = _problem("fp16:nn:16x32x32")
    choice = kernels.explain("matmul", problem, CPU)
    assert choice.source == "default" and choice.config == MATMUL.default_config(problem, CPU)
    assert not missing.exists() and not missing.parent.exists()


# ------------------------------------------------------------------------------------ kernels.matmul

def test_matmul_runs_the_stored_config(db_url, put, device, torch_device) -> None:
    put("fp16:nn:16x32x64", SPLITK)
    kernels.use_database(db_url, use_shipped=False)
    assert kernels.explain("matmul", _problem("fp16:nn:16x32x64"), device).config == SPLITK
    a, b = _inputs(16, 32, 64, torch_device)
    _assert_right(kernels.matmul(a, b), a, b)
    assert _ran(a, b) == SPLITK


def test_matmul_of_untuned_problem_runs_the_nearest_config(db_url, put, torch_device) -> None:
    put("fp16:nn:16x32x64", SPLITK)  # a graph record 1.2x over cuBLAS: evidence on a GPU too
    kernels.use_database(db_url, use_shipped=False)
    # K stays 64: on a GPU a K of 70 fills the record's 32-wide K blocks worse than where it won, and the
    # evidence rule then runs cuBLAS (test_modes.py; an H200 did, 2026-11-28).
    a, b = _inputs(17, 33, 64, torch_device, seed=1)
    _assert_right(kernels.matmul(a, b), a, b)
    assert _ran(a, b) == SPLITK


def test_matmul_with_cublas_record_runs_torch(db_url, put, launched, torch_device) -> None:
    put("fp16:nn:16x32x64", BASELINE)
    kernels.use_database(db_url, use_shipped=False)
    a, b = _inputs(16, 32, 64, torch_device, seed=2)
    out = kernels.matmul(a, b)
    assert launched == [] and _ran(a, b) == BASELINE
    assert torch.equal(out, torch.matmul(a, b))


def test_matmul_writes_into_out(db_url, put, torch_device) -> None:
    put("fp16:nn:16x32x64", TILED)
    kernels.use_database(db_url, use_shipped=False)
    a, b = _inputs(16, 32, 64, torch_device, seed=3)
    out = torch.full((16, 32), float("nan"), dtype=torch.float16, device=torch_device)
    assert kernels.matmul(a, b, out=out) is out
    _assert_right(out, a, b)


@pytest.mark.parametrize("config", [TILED, BASELINE], ids=["tiled", "cublas"])
def test_a_cached_signature_still_refuses_a_b_of_another_dtype(db_url, put, torch_device, config) -> None:
    """b's dtype is not in the plan key (host time per call): each plan must refuse a mismatch itself."""
    put("fp16:nn:16x32x64", config)
    kernels.use_database(db_url, use_shipped=False)
    a, b = _inputs(16, 32, 64, torch_device, seed=5)
    _assert_right(kernels.matmul(a, b), a, b)  # the signature's plan is built and cached
    with pytest.raises(TypeError, match="cast one"):
        kernels.matmul(a, b.float())
    out = torch.empty(16, 32, dtype=torch.float16, device=torch_device)
    with pytest.raises(TypeError, match="cast one"):
        kernels.matmul(a, b.float(), out=out)
    _assert_right(kernels.matmul(a, b), a, b)


def test_pinning_installs_each_config_in_turn_then_restores_the_plan(db_url, put, torch_device) -> None:
    """What a side-by-side eager contest does (tuner/timing.py public_calls): configs take turns on one
    call signature, and the signature's own plan comes back after."""
    put("fp16:nn:16x32x64", BASELINE)
    kernels.use_database(db_url, use_shipped=False)
    a, b = _inputs(16, 32, 64, torch_device, seed=6)
    kernels.matmul(a, b)
    with _plans.pinning([TILED, SPLITK], a, b) as (tiled, splitk):
        for install, config in ((splitk, SPLITK), (tiled, TILED), (splitk, SPLITK)):
            install()
            for mode in kernels.MODES:
                assert _plans.plan_of(a, b, mode).config == config
            _assert_right(kernels.matmul(a, b), a, b)
    assert _plans.plan_of(a, b, "eager") is torch.mm


def test_clear_cache_picks_up_a_newly_stored_record(db_url, put, torch_device, device) -> None:
    kernels.use_database(db_url, use_shipped=False)
    a, b = _inputs(16, 32, 64, torch_device, seed=4)
    kernels.matmul(a, b)
    untuned = kernels.explain("matmul", _problem("fp16:nn:16x32x64"), device).config  # default, or cuBLAS on a GPU
    assert _ran(a, b) == untuned
    put("fp16:nn:16x32x64", SPLITK)
    kernels.matmul(a, b)
    assert _ran(a, b) == untuned, "without clear_cache the resolved config stays"
    kernels.clear_cache()
    _assert_right(kernels.matmul(a, b), a, b)
    assert _ran(a, b) == SPLITK


def test_repeated_call_does_not_reload_the_database(db_url, put, torch_device, monkeypatch) -> None:
    put("fp16:nn:16x32x64", SPLITK)
    kernels.use_database(db_url, use_shipped=False)
    a, b = _inputs(16, 32, 64, torch_device, seed=5)
    kernels.matmul(a, b)
    Path(db_url.removeprefix("sqlite:///")).unlink()
    monkeypatch.setattr(kernels.dispatch, "_database_records",
                        lambda *args: pytest.fail("the hot path read the database again"))
    _assert_right(kernels.matmul(a, b), a, b)
    assert _ran(a, b) == SPLITK


def test_use_database_switches_tables(tmp_path, device) -> None:
    problem = _problem("fp16:nn:16x32x64")
    urls = []
    for name, config in (("one.db", SPLITK), ("two.db", TILED)):
        url = f"sqlite:///{tmp_path / name}"
        with Store(url) as store:
            store.put(make_record(device, problem.key, config))
        urls.append(url)
    kernels.use_database(urls[0], use_shipped=False)
    assert kernels.explain("matmul", problem, device).config == SPLITK
    kernels.use_database(urls[1], use_shipped=False)
    assert kernels.explain("matmul", problem, device).config == TILED


# ---------------------------------------------------------------------------------------- validate_record

def test_validate_record_accepts_space_points_and_cublas(device) -> None:
    kernels.validate_record(make_record(device, "fp16:nn:16x32x64", SPLITK))
    kernels.validate_record(make_record(device, "fp16:nn:16x32x64", BASELINE, triton_config=TILED.as_dict()))


@pytest.mark.parametrize("config, changes, message", [
    (TILED, dict(kernel="conv"), "unknown kernel 'conv'"),
    (TILED.replace(BLOCK_M=17), {}, "config is outside .* BLOCK_M=17"),
    (TILED, dict(triton_config={**_FULL, "EXTRA": 1}), "triton_config is outside .* EXTRA"),
])
def test_validate_record_rejects_what_the_runtime_cannot_use(device, config, changes, message) -> None:
    with pytest.raises(ValueError, match=message):
        kernels.validate_record(make_record(device, "fp16:nn:16x32x64", config, **changes))


def test_validate_record_rejects_dtype_the_kernel_does_not_take(device) -> None:
    record = make_record(device, "fp32:nn:16x32x32+8x8x8", Config.make(BLOCK_M=16), kernel="grouped_matmul")
    with pytest.raises(ValueError, match="does not take dtype fp32"):
        kernels.validate_record(record)


def test_validate_record_rejects_dense_key_with_several_gemms(device) -> None:
    with pytest.raises(ValueError, match="names 2 GEMMs"):
        kernels.validate_record(make_record(device, "fp16:nn:16x32x32+8x8x8", TILED))


def test_unusable_stored_records_are_skipped_with_a_warning(db_url, put, device, caplog) -> None:
    put("fp16:nn:16x32x32+8x8x8", TILED)  # Store.put does not validate; an import would refuse these
    put("fp16:nn:16x32x48", Config.from_dict({**_FULL, "VARIANT": "warp-specialized"}))
    put("fp16:nn:16x32x32", SPLITK)
    dispatcher = Dispatcher(db_url, use_shipped=False)
    choice = dispatcher.choose(MATMUL, _problem("fp16:nn:16x32x48"), device)
    # No exact hit: its record was skipped. Untuned, the CPU takes the nearest usable record; a GPU takes
    # cuBLAS unless a near record's win carries over (dispatch._untuned_choice), and 16x32x32's K is
    # 0.58 off, past UNTUNED_NEAR_WEIGHTS.
    assert choice.source == ("nearest:fp16:nn:16x32x32" if device.is_cpu
                             else "cublas: no tuned evidence that a Triton config wins here")
    assert dispatcher.choose(MATMUL, _problem("fp16:nn:16x32x32"), device).source == "database", \
        "the usable record loaded"
    skipped = [r.getMessage() for r in caplog.records if "skipping the database record" in r.getMessage()]
    assert len(skipped) == 2 and any("names 2 GEMMs" in m for m in skipped)
    assert any("warp-specialized" in m for m in skipped)


def test_records_tuned_under_another_triton_warn_once_and_still_run(db_url, put, device, caplog) -> None:
    put("fp16:nn:16x32x32", SPLITK, triton_version="3.4.0")
    put("fp16:nn:16x32x48", TILED, triton_version="3.4.1")
    put("fp16:nn:16x32x64", TILED, triton_version=triton.__version__)
    dispatcher = Dispatcher(db_url, use_shipped=False)
    assert dispatcher.choose(MATMUL, _problem("fp16:nn:16x32x32"), device).config == SPLITK
    dispatcher.choose(MATMUL, _problem("fp16:nn:16x32x48"), device)
    warnings = [r.getMessage() for r in caplog.records if "tuned under another triton" in r.getMessage()]
    assert len(warnings) == 1, "one warning per table, not per call"
    assert "1 with triton 3.4.0, 1 with triton 3.4.1" in warnings[0] and "re-tune" in warnings[0]


# ---------------------------------------------------------------------------------------- shipped tables

# The per-block shared memory of each GPU family a table is shipped for (cudaDevAttrMaxSharedMemoryPerBlockOptin).
# Both are compute capability 9.0, whose opt-in limit is 227 KB (CUDA C++ Programming Guide, technical
# specifications per compute capability): the H200 has the H100's multiprocessors.
SHARED_MEMORY = {"h100": 232_448, "h200": 232_448}
SHIPPED = sorted((Path(kernels.__file__).parent / SHIPPED_TABLES).glob("*.json"))


def _device_of(record: Record) -> DeviceInfo:
    if record.device_alias not in SHARED_MEMORY:
        pytest.skip(f"add the shared memory of {record.device_alias} to SHARED_MEMORY")
    return DeviceInfo(record.device_name, record.device_alias, record.compute_capability, record.sm_count,
                      SHARED_MEMORY[record.device_alias])


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_table_is_valid_and_its_configs_fit_their_problems(path: Path) -> None:
    records = load_document(path, validate=kernels.validate_record)
    assert records
    for record in records:
        spec = kernels.get_kernel(record.kernel)
        problem = Problem.from_key(spec.name, record.problem_key)
        for values in (record.config, record.triton_config):
            config = Config.from_dict(values)
            if not is_baseline(config):
                assert spec.space.violation(config, problem, _device_of(record)) is None, (record.problem_key, values)


@pytest.mark.skipif(not SHIPPED, reason="no shipped tables")
def test_shipped_table_answers_for_its_gpu_and_the_database_wins(db_url) -> None:
    record = load_document(SHIPPED[0])[0]
    device = _device_of(record)
    problem = Problem.from_key(record.kernel, record.problem_key)
    spec = kernels.get_kernel(record.kernel)
    shipped = Dispatcher(db_url).choose(spec, problem, device, record.mode)
    assert shipped.source == "shipped" and shipped.config == Config.from_dict(record.config)
    # Without the table the problem is untuned: the kernel's default, or cuBLAS for an epilogue kernel
    untuned = Dispatcher(db_url, use_shipped=False).choose(spec, problem, device, record.mode).source
    assert untuned == "default" or untuned.startswith("cublas: no tuned evidence"), untuned
    own = spec.default_config(problem, device)
    with Store(db_url) as store:
        store.put(make_record(device, record.problem_key, own, kernel=record.kernel, mode=record.mode))
    mine = Dispatcher(db_url).choose(spec, problem, device, record.mode)
    assert mine.source == "database" and mine.config == own


# ---------------------------------------------------------------------------------------- hostile tables


def test_an_implausible_stored_record_is_skipped_with_one_warning(db_url, cpu_put, caplog) -> None:
    cpu_put("fp16:nn:16x32x32", SPLITK)
    cpu_put("fp16:nn:16x32x64", TILED)
    # A record written before the rules existed (Store.put now refuses it): 1e-300 ms, 1e300 TFLOP/s.
    with sqlite3.connect(db_url.removeprefix("sqlite:///")) as connection:
        connection.execute("UPDATE tuner_records SET time_ms = 1e-300, tflops = 1e300 "
                           "WHERE problem_key = 'fp16:nn:16x32x32'")
    choice = Dispatcher(db_url, use_shipped=False).choose(MATMUL, _problem("fp16:nn:16x32x32"), CPU)
    assert choice.source == "nearest:fp16:nn:16x32x64" and choice.config == TILED
    skipped = [r.getMessage() for r in caplog.records if "not plausible" in r.getMessage()]
    assert len(skipped) == 1 and "fp16:nn:16x32x32" in skipped[0]


def test_a_corrupt_shipped_table_is_skipped_with_a_warning(tmp_path, device, monkeypatch, caplog) -> None:
    # A double for the package's resource folder only: the tables are read from tmp_path instead.
    tables = tmp_path / SHIPPED_TABLES
    tables.mkdir()
    good = make_record(device, "fp16:nn:16x32x32", SPLITK)
    (tables / "good.json").write_text(json.dumps(dump_document([good])))
    (tables / "truncated.json").write_text(json.dumps(dump_document([good]))[:100])
    (tables / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (tables / "list.json").write_text("[1, 2]")
    monkeypatch.setattr(dispatch_module.resources, "files", lambda package: tmp_path)
    choice = Dispatcher(f"sqlite:///{tmp_path / 'none.db'}").choose(MATMUL, _problem("fp16:nn:16x32x32"), device)
    assert (choice.config, choice.source) == (SPLITK, "shipped")
    warned = [r.getMessage() for r in caplog.records if "skipping the shipped table" in r.getMessage()]
    assert sorted(m.split()[4] for m in warned) == ["deep.json:", "list.json:", "truncated.json:"]
    # explain's list of GPUs reads the same tables, past the same damage (a too-deep one had raised there)
    assert [d["name"] for d in dispatch_module.shipped_devices()] == [device.name]


# ------------------------------------------------------------------------ nothing tuned: torch.mm at once

@pytest.fixture
def compiled_process(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """A process without the interpreter (as on a GPU box, where Triton compiles), no tuned tables: every
    matmul goes to cuBLAS. Triton still interprets here, which only matters to the pinned plans below."""
    monkeypatch.setattr(kernels._device, "INTERPRETED", False)
    kernels.use_database(f"sqlite:///{tmp_path / 'none.db'}", use_shipped=False)
    yield
    kernels.use_database(None)


def test_with_nothing_tuned_a_call_is_torch_mm_at_once_and_builds_no_plan(compiled_process) -> None:
    a, b = _inputs(16, 32, 64, "cpu", seed=7)
    assert torch.equal(kernels.matmul(a, b), torch.mm(a, b))
    assert _plans.FAST.cublas_everywhere is True and _plans.get(_plans.signature(a, b)) is None


@pytest.mark.parametrize("bad, error, message", [
    (lambda a, b: (a, b.float()), TypeError, "cast one"),
    (lambda a, b: (a.unsqueeze(0), b), ValueError, "2-D"),
    (lambda a, b: (a.double(), b.double()), TypeError, "float16, bfloat16 or float32"),
    (lambda a, b: (a, b[:10]), ValueError, "inner dimensions"),
    (lambda a, b: (a.tolist(), b), TypeError, "torch tensors"),
])
def test_with_nothing_tuned_bad_operands_still_get_the_checked_errors(compiled_process, bad, error, message) -> None:
    a, b = _inputs(16, 32, 64, "cpu", seed=8)
    kernels.matmul(a, b)
    with pytest.raises(error, match=message):
        kernels.matmul(*bad(a, b))


def test_a_pinned_plan_runs_even_where_nothing_is_tuned(compiled_process, torch_device) -> None:
    """The tuner times candidates through the public call: the cuBLAS shortcut must not take them over."""
    a, b = _inputs(16, 32, 64, torch_device, seed=9)  # on a GPU box Triton compiles: CUDA operands
    kernels.matmul(a, b)
    with _plans.pinning([TILED], a, b) as (install,):
        install()
        _assert_right(kernels.matmul(a, b), a, b)
        assert _ran(a, b) == TILED and not _plans.FAST.cublas_everywhere
    kernels.matmul(a, b)
    assert _plans.FAST.cublas_everywhere is True


def test_record_mode_sees_calls_where_nothing_is_tuned(compiled_process, tmp_path: Path) -> None:
    a, b = _inputs(16, 32, 64, "cpu", seed=10)
    with kernels.recording(f"sqlite:///{tmp_path / 'recorded.db'}"):
        kernels.matmul(a, b)
        kernels.matmul(a, b)
        assert _plans.FAST.cublas_everywhere is False
        assert sum(count for key, count in kernels._REC.counts.items() if key == _plans.signature(a, b)) == 2
    kernels.matmul(a, b)
    assert _plans.FAST.cublas_everywhere is True


def test_has_records_sees_a_gpu_table(db_url) -> None:
    h100 = DeviceInfo("NVIDIA H100 80GB HBM3", "h100", "9.0", 132, 232448)
    with Store(db_url) as store:
        store.put(make_record(h100, "fp16:nn:16x32x64", TILED))
    dispatcher = Dispatcher(db_url, use_shipped=False)
    assert dispatcher.has_records(h100, MATMUL)
    assert not dispatcher.has_records(DeviceInfo("NVIDIA H200", "h200", "9.0", 132, 232448), MATMUL)


def test_an_answer_chosen_across_a_clear_serves_its_call_but_is_not_kept(db_url, monkeypatch) -> None:
    """A refresh thread (or use_database) clears while a first call chooses on the old tables: that call
    gets its answer, but the answer is not kept past the clear (its ``changes`` count says it is gone)."""
    dispatcher = Dispatcher(db_url, use_shipped=False)
    problem = _problem("fp16:nn:16x32x64")
    real_choose = dispatcher.choose

    def choose_across_a_clear(*args, **kwargs):
        choice = real_choose(*args, **kwargs)
        dispatcher.clear()
        return choice

    monkeypatch.setattr(dispatcher, "choose", choose_across_a_clear)
    resolutions = dispatcher.resolutions
    config = dispatcher.resolve("key", MATMUL, problem, CPU)
    assert config == real_choose(MATMUL, problem, CPU).config
    assert dispatcher.cached("key") is None and dispatcher.resolutions == resolutions + 1
    monkeypatch.setattr(dispatcher, "choose", real_choose)
    assert dispatcher.resolve("key", MATMUL, problem, CPU) == config and dispatcher.cached("key") == config
