"""The worker processes of ``search --gpus``: one ``python -m tuner worker`` per GPU of this host.

Torch-free but for counting GPUs, so that ``python -m tuner search --gpus`` starts its workers before it imports
kernels, triton and optuna: a worker's start-up (Python, torch, the CUDA context, its compile workers) then
overlaps the run's own instead of following it. On a 4-GPU H200 host each side took about 9-12 s, one after the
other, before a run's first claim (docs/FLEET.md, 2026-11-28, torch 2.11.0+cu130, triton 3.6.0, ``gpu_session.sh fleet-scale``). Workers started so early are *gated*: they import
and start up, then wait for the run's word (a line on their stdin) before they open the database, so that a run
that stops on bad input (a typo in --problems) creates nothing; a run that ends without the word closes their
stdin and they exit.
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys
import time
from collections.abc import Sequence

from db.queue import DEFAULT_LEASE_S

from .errors import UserError

# When ``spawn_gpu_workers`` started the process (a Unix time): the worker says how long its start-up took.
SPAWNED_AT_ENV = "TUNER_SPAWNED_AT"
# The worker flag that makes it wait for GO_LINE on its stdin before it opens the database.
GATE_FLAG = "--after-go"
GO_LINE = "go\n"


def lease_seconds(args: argparse.Namespace) -> float:
    """--lease, checked (finite, > 0), or the default when not given."""
    if args.lease is None:
        return DEFAULT_LEASE_S
    if not (math.isfinite(args.lease) and args.lease > 0):
        raise UserError(f"--lease {args.lease:g}: give the seconds a claimed job stays a worker's without a "
                        f"heartbeat, a finite number above 0 (default {DEFAULT_LEASE_S:.0f})")
    return args.lease


def gpu_list(args: argparse.Namespace, count: bool = True) -> list[str] | None:
    """--gpus as GPU indices (None without it), checked against the GPUs this host has; without ``count``,
    indices are checked for their form alone, which needs no torch (``all`` is counted either way)."""
    if not args.gpus:
        return None
    on_cpu = str(getattr(args, "device", "")).strip().lower() == "cpu"  # indices label CPU workers
    try:
        if on_cpu or (not count and args.gpus != "all"):
            return parse_gpus(args.gpus, None)
        import torch  # torch alone: it counts the GPUs without a CUDA context, and imports no triton

        return parse_gpus(args.gpus, torch.cuda.device_count())
    except ValueError as exc:
        raise UserError(str(exc)) from None


def worker_flags(args: argparse.Namespace) -> list[str]:
    """The flags a run passes on to its workers: its lease, and its --workers, else its --ahead as the compile
    processes each worker starts (a search keeps no more than --ahead candidates compiling)."""
    ahead = getattr(args, "ahead", None)
    workers = args.workers if args.workers is not None else None if ahead is None else max(1, ahead)
    return ["--lease", str(lease_seconds(args))] + (["--workers", str(workers)] if workers is not None else [])


def parse_gpus(text: str, visible: int | None) -> list[str]:
    """``all`` or ``0,2``: the indices, among the ``visible`` GPUs this process sees, to start workers on
    (ValueError names a bad one: not a number, repeated, or past the GPUs visible). ``visible`` None: CPU
    workers (``--device cpu``), where an index only labels a worker and is not checked against a GPU."""
    if text == "all":
        if not visible:
            raise ValueError("--gpus all found no GPU on this host; pass --device cpu without --gpus, "
                             "or run where GPUs are visible")
        return [str(index) for index in range(visible)]
    indices = [part.strip() for part in text.split(",") if part.strip()]
    if not indices or not all(part.isdigit() for part in indices):
        raise ValueError(f"--gpus {text!r} must be 'all' or GPU indices such as 0,2")
    if len(set(map(int, indices))) != len(indices):
        raise ValueError(f"--gpus {text!r} names a GPU twice; name each once (two workers on one GPU time each other)")
    missing = [] if visible is None else [index for index in indices if int(index) >= visible]
    if missing:
        raise ValueError(f"--gpus {text!r}: this process sees {visible} GPU(s), numbered from 0, so "
                         f"{', '.join(missing)} is not one; pass --gpus all or indices under {visible}")
    return [str(int(index)) for index in indices]


def child_visible_devices(gpu: str, parent: str | None) -> str:
    """The CUDA_VISIBLE_DEVICES of the worker for ``gpu``, an index among the GPUs this process sees: where
    this process itself sees a subset (its own CUDA_VISIBLE_DEVICES, e.g. "2,3"), index 0 is that list's
    first entry, not the host's GPU 0."""
    if parent is None or not parent.strip():
        return gpu
    entries = [entry.strip() for entry in parent.split(",") if entry.strip()]
    index = int(gpu)
    return entries[index] if index < len(entries) else gpu


def started_s_ago() -> float | None:
    """Seconds since this process was spawned as a GPU worker (None when it was not)."""
    try:
        return time.time() - float(os.environ[SPAWNED_AT_ENV])
    except (KeyError, ValueError):
        return None


# A spawned worker's start-up, phase by phase: (name, seconds since its spawn when the phase ended). Its ready
# line gives each phase's share, so that a fleet run says where the seconds before its first claim go.
START_PHASES: list[tuple[str, float]] = []


def phase_done(name: str) -> None:
    """Note that start-up phase ``name`` ended now (nothing where this process was not spawned as a worker)."""
    since = started_s_ago()
    if since is not None:
        START_PHASES.append((name, since))


def start_phases_line() -> str:
    """'NAME S s, NAME S s, ...': each noted phase's own seconds, in order ('' where none was noted)."""
    parts, before = [], 0.0
    for name, since in START_PHASES:
        parts.append(f"{name} {since - before:.1f} s")
        before = since
    return ", ".join(parts)


def spawn_gpu_workers(url: str, gpus: Sequence[str], device_arg: str, extra: Sequence[str] = (),
                      log_dir: str | None = None, gated: bool = False) -> list[subprocess.Popen]:
    """One ``python -m tuner worker`` process per GPU, each seeing only its GPU (CUDA_VISIBLE_DEVICES).
    ``gated``: each waits for ``say_go`` before it opens the database."""
    processes = []
    for gpu in gpus:
        env = dict(os.environ, CUDA_VISIBLE_DEVICES=child_visible_devices(gpu, os.environ.get("CUDA_VISIBLE_DEVICES")),
                   **{SPAWNED_AT_ENV: repr(time.time())})
        argv = [sys.executable, "-m", "tuner", "worker", "--db", url, "--device", device_arg, *extra,
                *([GATE_FLAG] if gated else [])]
        out = open(os.path.join(log_dir, f"worker-gpu{gpu}.log"), "w") if log_dir else None
        processes.append(subprocess.Popen(argv, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                                          stdin=subprocess.PIPE if gated else None, text=gated or None))
    return processes


def say_go(processes: Sequence[subprocess.Popen]) -> None:
    """Let gated workers open the database (a worker that already died is left to the caller's watch)."""
    for process in processes:
        if process.stdin is not None and not process.stdin.closed:
            try:
                process.stdin.write(GO_LINE)
                process.stdin.close()
            except (BrokenPipeError, OSError):
                pass


def call_off(processes: Sequence[subprocess.Popen]) -> None:
    """Gated workers that never got the word: closing their stdin ends them once their start-up is done (they
    then close their own compile workers, which a kill would orphan), and they touch no database. Not waited
    for: a run that stops on bad input says so at once."""
    for process in processes:
        if process.stdin is not None and not process.stdin.closed:
            try:
                process.stdin.close()
            except OSError:
                pass


def wait_for_go() -> bool:
    """In a gated worker: whether the run said go (False: it ended first, and this worker should exit)."""
    return sys.stdin.readline() == GO_LINE


def started_early(args: argparse.Namespace) -> list[subprocess.Popen]:
    """``search --gpus``'s workers, gated, started before the run imports anything heavy (``[]`` without --gpus),
    torch included where --gpus names indices: its import (1.2 s on the CPU build machine, torch 2.13.0+cpu,
    2026-11-29, ``python -X importtime -c 'import torch'``) then overlaps the workers' start-up instead of delaying it. A malformed --gpus or --lease raises
    UserError before any process starts; an index past this host's GPUs raises it once they have started, and
    they are called off (gated, they touch no database)."""
    gpus = gpu_list(args, count=False)
    if not gpus:
        return []
    from db.store import default_url

    started = spawn_gpu_workers(args.db or default_url(), gpus, args.device, worker_flags(args), gated=True)
    try:
        gpu_list(args)
    except UserError:
        call_off(started)
        raise
    return started
