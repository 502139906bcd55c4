"""A process the fault tests start, kill, starve and lock. Run as ``python tests/faults/child.py MODE ...``.

Modes:
  import URL FILE...     import each file with db.import_records; print "done FILE" once it returned
  cli ARG...             run ``python -m tuner ARG...`` (tuner.cli.main) and exit with its status
  hold-lock PATH SECONDS take SQLite's write lock on PATH, print "locked", hold it, then commit a row
  open URL               open a writing Store, upgrade an old schema (Store.upgrade), print "opened"

Faults, from the environment:
  FAULT_KILL_SQL=REGEX:N   SIGKILL this process just before the N-th SQL statement matching REGEX
  FAULT_KILL_COMMIT=REGEX  SIGKILL this process at the COMMIT of a transaction that ran a statement
                           matching REGEX (after the statements, before the commit reaches the file)
  FAULT_PAUSE_COMMIT=REGEX as FAULT_KILL_COMMIT, but print "paused" and wait for a line on stdin, then
                           commit (the test meanwhile terminates this client's server connection)
  FAULT_FSIZE=BYTES        RLIMIT_FSIZE: no file may grow past BYTES (a full disk), SIGXFSZ ignored
The hooks wrap the store's engine factory; the library itself has no fault switches.
"""

from __future__ import annotations

import os
import re
import resource
import signal
import sqlite3
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from sqlalchemy import event  # noqa: E402

import db.store  # noqa: E402


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _install_faults() -> None:
    kill_sql = os.environ.get("FAULT_KILL_SQL")
    kill_commit = os.environ.get("FAULT_KILL_COMMIT")
    pause_commit = os.environ.get("FAULT_PAUSE_COMMIT")
    fsize = os.environ.get("FAULT_FSIZE")
    if fsize:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(fsize), int(fsize)))
    if not (kill_sql or kill_commit or pause_commit):
        return
    make_engine = db.store._make_engine
    seen = {"count": 0, "dirty": False, "paused": False}

    def hooked(url: str, *, wal: bool):
        engine = make_engine(url, wal=wal)

        @event.listens_for(engine, "before_cursor_execute")
        def before(conn, cursor, statement, parameters, context, executemany):
            if kill_sql:
                pattern, _, nth = kill_sql.rpartition(":")
                if re.search(pattern, statement, re.IGNORECASE):
                    seen["count"] += 1
                    if seen["count"] == int(nth):
                        _die()
            if (kill_commit or pause_commit) and re.search(kill_commit or pause_commit, statement, re.IGNORECASE):
                seen["dirty"] = True

        @event.listens_for(engine, "commit")
        def commit(conn):
            if kill_commit and seen["dirty"]:
                _die()
            if pause_commit and seen["dirty"] and not seen["paused"]:
                seen["paused"] = True
                print("paused", flush=True)
                sys.stdin.readline()

        return engine

    db.store._make_engine = hooked


def main(argv: list[str]) -> int:
    _install_faults()
    mode, rest = argv[0], argv[1:]
    if mode == "import":
        from db import Store, import_records

        with Store(rest[0]) as store:
            for path in rest[1:]:
                import_records(store, path)
                print(f"done {path}", flush=True)
        return 0
    if mode == "cli":
        from tuner.cli import main as cli_main

        return cli_main(rest)
    if mode == "hold-lock":
        connection = sqlite3.connect(rest[0], isolation_level=None)
        connection.execute("BEGIN IMMEDIATE")
        print("locked", flush=True)
        time.sleep(float(rest[1]))
        connection.execute("COMMIT")
        return 0
    if mode == "open":
        from db import Store

        store = Store(rest[0])
        store.upgrade()  # an older schema is upgraded by the first write (db/store.py); this mode asks now
        store.close()
        print("opened", flush=True)
        return 0
    raise SystemExit(f"unknown mode {mode!r}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
