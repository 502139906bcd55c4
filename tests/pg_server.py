"""A real PostgreSQL server for the tests: initdb in a temporary folder, listening on loopback only.

Debian's ``postgresql`` package puts ``initdb`` and ``pg_ctl`` in ``/usr/lib/postgresql/<ver>/bin``
(not on PATH); ``PG_BIN`` names another folder. initdb refuses to run as root, so as root the server
runs as the ``postgres`` user (the package creates it) through ``runuser``. Each test gets a fresh
database on the one server of the session (``fresh_url``), so tests stay independent and cheap.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path


class PgUnavailable(RuntimeError):
    """No PostgreSQL server binary here, or it would not start; the message says how to get one."""


def find_bin() -> Path | None:
    """The folder holding initdb and pg_ctl: $PG_BIN, Debian's newest, or PATH; None if none."""
    configured = os.environ.get("PG_BIN", "").strip()
    candidates = [configured] if configured else []
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version, reverse=True)
    on_path = shutil.which("initdb")
    if on_path:
        candidates.append(str(Path(on_path).parent))
    for folder in candidates:
        if (Path(folder) / "initdb").exists() and (Path(folder) / "pg_ctl").exists():
            return Path(folder)
    return None


def _version(folder: str) -> int:
    try:
        return int(Path(folder).parent.name.split(".")[0])
    except ValueError:
        return 0


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class PgServer:
    """One server process for a test session; ``stop`` removes its folder."""

    def __init__(self, bin_dir: Path) -> None:
        self._bin = bin_dir
        self._root = Path(tempfile.mkdtemp(prefix="tuner-pg-"))
        self._data = self._root / "data"
        self._as_user: list[str] = []
        if os.geteuid() == 0:  # initdb will not run as root: run the server as the package's user
            if shutil.which("runuser") is None:
                raise PgUnavailable("running as root without runuser: cannot start PostgreSQL as a non-root user")
            self._as_user = ["runuser", "-u", "postgres", "--"]
            shutil.chown(self._root, user="postgres")
        self.port = _free_port()
        self._counter = 0

    def _run(self, *argv: str) -> None:
        command = [*self._as_user, *argv]
        result = subprocess.run(command, capture_output=True, text=True, timeout=120)
        if result.returncode != 0:
            raise PgUnavailable(f"{' '.join(command)} failed ({result.returncode}): {result.stderr.strip()[-2000:]}")

    def start(self) -> PgServer:
        self._run(str(self._bin / "initdb"), "-D", str(self._data), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--no-sync")
        self.start_again()
        return self

    def start_again(self) -> None:
        """Start the server on its data folder and port (after ``initdb``, or after ``shut_down``)."""
        options = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self._root} "
                   "-c fsync=off -c max_connections=300 -c shared_buffers=64MB")
        self._run(str(self._bin / "pg_ctl"), "-D", str(self._data), "-l", str(self._root / "server.log"),
                  "-o", options, "-w", "-t", "60", "start")

    def shut_down(self, mode: str = "fast") -> None:
        """Stop the server, keeping its data, as an operator would: ``fast`` rolls back open transactions
        and closes every connection; ``immediate`` kills the processes (crash recovery at the next start)."""
        self._run(str(self._bin / "pg_ctl"), "-D", str(self._data), "-m", mode, "-w", "-t", "60", "stop")

    def stop(self) -> None:
        try:
            self._run(str(self._bin / "pg_ctl"), "-D", str(self._data), "-m", "immediate", "-w", "stop")
        except PgUnavailable:
            pass
        shutil.rmtree(self._root, ignore_errors=True)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def fresh_url(self) -> str:
        """A new, empty database on this server."""
        import psycopg

        self._counter += 1
        name = f"t{os.getpid()}_{self._counter}_{int(time.time() * 1000) % 100000}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres",
                             autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)


def start_server() -> PgServer:
    """A started server, or ``PgUnavailable`` saying what is missing."""
    try:
        import psycopg  # noqa: F401
    except ImportError:
        raise PgUnavailable("the psycopg driver is not installed: pip install 'psycopg[binary]' "
                            "(the project's 'postgres' extra)") from None
    bin_dir = find_bin()
    if bin_dir is None:
        raise PgUnavailable("no PostgreSQL server binary (initdb, pg_ctl): apt-get install postgresql, "
                            "or set PG_BIN to the folder that holds them")
    return PgServer(bin_dir).start()


def start_for_tests() -> PgServer:
    """A started server; without one the calling test skips, except in CI (env CI set), where the
    PostgreSQL tests must run, so it fails."""
    import pytest

    try:
        return start_server()
    except PgUnavailable as exc:
        if os.environ.get("CI"):
            pytest.fail(f"CI must run the PostgreSQL tests: {exc}")
        pytest.skip(f"PostgreSQL tests skipped: {exc}")


def _cpu_of(pid: int) -> tuple[float, int]:
    """(user + system CPU seconds of ``pid`` and of its reaped children, its parent pid)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return sum(int(value) for value in fields[11:15]) / ticks, int(fields[1])


def server_cpu_s(server: PgServer) -> float:
    """CPU seconds the server has used so far: the postmaster, its exited (reaped) backends, and the
    live ones. For the load test's server-side cost per statement."""
    postmaster = int((server._data / "postmaster.pid").read_text().split()[0])
    total = _cpu_of(postmaster)[0]
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != postmaster:
            try:
                cpu, parent = _cpu_of(int(entry.name))
            except (OSError, IndexError, ValueError):
                continue
            if parent == postmaster:
                total += cpu
    return total
