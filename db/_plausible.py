"""Whether a record could be true: one home for the rules that import, the store, search and dispatch share.

A record travels between machines, and the default conflict rule keeps the faster one, so a forged
or damaged record (``time_ms: 1e-300``) would take over every machine that imports it. The rules:

* it agrees with itself: its TFLOP/s follow from its problem and its time, and its key from its shapes;
* it does not beat the device: no time under what its FLOPs need at the device's peak tensor-core
  rate, or its bytes at the device's peak memory bandwidth (within ``_MARGIN``);
* its sizes are bounded and its names have their format.

``plausibility_problems`` takes a ``Record`` or the raw fields of one (a JSON record, a row) and
returns every reason it is implausible; empty means plausible. It never raises.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ._record import Record


@dataclass(frozen=True)
class DevicePeak:
    """Peak dense rates of one GPU family, from its vendor datasheet (``source``)."""

    pattern: str  # a case-insensitive substring of the canonical device name; the first match wins
    half_tflops: float  # fp16/bf16 tensor cores, dense (datasheets quote 2x "with sparsity")
    tf32_tflops: float  # fp32 matmuls run as TF32 on tensor cores
    bandwidth_gbs: float  # device memory, GB/s
    source: str


# Most specific first ("H100 PCIe" before "H100", "A100" before "A10", "L40S" before "L40" before "L4").
PEAKS: tuple[DevicePeak, ...] = (
    DevicePeak("H100 PCIe", 756.0, 378.0, 2000.0, "NVIDIA H100 Tensor Core GPU datasheet (PCIe), 2023"),
    DevicePeak("H100 NVL", 835.0, 418.0, 3900.0, "NVIDIA H100 Tensor Core GPU datasheet (NVL), 2023"),
    DevicePeak("H100", 989.0, 495.0, 3350.0, "NVIDIA H100 Tensor Core GPU datasheet (SXM5), 2023"),
    DevicePeak("H200", 989.0, 495.0, 4800.0, "NVIDIA H200 Tensor Core GPU datasheet (SXM), 2024"),
    DevicePeak("B200", 2250.0, 1100.0, 8000.0, "NVIDIA HGX B200 datasheet, per GPU, sparsity halved, 2024"),
    DevicePeak("A100", 312.0, 156.0, 2039.0, "NVIDIA A100 Tensor Core GPU datasheet (80GB SXM), 2021"),
    DevicePeak("A10", 125.0, 62.5, 600.0, "NVIDIA A10 Tensor Core GPU datasheet, 2021"),
    DevicePeak("L40S", 362.0, 183.0, 864.0, "NVIDIA L40S datasheet, 2023"),
    DevicePeak("L40", 181.0, 90.5, 864.0, "NVIDIA L40 datasheet, 2022"),
    DevicePeak("L4", 121.0, 60.0, 300.0, "NVIDIA L4 Tensor Core GPU datasheet, 2023"),
)
# A GPU not in the table (or the CPU interpreter) gets twice the fastest known GPU's peaks: loose
# enough for any device of the next few years, tight enough to refuse 1e300 TFLOP/s.
UNKNOWN = DevicePeak("", 2 * max(p.half_tflops for p in PEAKS), 2 * max(p.tf32_tflops for p in PEAKS),
                     2 * max(p.bandwidth_gbs for p in PEAKS), "twice the fastest GPU in PEAKS")
# A time may be this many times under the floor before it is refused: small problems are partly
# served from L2 (50 MB on an H100) in a graph replay, and datasheet peaks are rounded.
_MARGIN = 4.0
# TFLOP/s are recomputed from the problem and time; exports round-trip floats exactly, so only
# hand-edited tables differ, and then by rounding.
_TFLOPS_RELATIVE = 0.01
_TFLOPS_ABSOLUTE = 0.01
_ELEMENT_BYTES = {"fp16": 2, "bf16": 2, "fp32": 4}

# Bounds: far above any real problem, far below what breaks memory or the table's columns.
MAX_DIM = 2**24  # one of M, N, K (16.7M); a 10^12 dimension is a typo or an attack
MAX_OPERAND = 2**36  # elements in one operand (128 GiB at fp16: more than any GPU holds)
MAX_GEMMS = 4096  # GEMMs in one grouped problem
MAX_KEY_CHARS = 65536
MAX_CONFIG_ENTRIES = 64
MAX_CONFIG_INT = 2**31
MAX_SM_COUNT = 4096
MAX_TRIALS = 10**7
_NAME = re.compile(r"[\x20-\x7e]{1,255}")  # device_name: printable ASCII, as drivers report it
_ALIAS = re.compile(r"[a-z0-9][a-z0-9_+-]{0,63}")  # "h100", "rtx4090": no dots, slashes or spaces
_KERNEL = re.compile(r"[a-z][a-z0-9_]{0,63}")
# A user kernel (kernels.autotune) is named by its module and qualified name: my_pkg.my_mod.softmax_kernel.
_USER_KERNEL = re.compile(r"[A-Za-z_][A-Za-z0-9_.]{0,127}")
USER = "any"  # the dtype and layout of a user kernel's record
_CAPABILITY = re.compile(r"(\d{1,2}\.\d{1,2})?")  # "9.0"; "" for the CPU
_VERSION = re.compile(r"[\x21-\x7e]{0,64}")  # "2.11.0+cu130"; "" for CUDA on the CPU
_PARAM = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
_CONFIG_TEXT = re.compile(r"[A-Za-z0-9_.+-]{1,64}")  # a string value: "tiled", "cublas"


def peak_of(device_name: str) -> DevicePeak:
    """The peaks of ``device_name`` (canonical name), or ``UNKNOWN``'s conservative ones."""
    lowered = device_name.lower()
    for peak in PEAKS:
        if peak.pattern.lower() in lowered:
            return peak
    return UNKNOWN


def plausibility_problems(record: Record | Mapping[str, Any]) -> list[str]:
    """Every reason ``record`` could not be a true measurement; empty if it could."""
    fields = vars(record) if isinstance(record, Record) else record
    if not isinstance(fields, Mapping):
        return [f"a record must be an object, got {type(fields).__name__}"]
    if fields.get("dtype") == USER:
        return _user_problems(fields)
    problems = _format_problems(fields)
    shapes = _shapes(fields.get("shapes"))
    if shapes is None:
        return problems + ["shapes must be a non-empty list of [M, N, K] integer triples"]
    problems += _size_problems(shapes)
    if problems:
        return problems  # the timing rules below need sane sizes
    problems += _key_problems(fields, shapes)
    problems += _timing_problems(fields, shapes)
    return problems


def _user_problems(fields: Mapping[str, Any]) -> list[str]:
    """A user kernel's record: no FLOP count is known, so only the format and the time bounds apply."""
    problems = [p for p in _format_problems(fields) if not p.startswith("kernel ")]
    kernel = fields.get("kernel")
    if not isinstance(kernel, str) or not _USER_KERNEL.fullmatch(kernel):
        problems.append(f"kernel must be a dotted Python name of up to 128 characters; got {_show(kernel)}")
    key = fields.get("problem_key")
    if not isinstance(key, str) or len(key) > MAX_KEY_CHARS or "@" not in key:
        problems.append(f"problem_key of a user kernel must read KEY@SOURCE_HASH; got {_show(key)}")
    if fields.get("layout") != USER:
        problems.append(f"layout of a user kernel's record must be {USER!r}; got {_show(fields.get('layout'))}")
    time_ms = fields.get("time_ms")
    if not _is_number(time_ms) or not 0 < time_ms <= _MAX_USER_MS:
        problems.append(f"time_ms must be above 0 and at most {_MAX_USER_MS:g} ms; got {_show(time_ms)}")
    return problems


# A kernel call of over a minute is not one a tuner times: such a record is a unit slip (seconds as ms) or damage.
_MAX_USER_MS = 60_000.0


def check_plausible(records: Sequence[Record]) -> None:
    """Raise ValueError naming the first implausible record and why: such a record is never stored."""
    for record in records:
        problems = plausibility_problems(record)
        if problems:
            raise ValueError(f"{record.device_alias} {record.kernel} {_show(record.problem_key)} is not "
                             f"plausible, so nothing was stored: {'; '.join(problems)}")


def _format_problems(fields: Mapping[str, Any]) -> list[str]:
    checks = (("device_name", _NAME, "printable ASCII, 1 to 255 characters"),
              ("device_alias", _ALIAS, "lowercase letters, digits, '_', '+' or '-', 1 to 64, e.g. h100"),
              ("kernel", _KERNEL, "a lowercase identifier, e.g. matmul"),
              ("compute_capability", _CAPABILITY, "MAJOR.MINOR, e.g. 9.0, or empty"),
              ("torch_version", _VERSION, "up to 64 printable characters"),
              ("triton_version", _VERSION, "up to 64 printable characters"),
              ("cuda_version", _VERSION, "up to 64 printable characters"))
    problems = []
    for name, pattern, wanted in checks:
        value = fields.get(name)
        if not isinstance(value, str) or not pattern.fullmatch(value):
            problems.append(f"{name} must be {wanted}; got {_show(value)}")
    for name, limit in (("sm_count", MAX_SM_COUNT), ("trials", MAX_TRIALS)):
        value = fields.get(name)
        if not _is_int(value) or not 0 <= value <= limit:
            problems.append(f"{name} must be an integer from 0 to {limit}; got {_show(value)}")
    for name in ("config", "triton_config"):
        problems += [f"{name} {problem}" for problem in _config_problems(fields.get(name))]
    return problems


def _config_problems(config: Any) -> list[str]:
    if config is None:
        return []
    if not isinstance(config, Mapping) or len(config) > MAX_CONFIG_ENTRIES:
        return [f"must be an object of at most {MAX_CONFIG_ENTRIES} parameters; got {_show(config)}"]
    problems = []
    for name, value in config.items():
        if not isinstance(name, str) or not _PARAM.fullmatch(name):
            problems.append(f"parameter name {_show(name)} must be an identifier of up to 64 characters")
        elif isinstance(value, str) and not _CONFIG_TEXT.fullmatch(value):
            problems.append(f"{name} {_show(value)} must be 1 to 64 letters, digits or _.+-")
        elif _is_int(value) and abs(value) > MAX_CONFIG_INT:
            problems.append(f"{name} {value} is beyond +-{MAX_CONFIG_INT}")
    return problems


def _shapes(value: Any) -> list[tuple[int, int, int]] | None:
    if not isinstance(value, (list, tuple)) or not value:
        return None
    shapes = []
    for shape in value:
        if not isinstance(shape, (list, tuple)) or len(shape) != 3 or not all(_is_int(d) and d >= 0 for d in shape):
            return None
        shapes.append((shape[0], shape[1], shape[2]))
    return shapes


def _size_problems(shapes: list[tuple[int, int, int]]) -> list[str]:
    if len(shapes) > MAX_GEMMS:
        return [f"a group of {len(shapes)} GEMMs is more than {MAX_GEMMS}"]
    for m, n, k in shapes:
        if max(m, n, k) > MAX_DIM:
            return [f"shape {m}x{n}x{k} has a dimension over {MAX_DIM}"]
        if max(m * k, k * n, m * n) > MAX_OPERAND:
            return [f"shape {m}x{n}x{k} has an operand of more than {MAX_OPERAND} elements"]
    return []


def _key_problems(fields: Mapping[str, Any], shapes: list[tuple[int, int, int]]) -> list[str]:
    key = fields.get("problem_key")
    if not isinstance(key, str) or len(key) > MAX_KEY_CHARS:
        return [f"problem_key must be a string of at most {MAX_KEY_CHARS} characters; got {_show(key)}"]
    dims = "+".join(f"{m}x{n}x{k}" for m, n, k in shapes)
    wanted = f"{fields.get('dtype')}:{fields.get('layout')}:{dims}"
    if key != wanted:
        return [f"problem_key {_show(key)} does not match its dtype, layout and shapes ({_show(wanted)})"]
    return []


def _timing_problems(fields: Mapping[str, Any], shapes: list[tuple[int, int, int]]) -> list[str]:
    flops = float(sum(2 * m * n * k for m, n, k in shapes))
    element = _ELEMENT_BYTES.get(str(fields.get("dtype")), 4)
    # A GEMM with no rows moves nothing: grouped and MoE kernels skip an empty expert's weights, and a decode
    # step of a 128-expert model routes its few rows to a handful of them. Counting all 128 experts refused a
    # measured record (8 rows, H200, 2026-11-28, torch 2.11.0+cu130, triton 3.6.0, ``tuner search --recorded`` of Qwen3-30B-A3B: 0.033 ms
    # where the rule asked at least 0.042 ms).
    bytes_moved = float(sum((m * k + k * n + m * n) * element for m, n, k in shapes if m > 0))
    peak = peak_of(str(fields.get("device_name", "")))
    rate = peak.tf32_tflops if fields.get("dtype") == "fp32" else peak.half_tflops
    floor_ms = max(flops / (rate * 1e12), bytes_moved / (peak.bandwidth_gbs * 1e9)) * 1e3 / _MARGIN
    problems = []
    for name in ("time_ms", "cublas_ms", "triton_ms"):
        value = fields.get(name)
        if value is None and name != "time_ms":
            continue
        if not _is_number(value) or value < 0:
            problems.append(f"{name} must be a finite number >= 0; got {_show(value)}")
        elif value < floor_ms or (value == 0 and flops > 0):
            problems.append(f"{name} {value:.4g} ms is faster than {peak_of_text(peak)} allows for this "
                            f"problem ({floor_ms * _MARGIN:.4g} ms at peak, {_MARGIN:g}x margin); "
                            "re-measure it or drop the record")
    time_ms, tflops = fields.get("time_ms"), fields.get("tflops")
    if not _is_number(tflops) or tflops < 0:
        problems.append(f"tflops must be a finite number >= 0; got {_show(tflops)}")
    elif _is_number(time_ms) and time_ms > 0:
        implied = flops / (time_ms * 1e-3) / 1e12
        if abs(tflops - implied) > max(_TFLOPS_ABSOLUTE, _TFLOPS_RELATIVE * implied):
            problems.append(f"tflops {tflops:.6g} does not follow from the problem and time_ms "
                            f"{time_ms:.6g} ({implied:.6g} TFLOP/s); the record contradicts itself")
    return problems


def peak_of_text(peak: DevicePeak) -> str:
    if peak is UNKNOWN:
        return "any known GPU"
    return f"a {peak.pattern} ({peak.half_tflops:g} TFLOP/s, {peak.bandwidth_gbs:g} GB/s)"


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return (_is_int(value) or isinstance(value, float)) and math.isfinite(value)


def _show(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:39] + "…"
