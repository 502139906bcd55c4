"""The tuner's errors that callers act on: the user's mistakes, and a GPU that faulted under a candidate."""

from __future__ import annotations

# A worker process whose GPU context faulted exits with this status (EX_TEMPFAIL): the GPU itself is fine
# once the process is gone, so `search --gpus` starts a fresh worker on it.
DEVICE_FAULT_EXIT = 75


class UserError(Exception):
    """A mistake the user can fix; the CLI prints it without a traceback and exits 2."""


class DeviceFault(RuntimeError):
    """A candidate faulted the GPU (an illegal address, a device-side assert) in this process. Its CUDA context
    is broken for good: every later call here would fail too, so the process must stop, and the job go on in
    another one."""


def device_faulted() -> bool:
    """Whether this process's CUDA context took a sticky fault. PyTorch raises the fault as an error and the
    process lives on, but every later CUDA call in it fails; a bare synchronize tells."""
    from kernels._device import cuda_context_lost

    return cuda_context_lost()


def is_device_fault(exc: BaseException) -> bool:
    """Whether ``exc`` is the GPU's (a CUDA error, an illegal address, a device-side assert), not the job's."""
    text = str(exc)
    return "CUDA error" in text or "device-side assert" in text or "illegal memory access" in text \
        or type(exc).__name__ == "AcceleratorError"


def broke_the_context(exc: BaseException) -> bool:
    """Whether ``exc`` left this process unable to use its GPU. Where a GPU runs, a synchronize tells (a CUDA
    error that is not sticky, such as a launch refused for its arguments, leaves the context sound); under the
    interpreter or without a GPU there is no context to ask, and the error's text is all there is."""
    import torch

    import kernels

    if torch.cuda.is_available() and not kernels.interpreter_enabled():
        return device_faulted()
    return is_device_fault(exc)
