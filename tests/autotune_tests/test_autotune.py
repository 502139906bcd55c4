"""kernels.autotune on the GPU where there is one, else under the interpreter: each mode, the lookup order, a
changed source, every bad input, and a GPU fault while tuning.

The timer is a test double (``_kernels.FakeTimer``): there is no GPU timer on the CPU, and it lets a test decide
which candidate is fastest. The database is a real SQLite file per test, and the kernels are real Triton kernels.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import kernels
from db import Store, export_records
from db.recorded import recorded
from kernels import AutotuneError, Config, Space

from . import _kernels
from ._kernels import CONFIGS, DEVICE, FakeTimer, call, scale

ROOT = Path(__file__).resolve().parents[2]


def _tuner(db_url: str, timer: FakeTimer, **options) -> kernels.Autotuner:
    options.setdefault("configs", CONFIGS)
    options.setdefault("key", ["n"])
    return kernels.autotune(do_bench=timer, db=db_url, name="tests.scale", **options)(scale)


def _records(db_url: str) -> list:
    with Store(db_url) as store:
        return store.records()


@pytest.mark.parametrize("mode", ["off", "record"])
def test_off_and_record_modes_run_the_first_config_and_time_nothing(db_url, mode) -> None:
    timer = FakeTimer()
    tuner = _tuner(db_url, timer, mode=mode)
    x, y = call(tuner, 50)
    torch.testing.assert_close(y, 2 * x)
    assert tuner.best_config == Config.make(BLOCK=16, num_warps=1, num_stages=3)
    assert timer.calls == 0
    assert _records(db_url) == []
    with Store(db_url) as store:
        seen = recorded(store)
    assert [p.key.problem_key.split("@")[0] for p in seen] == (["n=50;float32,float32"] if mode == "record" else [])


def test_on_mode_stores_the_fastest_and_a_fresh_decorator_reads_it_without_timing(db_url) -> None:
    timer = FakeTimer((3.0, 1.0, 2.0))  # the second config, BLOCK=32, is the fastest
    tuner = _tuner(db_url, timer, mode="on")
    x, y = call(tuner, 50)
    torch.testing.assert_close(y, 2 * x)
    assert timer.calls == 3
    (record,) = _records(db_url)
    assert record.config["BLOCK"] == 32 and record.time_ms == 1.0 and record.kernel == "tests.scale"
    Path(db_url.removeprefix("sqlite:///")).unlink()  # from now on a dict lookup: no database, no timing
    x, y = call(tuner, 50, seed=2)
    torch.testing.assert_close(y, 2 * x)
    assert timer.calls == 3
    with Store(db_url) as store:
        store.put(record)
    again = FakeTimer()
    fresh = _tuner(db_url, again, mode="on")  # what a new process builds
    x, y = call(fresh, 50, seed=1)
    torch.testing.assert_close(y, 2 * x)
    assert again.calls == 0 and fresh.best_config["BLOCK"] == 32


def test_mode_comes_from_the_environment_when_not_given(db_url, monkeypatch) -> None:
    monkeypatch.setenv("TUNER_AUTOTUNE", "off")
    timer = FakeTimer()
    call(_tuner(db_url, timer), 20)
    assert timer.calls == 0
    monkeypatch.setenv("TUNER_AUTOTUNE", "sometimes")
    with pytest.raises(AutotuneError, match="TUNER_AUTOTUNE='sometimes'"):
        call(_tuner(db_url, timer), 21)


def test_incremental_mode_times_one_candidate_per_call_then_keeps_the_winner(db_url) -> None:
    timer = FakeTimer((3.0, 1.0, 2.0))
    tuner = _tuner(db_url, timer, mode="incremental")
    for expected_calls in (1, 2):
        x, y = call(tuner, 40, seed=expected_calls)
        torch.testing.assert_close(y, 2 * x)  # every call's output is right meanwhile
        assert timer.calls == expected_calls and _records(db_url) == []
    call(tuner, 40)
    assert timer.calls == 3 and tuner.best_config["BLOCK"] == 32
    call(tuner, 40)
    assert timer.calls == 3  # converged: a dict lookup from now on
    assert [r.config["BLOCK"] for r in _records(db_url)] == [32]


def test_space_tunes_at_most_the_budget_and_given_configs_start_it(db_url) -> None:
    timer = FakeTimer()
    space = Space({"BLOCK": [8, 16, 32, 64, 128, 256], "num_warps": [1, 2, 4, 8]})
    tuner = _tuner(db_url, timer, mode="on", configs=[triton.Config({"BLOCK": 64}, num_warps=2)], space=space)
    x, y = call(tuner, 30)
    torch.testing.assert_close(y, 2 * x)
    assert timer.calls == 20  # 24 points, a budget of 20
    assert tuner.best_config == Config.make(BLOCK=64, num_warps=2, num_stages=3)  # ties go to the warm start


def test_a_changed_source_warns_once_and_tunes_again(db_url) -> None:
    call(_tuner(db_url, FakeTimer(), mode="on"), 50)

    @triton.jit
    def scale(x_ptr, y_ptr, n, BLOCK: tl.constexpr):  # same name, another body: a new kernel
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)

    timer = FakeTimer()
    changed = kernels.autotune(configs=CONFIGS, key=["n"], do_bench=timer, db=db_url, name="tests.scale",
                               mode="on")(scale)
    with pytest.warns(UserWarning, match=r"1 of its keys on \S+ were tuned for another source"):
        call(changed, 50)
    assert timer.calls == 3
    assert len(_records(db_url)) == 2


def test_a_record_of_another_triton_version_is_not_read_and_the_warning_names_both(db_url) -> None:
    from kernels._autotune_core import make_record

    timer = FakeTimer()
    tuner = _tuner(db_url, timer, mode="on")
    old = make_record(tuner.name, kernels.current_device(torch.device(DEVICE)), kernels.Key({"n": 50}, ("float32",) * 2),
                      f"{tuner.src_hash}@3.5.0", Config.make(BLOCK=64, num_warps=4), 0.5, 3)
    with Store(db_url) as store:
        store.put(old)
    with pytest.warns(UserWarning, match=r"another triton \(3\.5\.0; this is " + re.escape(triton.__version__)):
        call(tuner, 50)
    assert timer.calls == 3 and tuner.best_config["BLOCK"] == 16


def test_lookup_order_database_then_table_then_nearest_key(db_url, tmp_path) -> None:
    shipped = f"sqlite:///{tmp_path / 'shipped.db'}"
    call(_tuner(shipped, FakeTimer((1.0, 2.0, 3.0)), mode="on"), 50)  # BLOCK=16 wins there
    with Store(shipped) as store:
        export_records(store, tmp_path / "table.json")
    call(_tuner(db_url, FakeTimer((3.0, 2.0, 1.0)), mode="on"), 64)  # BLOCK=64 wins in the user's database
    timer = FakeTimer()
    tuner = _tuner(db_url, timer, mode="off", tables=tmp_path / "table.json",
                   distance=lambda a, b: abs(a["n"] - b["n"]))
    call(tuner, 50)
    assert tuner.best_config["BLOCK"] == 16  # the table's key
    call(tuner, 64)
    assert tuner.best_config["BLOCK"] == 64  # the database's key
    call(tuner, 60)
    assert tuner.best_config["BLOCK"] == 64  # nearest: 64 is 4 away, 50 is 10
    call(tuner, 52)
    assert tuner.best_config["BLOCK"] == 16
    assert timer.calls == 0


# Bad input: one clear error, nothing stored ---------------------------------------------------------------

def test_key_naming_no_argument_is_refused_at_decoration(db_url) -> None:
    with pytest.raises(AutotuneError, match=r"key 'N' of tests.scale names no argument.*x_ptr, y_ptr, n, BLOCK"):
        _tuner(db_url, FakeTimer(), key=["N"])


def test_config_parameter_the_kernel_does_not_take_is_refused(db_url) -> None:
    with pytest.raises(AutotuneError, match="takes no parameter BLOCK_SIZE"):
        _tuner(db_url, FakeTimer(), configs=[triton.Config({"BLOCK_SIZE": 16})])
    with pytest.raises(AutotuneError, match="takes no parameter TILE"):
        _tuner(db_url, FakeTimer(), configs=[], space=Space({"TILE": [16]}))


def test_space_with_no_valid_config_says_so_and_stores_nothing(db_url) -> None:
    space = Space({"BLOCK": [16, 32]}, constraints=(lambda c, k: c["BLOCK"] > k["n"],))
    tuner = _tuner(db_url, FakeTimer(), configs=[], space=space, mode="on")
    with pytest.raises(AutotuneError, match="has no valid config for key n=100.*loosen the constraints"):
        call(tuner, 100)
    assert _records(db_url) == []


@triton.jit
def _faulty(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    # BLOCK must be a power of two: 24 and 48 fail as Triton builds them (tl.arange refuses them), before anything
    # reaches the GPU, so on a GPU too these tests leave the process's CUDA context sound. A fault on the GPU
    # itself is the subject of the two tests after these.
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) * 2, mask=offs < n)


def test_kernel_faulting_for_every_config_says_so_and_stores_nothing(db_url) -> None:
    tuner = kernels.autotune(configs=[triton.Config({"BLOCK": 24}), triton.Config({"BLOCK": 48})], key=["n"],
                             do_bench=FakeTimer(), db=db_url, mode="on")(_faulty)
    with pytest.raises(AutotuneError, match="failed for every one of its 2 config"):
        call(tuner, 10)
    assert _records(db_url) == []


def test_one_faulting_config_is_skipped(db_url) -> None:
    tuner = kernels.autotune(configs=[triton.Config({"BLOCK": 24}), triton.Config({"BLOCK": 16})], key=["n"],
                             do_bench=FakeTimer(), db=db_url, mode="on")(_faulty)
    x, y = call(tuner, 10)
    torch.testing.assert_close(y, 2 * x)
    assert [r.config["BLOCK"] for r in _records(db_url)] == [16]


@pytest.mark.interpreter
def test_a_config_whose_timing_loses_the_cuda_context_ends_the_tuning_with_an_error_naming_it(db_url,
                                                                                             monkeypatch) -> None:
    """A GPU fault is not skipped as a config that fails to build is: it takes the process's CUDA context with it.
    The lost context is stood in for by torch's own functions (a context that is started, and a synchronize that
    fails as it does after an illegal address), so this runs under the interpreter only: on a GPU the stand-in
    would hide the real context from the test's own tensors. The real fault is the next test's, in a process of
    its own."""
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)

    def lost_context_synchronize(device=None) -> None:
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", lost_context_synchronize)
    timer = FakeTimer()
    tuner = kernels.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 24}),
                                      triton.Config({"BLOCK": 32})], key=["n"], do_bench=timer, db=db_url,
                             mode="on")(_faulty)
    with pytest.raises(AutotuneError, match=r"timing config BLOCK: 24\b.*CUDA context lost.*python -m tuner search"):
        call(tuner, 10)
    assert timer.calls == 1  # BLOCK=16 timed; nothing after the fault
    assert _records(db_url) == [] and tuner.cache == {}


# Stores 4 TiB past y for BLOCK=32 (an illegal address); BLOCK=16 is sound and is timed first.
_FAULT_ON_THE_GPU = """
import os, sys
import torch, triton, triton.language as tl
import kernels

@triton.jit
def scale_far(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    values = 2 * tl.load(x_ptr + offs, mask=mask)
    if BLOCK == 32:
        tl.store(y_ptr + offs + (1 << 40), values, mask=mask)
    else:
        tl.store(y_ptr + offs, values, mask=mask)

tuner = kernels.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 32})], key=["n"],
                         db=sys.argv[1], mode="on", name="tests.scale_far")(scale_far)
x = torch.randn(100, device="cuda")
y = torch.empty_like(x)
try:
    tuner[lambda meta: (triton.cdiv(100, meta["BLOCK"]),)](x, y, 100)
except kernels.AutotuneError as exc:
    print(exc, flush=True)
    os._exit(3)  # the context is lost: no teardown of it can run
print("no error", flush=True)
"""


@pytest.mark.gpu
def test_a_real_gpu_fault_while_tuning_names_the_config_and_the_out_of_process_search(db_url, tmp_path) -> None:
    # In a process of its own: the fault ends that process's CUDA context, which this pytest worker's GPU tests
    # need (a GPU run of 2026-11-28 lost every later test of a worker to one in-process fault). From a file, as
    # triton.jit reads the kernel's source.
    script = tmp_path / "fault_on_the_gpu.py"
    script.write_text(_FAULT_ON_THE_GPU)
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))
    done = subprocess.run([sys.executable, str(script), db_url], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 3, done.stdout + done.stderr
    assert re.search(r"timing config BLOCK: 32\b.*CUDA context lost.*python -m tuner search", done.stdout), done.stdout
    assert _records(db_url) == []


def test_a_bad_mode_is_refused() -> None:
    with pytest.raises(AutotuneError, match="mode='always' is not one of off, record, on, incremental"):
        kernels.autotune(configs=CONFIGS, key=["n"], mode="always")(scale)


# Never tune under a trace or a capture ------------------------------------------------------------------------

def test_the_trace_time_lookup_is_marked_constant_as_torchs_own_decorator_marks_a_function() -> None:
    # kernels/_autotune.py sets the decorator's mark itself, so that importing kernels does not import Dynamo;
    # a torch whose decorator marks a function otherwise fails here (and the fullgraph tests of
    # tests/kernels_tests/test_compile_public.py would see a graph break in the lookup).
    from kernels import _autotune

    marked = torch.compiler.assume_constant_result(lambda: 0)
    assert [name for name, value in vars(marked).items() if value is True] == [_autotune.CONSTANT_RESULT_MARK]
    assert getattr(_autotune._config_while_tracing, _autotune.CONSTANT_RESULT_MARK) is True


def test_dynamo_takes_a_function_with_the_mark_for_a_constant_under_fullgraph() -> None:
    # The mark alone, on a function Dynamo cannot trace (a lock: "Unsupported context manager"), in a real trace.
    import threading

    from kernels import _autotune

    lock = threading.Lock()

    def looked_up(n: int) -> int:
        with lock:
            return 2 * n

    setattr(looked_up, _autotune.CONSTANT_RESULT_MARK, True)
    compiled = torch.compile(lambda x: x * looked_up(3), fullgraph=True, backend="eager")
    torch.testing.assert_close(compiled(torch.ones(2)), torch.full((2,), 6.0))


def test_importing_kernels_and_the_tuner_leaves_dynamo_unloaded() -> None:
    # Dynamo's import was 1.2 of the 3.9 s of `import kernels` (CPU build machine, torch 2.13.0+cpu, 2026-11-29,
    # `python -X importtime -c 'import kernels'` and `/usr/bin/time python -c 'import kernels'`), paid by every fleet worker and compile process, which never trace.
    code = "import sys, kernels, tuner.cli, tuner.search, tuner.workers; print('torch._dynamo' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[2], env={**os.environ, "TRITON_INTERPRET": "1"})
    assert out.stdout.strip() == "False", out.stderr[-2000:]


def test_under_a_torch_compile_trace_nothing_is_timed_and_a_later_eager_call_tunes(db_url, monkeypatch) -> None:
    # torch.compile cannot trace the interpreter's kernels on the CPU, so the trace is stood in for by its own
    # flag (torch's function, not ours); the GPU test below captures a CUDA graph for real.
    timer = FakeTimer((3.0, 1.0, 2.0))
    tuner = _tuner(db_url, timer, mode="on")
    monkeypatch.setattr(torch.compiler, "is_dynamo_compiling", lambda: True)
    with pytest.warns(UserWarning, match=r"key n=50;float32,float32 is not tuned on .* tune the key first"):
        x, y = call(tuner, 50)
    torch.testing.assert_close(y, 2 * x)
    assert timer.calls == 0 and tuner.best_config["BLOCK"] == 16 and _records(db_url) == [] and not tuner.cache
    monkeypatch.undo()
    call(tuner, 50)
    assert timer.calls == 3 and tuner.best_config["BLOCK"] == 32


def test_under_a_trace_a_stored_key_runs_its_winner_and_a_recorded_key_is_noted(db_url, monkeypatch) -> None:
    # The config a compiled graph keeps is chosen at trace time from what is known, never timed (the trace is
    # stood in for by torch's own flag, as above).
    call(_tuner(db_url, FakeTimer((3.0, 1.0, 2.0)), mode="on"), 50)  # another process's eager call: stored
    monkeypatch.setattr(torch.compiler, "is_dynamo_compiling", lambda: True)
    timer = FakeTimer()
    traced = _tuner(db_url, timer, mode="on")
    x, y = call(traced, 50)
    torch.testing.assert_close(y, 2 * x)
    assert timer.calls == 0 and traced.best_config["BLOCK"] == 32
    assert list(traced.cache.values()) == [traced.best_config]
    recording = _tuner(db_url, timer, mode="record")
    x, y = call(recording, 70)
    torch.testing.assert_close(y, 2 * x)
    with Store(db_url) as store:
        seen = [p.key.problem_key.split("@")[0] for p in recorded(store)]
    assert seen == ["n=70;float32,float32"] and timer.calls == 0 and not recording.cache


@pytest.mark.gpu
def test_inside_cuda_graph_capture_the_best_known_config_runs_untimed(db_url) -> None:
    n = 1000
    x = torch.randn(n, device="cuda")
    y = torch.empty_like(x)
    grid = lambda meta: (triton.cdiv(n, meta["BLOCK"]),)
    _tuner(db_url, FakeTimer(), mode="off")[grid](x, y, n)  # compiles the default config outside the capture
    timer = FakeTimer()
    tuner = _tuner(db_url, timer, mode="on")
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        tuner[grid](x, y, n)
    y.zero_()
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(y, 2 * x)
    assert timer.calls == 0 and tuner.best_config["BLOCK"] == 16
    tuner[grid](x, y, n)  # eager again: now it tunes
    assert timer.calls == 3


# Triton's arguments keep their meaning ----------------------------------------------------------------------

@triton.jit
def _accumulate(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(y_ptr + offs, tl.load(y_ptr + offs, mask=mask) + 2 * tl.load(x_ptr + offs, mask=mask), mask=mask)


@pytest.mark.parametrize("hook", ["restore_value", "reset_to_zero"])
def test_in_place_outputs_are_restored_or_zeroed_between_timings_as_triton_does(db_url, hook) -> None:
    timer = FakeTimer()
    tuner = kernels.autotune(configs=CONFIGS, key=["n"], do_bench=timer, db=db_url, mode="on",
                             **{hook: ["y_ptr"]})(_accumulate)
    gen = torch.Generator().manual_seed(3)
    x, y0 = torch.randn(40, generator=gen).to(DEVICE), torch.randn(40, generator=gen).to(DEVICE)
    y = y0.clone()
    tuner[lambda meta: (triton.cdiv(40, meta["BLOCK"]),)](x, y, 40)
    assert timer.calls == 3
    # restore_value: as if only the user's call ran; reset_to_zero: the last timing zeroed y, then the call added.
    torch.testing.assert_close(y, y0 + 2 * x if hook == "restore_value" else 2 * x + 2 * x)


def test_early_config_prune_and_hooks_see_triton_configs_and_named_arguments(db_url) -> None:
    seen = []

    def prune(configs, named_args, **kwargs):
        seen.append((type(configs[0]).__name__, sorted(named_args)))
        return [c for c in configs if c.kwargs["BLOCK"] >= 32]

    timer = FakeTimer()
    tuner = _tuner(db_url, timer, mode="on", prune_configs_by={"early_config_prune": prune},
                   pre_hook=lambda args: seen.append("pre"))
    x, y = call(tuner, 50)
    torch.testing.assert_close(y, 2 * x)
    assert seen[0] == ("Config", ["n", "x_ptr", "y_ptr"]) and seen.count("pre") == 2
    assert timer.calls == 2 and tuner.best_config["BLOCK"] == 32


def test_default_name_is_module_and_qualname_and_a_bad_name_is_refused(db_url) -> None:
    tuner = kernels.autotune(configs=CONFIGS, key=["n"], db=db_url)(scale)
    assert tuner.name == f"{_kernels.__name__}.scale"  # however pytest named the module
    with pytest.raises(AutotuneError, match="name='my kernel' cannot name a kernel"):
        kernels.autotune(configs=CONFIGS, key=["n"], name="my kernel")(scale)
    with pytest.raises(AutotuneError, match="name='matmul' is one of the tuner's own kernels"):
        kernels.autotune(configs=CONFIGS, key=["n"], name="matmul")(scale)


def test_use_database_and_clear_cache_reach_decorators_without_db(db_url, tmp_path) -> None:
    timer = FakeTimer((3.0, 1.0, 2.0))
    tuner = kernels.autotune(configs=CONFIGS, key=["n"], do_bench=timer, name="tests.scale", mode="on")(scale)
    kernels.use_database(db_url)
    try:
        call(tuner, 50)
        assert [r.config["BLOCK"] for r in _records(db_url)] == [32]
        kernels.use_database(f"sqlite:///{tmp_path / 'other.db'}")
        assert tuner.cache == {}
        call(tuner, 50)
        assert timer.calls == 6  # the other database had no record: tuned again
        kernels.clear_cache()
        call(tuner, 50)
        assert timer.calls == 6  # read back from the other database
    finally:
        kernels.use_database(None)


def test_a_damaged_table_is_skipped_with_a_warning_and_the_call_goes_on(db_url, tmp_path, caplog) -> None:
    (tmp_path / "tables").mkdir()
    (tmp_path / "tables" / "broken.json").write_text("{not json")
    timer = FakeTimer()
    tuner = _tuner(db_url, timer, mode="off", tables=tmp_path / "tables")
    x, y = call(tuner, 30)
    torch.testing.assert_close(y, 2 * x)
    assert "skipping the table broken.json" in caplog.text


def test_a_symbolic_key_value_is_specialized_under_dynamo_and_each_value_traces_once() -> None:
    # What _run_traced does to a key argument that dynamic=True made symbolic: a plain int in the trace (the
    # config lookup takes constants), with a guard, so a new value traces again and a seen one does not.
    from kernels._autotune import _specialized

    seen = []

    @torch.compiler.assume_constant_result
    def lookup(n: int) -> int:
        seen.append(n)
        return 2 * n

    compiled = torch.compile(lambda x: x * lookup(_specialized(x.shape[0])), fullgraph=True, dynamic=True,
                             backend="eager")
    for n in (3, 5, 3):
        torch.testing.assert_close(compiled(torch.ones(n)), torch.full((n,), 2.0 * n))
    assert seen == [3, 5]
    assert _specialized(True) is True and _specialized("x") == "x"


@pytest.mark.interpreter
def test_a_config_that_faults_the_gpu_while_checked_stops_an_in_process_search_with_it_named(monkeypatch) -> None:
    """``python -m tuner search --workers 0`` checks each candidate in its own process: a fault there is not a wrong
    config to skip (every later candidate would fail in the lost context). The lost context is stood in for as in
    the test above (torch's own functions; interpreter only); BLOCK=24 fails as Triton builds it, and the check
    that follows finds the context gone. In a timing worker the worker exits instead (tuner/workers.py's exit
    code, which its parent reads as a lost candidate)."""
    from tuner.autotune_search import evaluate

    tuner = kernels.autotune(configs=[triton.Config({"BLOCK": 16}), triton.Config({"BLOCK": 24})], key=["n"],
                             inputs=_kernels.inputs, do_bench=FakeTimer(), mode="off",
                             name="tests.autotune_tests.faulty_in_search")(_faulty)
    assert evaluate("unused", "n=10;float32,float32", "BLOCK: 16, num_warps: 4, num_stages: 3", tuner) == 1.0
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)

    def lost_context_synchronize(device=None) -> None:
        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(torch.cuda, "synchronize", lost_context_synchronize)
    with pytest.raises(AutotuneError, match=r"checking config BLOCK: 24\b.*CUDA context is lost.*--workers 0"):
        evaluate("unused", "n=10;float32,float32", "BLOCK: 24, num_warps: 4, num_stages: 3", tuner)
