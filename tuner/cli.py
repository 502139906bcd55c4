"""``python -m tuner``: a thin layer that parses, calls one library function, prints.

Errors that the user can fix (a bad --device, a broken import file, a malformed shape) are printed
as one message without a traceback, and the exit code is 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

from db import StoreError  # torch- and triton-free: safe before the interpreter switch

from .errors import DEVICE_FAULT_EXIT, DeviceFault, UserError  # UserError re-exported: tests import it from here

if TYPE_CHECKING:
    from .workers import CheckPool

# tuner.corpus.PARTS, spelled here: importing tuner.corpus imports kernels (torch, triton) before main() can
# switch the interpreter on (a test keeps the two equal).
CORPUS_PARTS = ("all", "tuned", "held_out", "unseen")

log = logging.getLogger("tuner")


def _wants_cpu(device: str) -> bool:
    if device.lower() == "cpu":
        return True
    if device.lower() != "auto":
        return False
    import torch  # torch does not import triton, so the interpreter switch below still takes effect

    return not torch.cuda.is_available()


def _prepare_device(device: str) -> None:
    """Turn on Triton's interpreter for --device cpu before anything imports triton."""
    if _wants_cpu(device):
        if "triton" in sys.modules and os.environ.get("TRITON_INTERPRET") != "1":
            raise UserError("--device cpu needs TRITON_INTERPRET=1 before triton is imported; "
                            "set it in the environment")
        os.environ["TRITON_INTERPRET"] = "1"


def _gpu_likely(device: str) -> bool:
    """Whether this process will run on a GPU, told without importing torch: a named GPU, or "auto" on a host with
    NVIDIA's driver where CUDA_VISIBLE_DEVICES leaves a GPU visible. A wrong guess costs only time: the command
    closes a pool it does not need, or starts its own later (tuner/workers.py ``take_pool``)."""
    if device.lower() == "cpu":
        return False
    if device.lower() != "auto":
        return True
    return os.environ.get("CUDA_VISIBLE_DEVICES", "0").strip() not in ("", "-1") and os.path.exists("/dev/nvidiactl")


def _early_pool(args: argparse.Namespace) -> CheckPool | None:
    """The compile and timing processes of a search or worker that checks candidates on a GPU, started before
    this process imports torch, triton and optuna (5-7 s of a fleet worker's start-up on 2 H200s), so that their own
    imports and CUDA contexts overlap it instead of following it. On one H200 the gain was not measurable: the first
    job's compile waits were 5.7-7.1 s against 6.8 s before, the first compiles themselves remaining (docs/FLEET.md,
    2026-11-29, torch 2.11.0+cu130, triton 3.6.0). None where no pool would be used."""
    if args.command not in ("search", "worker") or args.workers == 0 or not _gpu_likely(args.device):
        return None
    if args.command == "search" and (args.gpus or (args.kernel and ":" in args.kernel)):
        return None  # the workers it starts tune, or a user kernel's search, which starts its own
    from .workers import DEFAULT_AHEAD, CheckPool, search_workers

    pool = CheckPool(args.workers or search_workers(getattr(args, "ahead", DEFAULT_AHEAD)))
    pool.start()
    return pool


class _Parser(argparse.ArgumentParser):
    """argparse, but a usage error is one line (the CLI's rule for every user error), exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"error: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m tuner",
                                     description="Tune Triton kernels per GPU and keep the winners in a database.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what the library does")
    sub = parser.add_subparsers(dest="command", required=True)

    def with_db(p: argparse.ArgumentParser) -> argparse.ArgumentParser:
        p.add_argument("--db", default=None,
                       help="SQLAlchemy URL of the database (default: $TUNER_DB or a SQLite file in the cache dir)")
        return p

    sub.add_parser("devices", help="the GPU this process sees, with its canonical name and alias")

    s = with_db(sub.add_parser("search", help="tune problems and store the winners"))
    s.add_argument("--device", default="auto",
                   help="alias (h100), canonical name, 'auto' (this GPU, or cpu without one) or 'cpu'")
    s.add_argument("--kernel", default=None,
                   help="kernel family: matmul (default), grouped_matmul, moe_matmul, moe_gated_matmul, matmul_bias or "
                        "gated_matmul")
    s.add_argument("--dtype", action="append", help="fp16, bf16 or fp32 (repeatable; default fp16)")
    s.add_argument("--layout", action="append",
                   help="operand layout, A then B: nn (row-major) or nt (B = w.t()); repeatable; default nn")
    s.add_argument("--shape", action="append",
                   help="MxNxK (repeatable); a group (grouped_matmul, moe_matmul, moe_gated_matmul: N the output's "
                        "width) joins GEMMs with '+': 128x128x128+64x64x64")
    s.add_argument("--corpus", choices=CORPUS_PARTS, default=None,
                   help="the real-model corpus (benchmarks/corpus/models.json) or one part of its split, or "
                        "unseen: the models outside it (benchmarks/corpus/unseen.json); --dtype narrows it")
    s.add_argument("--trials", type=int, default=40, help="measured trials per problem (default 40)")
    s.add_argument("--timeout", type=float, default=None, help="seconds per problem (default: none)")
    s.add_argument("--budget", action="append", default=None, metavar="N|Ns",
                   help="per problem: N measured trials, or Ns seconds (30s); repeat for both, the first "
                        "reached ends the sampling (the contests that pick the winners follow); replaces "
                        "--trials and --timeout")
    s.add_argument("--sampler", default="tpe", help="tpe (default), random, gp or cmaes")
    s.add_argument("--seed", type=int, default=None, help="sampler seed, for reproducible searches")
    s.add_argument("--workers", type=int, default=None,
                   help="processes that compile and check candidates in parallel on a GPU (default: --ahead, as many "
                        "as are ever in flight; 0: in-process)")
    s.add_argument("--no-shipped", action="store_true",
                   help="do not start from the tables shipped in the package (with a fresh --db: what the "
                        "search finds by itself, for measuring it)")
    s.add_argument("--ahead", type=int, default=4,
                   help="new configs compiling at once ahead of the timer (default 4; more is faster to "
                        "compile but the sampler learns less between asks)")
    s.add_argument("--eager-passes", type=int, default=3,
                   help="side-by-side contests an eager Triton winner must win in all, 2 s apart, against "
                        "cuBLAS and torch.matmul (default 3; 1 decides on one contest, one phase of the host)")

    s.add_argument("--recorded", action="store_true",
                   help="tune what record mode (TUNER_RECORD=1) saw on this device and is not tuned yet, "
                        "the problems that took the most work first")
    s.add_argument("--problems", default=None, metavar="FILE",
                   help="tune the problems listed in FILE (docs/FLEET.md: one 'kernel dtype:layout:shape "
                        "[weight]' per line)")
    s.add_argument("--gpus", default=None, metavar="all|0,2",
                   help="start one worker process per GPU of this host (all, or indices), each pinned to its "
                        "GPU, and wait until the queue is empty")
    s.add_argument("--lease", type=float, default=None,
                   help="seconds a claimed job stays a worker's without a heartbeat (default 60)")

    w = with_db(sub.add_parser("worker", help="claim and tune queued jobs for this GPU until none is left"))
    w.add_argument("--device", default="auto", help="alias, canonical name, 'auto' or 'cpu' (as for search)")
    w.add_argument("--wait", action="store_true", help="keep waiting for new jobs instead of exiting")
    w.add_argument("--workers", type=int, default=None,
                   help="processes that compile and check candidates in parallel on a GPU (default 4, a search's "
                        "default --ahead; 0: in-process)")
    w.add_argument("--lease", type=float, default=None,
                   help="seconds a claimed job stays this worker's without a heartbeat (default 60)")
    w.add_argument("--max-jobs", type=int, default=None, help="stop after this many jobs")
    w.add_argument("--after-go", action="store_true", help=argparse.SUPPRESS)  # search --gpus's: tuner/gpu_workers.py

    st = with_db(sub.add_parser("status", help="the fleet: jobs queued, running, done, failed; workers"))
    st.add_argument("--all", action="store_true", help="list every job, not only queued and running ones")

    lst = with_db(sub.add_parser("list", help="one row per tuned problem"))
    lst.add_argument("--device", default=None, help="only this device (alias or canonical name)")
    lst.add_argument("--kernel", default=None)
    lst.add_argument("--untuned", action="store_true",
                     help="recorded problems (record mode) that have no tuned record yet, most work first")

    ex = with_db(sub.add_parser("export", help="write tuned records to a JSON file"))
    ex.add_argument("--device", default=None, help="only this device (alias or canonical name)")
    ex.add_argument("--kernel", default=None)
    ex.add_argument("-o", "--output", required=True, help="file to write")

    sp = with_db(sub.add_parser("stamp", help="time this GPU's stored eager winners again, as the user's call "
                                             "runs, and store what they get (winners unchanged)"))
    sp.add_argument("--kernel", default=None, help="only this kernel's records")
    sp.add_argument("--problem", action="append", default=None, metavar="KEY",
                    help="only this problem key, e.g. bf16:nt:8x4096x4096 (repeatable)")
    sp.add_argument("--passes", type=int, default=3,
                    help="timings of each record, 2 s apart over all of them; the median is stored (default 3)")
    sp.add_argument("--settle-s", type=float, default=None,
                    help="each timing waits up to this long for the host's nominal speed, so that a slow phase of "
                         "the host is not stored as the call's speed (default 15; 0: time in whatever phase)")
    sp.add_argument("--dry-run", action="store_true", help="time and print, but store nothing")

    xp = with_db(sub.add_parser("explain", help="which config dispatch runs for problems on a GPU, and why; reads "
                                                "the database and the shipped tables, times nothing, needs no GPU"))
    xp.add_argument("keys", nargs="*", metavar="KEY", help="problem keys, e.g. bf16:nt:8x4096x4096")
    xp.add_argument("--device", default="auto",
                    help="alias (h100) or canonical name of a GPU with records (shipped, or in --db); auto: this GPU")
    xp.add_argument("--kernel", default="matmul", help="the kernel of the KEYs and --corpus (default matmul)")
    xp.add_argument("--corpus", choices=CORPUS_PARTS, default=None,
                    help="the corpus problems of --kernel (matmul, gated_matmul or matmul_bias), or of the unseen models")
    xp.add_argument("--qkv", action="store_true", help="with --corpus: the stacked query/key/value projections")
    xp.add_argument("--problems", default=None, metavar="FILE",
                    help="the problems listed in FILE (one 'kernel dtype:layout:shape [weight]' per line)")
    xp.add_argument("--mode", choices=("eager", "graph", "both"), default="both",
                    help="how the call runs: eager, under a CUDA graph, or both (default)")
    xp.add_argument("--no-shipped", action="store_true", help="leave the shipped tables out")

    vf = with_db(sub.add_parser("verify", help="check this GPU's stored winners (database and shipped tables) again "
                                               "with the search's check; exit 1 if any fails"))
    vf.add_argument("--device", default="auto",
                    help="auto (this GPU, or cpu without one), this GPU's alias or name, or another GPU's with "
                         "this GPU's compute capability (an h100 table on an h200); cpu: the records tuned under "
                         "the interpreter")
    vf.add_argument("--kernel", default=None, help="only this kernel's records")
    vf.add_argument("--no-shipped", action="store_true", help="leave the shipped tables out")
    vf.add_argument("--workers", type=int, default=None,
                    help="processes that compile and check in parallel on a GPU (default: the cores less two, up to 14; 0: in-process)")

    im = with_db(sub.add_parser("import", help="read tuned records from a JSON file"))
    im.add_argument("file")
    im.add_argument("--on-conflict", default="faster",
                    help="faster (default: keep the faster record), replace, keep or error")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s")
    started, args.early_pool = [], None
    try:
        if args.command == "search":
            from .gpu_workers import started_early

            # --gpus: the workers start up (gated) while this process imports and checks its input.
            started = args.started_workers = started_early(args)
        args.early_pool = _early_pool(args)
        if args.command in ("search", "worker", "verify"):
            _prepare_device(args.device)  # "auto" imports torch: after the processes above have started
        from . import commands  # imports kernels (and so triton) only now

        from .workers import import_user_modules

        import_user_modules()

        return getattr(commands, f"cmd_{args.command}")(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except DeviceFault as exc:
        print(f"error: a candidate faulted the GPU ({exc}); this process cannot use the GPU any more. Its job is "
              "queued again (it fails after 3 faults); run the same command again to go on", file=sys.stderr)
        return DEVICE_FAULT_EXIT
    except (ValueError, TypeError, OSError, StoreError) as exc:  # each names the bad value and the way out
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if args.command == "worker":  # `search --gpus` stops its workers so, once its jobs are finished
            # A job it held was given back, with a warning that names it (tuner/fleet.py _give_back).
            print("worker stopped", file=sys.stderr)
        elif args.command == "stamp":  # it writes once, at the end
            print("interrupted: nothing was stored; run the same command again", file=sys.stderr)
        else:
            print("interrupted: finished trials are saved; run the same command again to resume", file=sys.stderr)
        return 130
    finally:
        if args.early_pool is not None:  # the command closed it, or returned before it took it
            args.early_pool.close()
        if started:  # the ones never let go on (the run stopped first) end here; the others were stopped
            from .gpu_workers import call_off

            call_off(started)
