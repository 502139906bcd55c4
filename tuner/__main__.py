import logging
import os
import sys

from .cli import main


def _exit(code: int) -> None:
    """End the process without the interpreter's teardown, once what an exit must do is done.

    The teardown (torch's, triton's and CUDA's finalizers, module by module) took 1.7 s of a process with the
    tuner's imports on the CPU build machine (2026-11-28, torch 2.13.0+cpu, triton 3.6.0: a script importing
    them, timed from its last line to its exit, against 0.06 s with ``os._exit``). A fleet run pays it in each
    GPU worker and then in itself: on H200s its exit took 4-7 s after its last job (docs/FLEET.md; that the
    teardown is most of it is inferred, not timed there). Nothing of ours needs it: pools, leases and stores
    are closed by the commands; what atexit would still do is here, record mode's last counts and the
    logs' and outputs' buffers."""
    recorder = sys.modules.get("kernels._record_mode")
    if recorder is not None:  # what its atexit hook does (a recording never started has nothing to write)
        recorder.RECORDER.flush()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":  # spawned worker processes import this module too; they must not run the CLI
    _exit(main())
