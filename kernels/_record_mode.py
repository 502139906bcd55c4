"""Record mode: note every distinct problem that dispatch sees, per device, with call counts, and write
them to the database in the background, so that ``python -m tuner search --recorded`` tunes what a
workload actually runs.

On (``TUNER_RECORD=1`` in the environment, or ``with kernels.recording():``), the hot path adds one
dict increment per call: ``RECORDER.counts[key] += 1`` on the call's own dispatch key. What a key
means (device, kernel, problem) is noted once, on the dispatch cache miss that first resolves it
(``RECORDER.seen``). A daemon thread writes the counts added since its last write every
``TUNER_RECORD_FLUSH_S`` seconds (default 30; a value that is not a positive, finite number of seconds
warns and keeps the default), and once more at exit; never per call. Writes are
upserts that add to the stored counts, so many processes may record into one database at once.

Starts and stops nest: a ``with kernels.recording(url):`` block inside a process recording since import
(``TUNER_RECORD=1``), or inside another block, records into its own ``url`` and, when it ends, gives
the enclosing recording back its URL instead of switching recording off.

Counts are read without a lock: a dict read races only with a concurrent increment of the same key,
and the difference is written on the next flush (the recorder remembers what it has written).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import threading
from collections import defaultdict
from collections.abc import Hashable, Iterator

from . import _native
from ._refresh import env_seconds, valid_seconds
from ._spec import DeviceInfo, Problem

log = logging.getLogger(__name__)

# Seconds between background writes: a long-running server's counts reach the database this often.
DEFAULT_FLUSH_S = 30.0


class Recorder:
    """The process's record of dispatched problems. ``on`` is read on the hot path."""

    def __init__(self) -> None:
        self.on = False
        self.counts: defaultdict[Hashable, int] = defaultdict(int)
        self._problems: dict[Hashable, tuple[str, str, str, float]] = {}  # key -> device, kernel, problem, flops
        self._written: dict[Hashable, int] = {}
        self._lock = threading.Lock()  # one flush at a time
        self._nesting = threading.Lock()  # one start or stop at a time
        self._url: str | None = None
        self._outer: list[str | None] = []  # the URL of each enclosing recording, innermost last
        self._thread: threading.Thread | None = None
        self._wake = threading.Event()
        self._atexit = False

    def seen(self, key: Hashable, kernel: str, problem: Problem, device: DeviceInfo) -> None:
        """What the dispatch key ``key`` stands for; called on a dispatch cache miss only."""
        self._problems[key] = (device.name, kernel, problem.key, float(problem.flops))

    @contextlib.contextmanager
    def uncounted(self) -> Iterator[None]:
        """Calls made inside are not counted: the graph-mode warm-up that ``kernels.ops`` runs after a
        signature's first call on a GPU runs the GEMM once more, a call the workload did not make. What the
        block added is taken back under the flush lock (no write sees it); a count another thread adds in those
        moments goes with it (a warm-up is one call, once per signature)."""
        if not self.on:
            yield
            return
        with self._lock:
            before = dict(self.counts)
            try:
                yield
            finally:
                for key, count in list(self.counts.items()):
                    if count != before.get(key, 0):
                        if key in before:
                            self.counts[key] = before[key]
                        else:
                            del self.counts[key]

    def start(self, url: str | None = None, flush_s: float | None = None) -> None:
        """Record from now on, into ``url`` (None: TUNER_DB or the default database), until the matching
        ``stop``; inside another recording, into ``url`` until then, and into the enclosing one's after."""
        if flush_s is not None and not valid_seconds(flush_s):
            raise ValueError(f"flush_s={flush_s!r} must be a positive, finite number of seconds; pass e.g. 30")
        with self._nesting:
            if self.on:
                if url != self._url:
                    self.flush()  # what the enclosing recording counted so far is its own
                self._outer.append(self._url)
                self._url = url
                return
            self._url = url
            _native.suspend()  # every call must reach the count below: none served from C++
            self.on = True
            if not self._atexit:
                atexit.register(self.flush)
                self._atexit = True
            if self._thread is None or not self._thread.is_alive():
                self._wake.clear()
                self._thread = threading.Thread(target=self._run, args=(flush_s or env_flush_s(),), daemon=True,
                                                name="tuner-record")
                self._thread.start()

    def stop(self) -> None:
        """End the innermost recording and write what is left; the enclosing one, if any, goes on."""
        with self._nesting:
            if self._outer:
                self.flush()  # this recording's counts, into its own URL
                self._url = self._outer.pop()
                return
            if self.on:
                _native.resume()
            self.on = False
            self._wake.set()
            if self._thread is not None:
                self._thread.join()
                self._thread = None
            self.flush()
            with self._lock:
                # The recording is over: what it could not write (its database unwritable, or a call whose
                # problem it never saw resolved) is not the next recording's, whose database may be another.
                self.counts.clear()
                self._written.clear()

    def _run(self, flush_s: float) -> None:
        while not self._wake.wait(flush_s):
            self.flush()

    def flush(self) -> int:
        """Write the calls counted since the last write; returns how many problems were written.

        A database that cannot be written loses nothing: the counts stay and the next flush retries."""
        with self._lock:
            snapshot = {key: count for key, count in list(self.counts.items()) if key in self._problems}
            delta: dict = defaultdict(lambda: [0, 0.0])
            for key, count in snapshot.items():
                added = count - self._written.get(key, 0)
                if added > 0:
                    device, kernel, problem_key, flops = self._problems[key]
                    entry = delta[(device, kernel, problem_key)]
                    entry[0] += added
                    entry[1] = flops
            if not delta:
                return 0
            try:
                _write(self._url, delta)
            except Exception as exc:  # noqa: BLE001 - never raise into the workload (atexit, a thread)
                log.warning("record mode could not write %d problem(s) to the database: %s", len(delta), exc)
                return 0
            self._written.update(snapshot)
            return len(delta)


def _write(url: str | None, delta: dict) -> None:
    from db import Store
    from db.recorded import ProblemKey, add_calls

    counts = {ProblemKey(*problem): (calls, flops) for problem, (calls, flops) in delta.items()}
    with Store(url) as store:
        add_calls(store, counts)


RECORDER = Recorder()


def env_flush_s() -> float:
    """``TUNER_RECORD_FLUSH_S``, or DEFAULT_FLUSH_S where it is unset or invalid (with a warning)."""
    return env_seconds("TUNER_RECORD_FLUSH_S", "30", f"record mode writes every {DEFAULT_FLUSH_S:g} s") \
        or DEFAULT_FLUSH_S


def env_wants_recording() -> bool:
    return os.environ.get("TUNER_RECORD", "").strip().lower() in ("1", "true", "yes", "on")
