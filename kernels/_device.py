"""Which GPU this process sees, its canonical name and short alias, and matching a user's --device."""

from __future__ import annotations

import functools
import os
import re

from ._spec import DeviceInfo

# Short family names users type, matched against the canonical name the driver reports.
# The first pattern that matches names the family; word boundaries keep "A10" off "A100".
_ALIASES: tuple[tuple[str, str], ...] = (
    ("h200", r"\bH200\b"),
    ("h100", r"\bH100\b"),
    ("h800", r"\bH800\b"),
    ("gh200", r"\bGH200\b"),
    ("b200", r"\bB200\b"),
    ("a100", r"\bA100\b"),
    ("a800", r"\bA800\b"),
    ("a10g", r"\bA10G\b"),
    ("a10", r"\bA10\b"),
    ("l40s", r"\bL40S\b"),
    ("l40", r"\bL40\b"),
    ("l4", r"\bL4\b"),
    ("v100", r"\bV100\b"),
    ("t4", r"\bT4\b"),
    ("rtx4090", r"RTX 4090"),
    ("rtx3090", r"RTX 3090"),
    ("mi300x", r"MI300X"),
)

CPU = DeviceInfo(name="cpu", alias="cpu", compute_capability="", sm_count=4,
                 shared_memory_bytes=232_448)  # the H100's limit, so constraints prune the same way on CPU


# The most shared memory one block may opt in to, per compute capability (the CUDA C++ Programming Guide's
# table of technical specifications): what a config's buffers must fit in on a GPU this process does not see.
OPT_IN_SHARED_MEMORY = {"7.0": 98_304, "7.5": 65_536, "8.0": 166_912, "8.6": 101_376, "8.7": 166_912,
                        "8.9": 101_376, "9.0": 232_448, "10.0": 232_448}


def described_device(name: str, compute_capability: str, sm_count: int) -> DeviceInfo:
    """A GPU known from its records (a shipped table, a database), not from this machine: its shared memory
    is its compute capability's opt-in limit (OPT_IN_SHARED_MEMORY; 99 KiB where the capability is not listed)."""
    return DeviceInfo(name=name, alias=alias_of(name), compute_capability=compute_capability, sm_count=sm_count,
                      shared_memory_bytes=OPT_IN_SHARED_MEMORY.get(compute_capability, 101_376))


def alias_of(name: str) -> str:
    """The short family name of a canonical GPU name ("NVIDIA H100 80GB HBM3" → "h100")."""
    if name == "cpu":
        return "cpu"
    for alias, pattern in _ALIASES:
        if re.search(pattern, name):
            return alias
    # Unknown card: a stable slug of its name still keys the database correctly.
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-")


def interpreter_enabled() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


# The package's one reading, at import: triton decides interpreter or compiler when it is imported, so this
# cannot change later. Modules read ``_device.INTERPRETED`` per call (a test may set it).
INTERPRETED = interpreter_enabled()


@functools.lru_cache(maxsize=None)
def _gpu_info(index: int) -> DeviceInfo:
    import torch

    props = torch.cuda.get_device_properties(index)
    smem = getattr(props, "shared_memory_per_block_optin", 0) or 101_376
    return DeviceInfo(name=props.name, alias=alias_of(props.name),
                      compute_capability=f"{props.major}.{props.minor}",
                      sm_count=props.multi_processor_count, shared_memory_bytes=int(smem))


def current_device(torch_device: object | None = None) -> DeviceInfo:
    """The device this process computes on: the CUDA device in use, or ``cpu`` under the interpreter."""
    import torch

    if torch_device is not None:
        dev = torch.device(torch_device)
        if dev.type == "cpu":
            return CPU
        return _gpu_info(dev.index if dev.index is not None else torch.cuda.current_device())
    if interpreter_enabled() or not torch.cuda.is_available():
        return CPU
    return _gpu_info(torch.cuda.current_device())


def resolve_device(requested: str) -> DeviceInfo:
    """Match ``--device`` (an alias, a canonical name, ``auto`` or ``cpu``) to the device in use.

    Refuses a mismatch: a result measured on one GPU must never be stored under another's name.
    """
    import torch

    wanted = requested.strip()
    if wanted.lower() == "cpu":
        if not interpreter_enabled():
            raise ValueError("--device cpu runs kernels under Triton's interpreter; "
                             "set TRITON_INTERPRET=1 before triton is imported (the CLI does this for you)")
        return CPU
    if interpreter_enabled():
        raise ValueError(f"--device {requested} names a GPU, but TRITON_INTERPRET=1 runs kernels on the CPU; "
                         "unset TRITON_INTERPRET or pass --device cpu")
    if not torch.cuda.is_available():
        raise ValueError(f"--device {requested} names a GPU, but this process sees none; "
                         "pass --device cpu to run the pipeline under Triton's interpreter")
    here = _gpu_info(torch.cuda.current_device())
    if wanted.lower() == "auto":
        return here
    if wanted.lower() in (here.alias, here.name.lower()):
        return here
    raise ValueError(f"--device {requested} does not match this GPU, {here.name} ({here.alias}); "
                     f"pass --device {here.alias} or run on a {requested}")


def cuda_context_lost() -> bool:
    """Whether this process's CUDA context took a sticky fault (an illegal address, a device-side assert), after
    which every CUDA call in the process fails: a bare synchronize tells. A context never started (the
    interpreter's CPU runs) has nothing to lose, and asking would start one."""
    import torch

    if not torch.cuda.is_initialized():
        return False
    try:
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - any error of a bare synchronize is the context's
        return True
    return False
