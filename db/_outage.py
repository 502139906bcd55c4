"""A database server that went away (restarted, failed over, unreachable): how to tell, and how long to wait.

A fleet's PostgreSQL server restarts for upgrades and configuration changes, and fails over; both take
seconds. A worker that has tuned for an hour should ride through that, not die and wait for someone to
restart it; a user whose URL names no server should hear so at once. So a writer that reached its
server before and now cannot tries again with a bounded backoff and one log line per try, for up to
``reconnect_window_s()`` (60 s, ``TUNER_DB_RETRY_S``), and then raises ``StoreUnreachable`` naming the
URL and saying to run the command again. Runtime readers (dispatch) do not wait: they fall back at once.
"""

from __future__ import annotations

import logging
import os
import time

from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, SQLAlchemyError

_logger = logging.getLogger(__name__)

# A restart (pg_ctl stop, then start) of the loopback test server takes well under a second on top of
# the time it is down (tests/faults/test_server_faults.py); 60 s rides through a restart with room.
# A managed service's failover can take longer: raise TUNER_DB_RETRY_S there.
_WINDOW_S = 60.0
_FIRST_PAUSE_S = 0.5  # doubled after each try, up to _LONGEST_PAUSE_S
_LONGEST_PAUSE_S = 8.0

# What libpq and the server say when the server is not there, is stopping or starting, or dropped the
# connection; an error without one of these (a bad password, a missing database, a bad statement) is
# not an outage, and waiting would only delay the message.
_SIGNS = ("connection refused", "could not connect", "connection timed out", "timeout expired",
          "no route to host", "network is unreachable", "the database system is shutting down",
          "the database system is starting up", "not yet accepting connections", "in recovery mode",
          "terminating connection", "server closed the connection", "connection is closed",
          "connection already closed", "consuming input failed", "could not receive data",
          "could not send data", "ssl connection has been closed", "connection reset by peer",
          "broken pipe", "the connection is lost")


class StoreError(RuntimeError):
    """The database could not be read or written, or a write conflicts; the message says what to do."""


class StoreUnreachable(StoreError):
    """The database server could not be reached, or dropped the connection; what was committed stays,
    and the same command can be run again once the server is back. ``gave_up``: raised after waiting
    out an ``Outage`` window (a caller must not wait again)."""

    def __init__(self, message: str, *, gave_up: bool = False) -> None:
        super().__init__(message)
        self.gave_up = gave_up


def reconnect_window_s() -> float:
    """Seconds a writer keeps trying to reach a server that went away: ``TUNER_DB_RETRY_S`` or 60."""
    text = os.environ.get("TUNER_DB_RETRY_S", "").strip()
    try:
        value = float(text) if text else _WINDOW_S
    except ValueError:
        raise StoreError(f"TUNER_DB_RETRY_S={text!r} is not a number of seconds; unset it or give e.g. 60") from None
    return max(0.0, value)


def server_unreachable(exc: BaseException) -> bool:
    """Whether ``exc``, or an error it was raised from (Optuna wraps SQLAlchemy's), says that the server
    is down, stopping, starting, or dropped the connection."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DBAPIError) and current.connection_invalidated:
            return True
        if isinstance(current, SQLAlchemyError) or type(current).__module__.startswith("psycopg"):
            text = " ".join(str(getattr(current, "orig", None) or current).lower().split())
            if any(sign in text for sign in _SIGNS):
                return True
        current = current.__cause__ or current.__context__
    return False


def one_line(detail: object) -> str:
    """A driver message (libpq's span lines, with a tab-indented hint) as one line."""
    return " ".join(str(detail).split())


def driver_message(exc: BaseException) -> str:
    """The driver's own message behind ``exc`` (SQLAlchemy's and Optuna's wrappers add paragraphs)."""
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, DBAPIError) and current.orig is not None:
            return one_line(current.orig)
        current = current.__cause__ or current.__context__
    return one_line(exc)


def shown_url(url: str) -> str:
    """The URL fit for messages: any password masked."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except SQLAlchemyError:
        return url


class Outage:
    """Bounded waiting through the outages of the database at ``url``: ``pause`` sleeps before the next
    try, or raises ``StoreUnreachable`` once the window is spent since the outage began. ``recovered``
    (the caller got something done) ends the outage, so a day-long search rides through every restart;
    time alone never does, since a try that hangs until a timeout must not look like progress."""

    def __init__(self, url: str, window_s: float | None = None) -> None:
        self.url = shown_url(url)
        self.window_s = reconnect_window_s() if window_s is None else window_s
        self._started: float | None = None
        self._tries = 0

    def recovered(self) -> None:
        """The database answered again: the next failure begins a new outage."""
        self._started = None

    def pause(self, error: BaseException, what: str = "trying again") -> None:
        """Sleep before the next try after ``error``; raise ``StoreUnreachable`` when the window is spent."""
        detail = driver_message(error)
        now = time.monotonic()
        if self._started is None:
            self._started, self._tries = now, 0
        waited = now - self._started
        if waited >= self.window_s:
            still = f", still after {waited:.0f} s" if waited >= 1 else ""
            raise StoreUnreachable(
                f"database {self.url} cannot be reached ({detail}){still}; everything committed is kept: "
                "start the server or fix the URL (TUNER_DB or --db), then run the same command again (a "
                "search resumes its study where it stopped)", gave_up=True)
        delay = min(_FIRST_PAUSE_S * 2 ** self._tries, _LONGEST_PAUSE_S, self.window_s - waited)
        self._tries += 1
        _logger.warning("database %s cannot be reached (%s); %s in %.1f s (for up to %.0f s)",
                        self.url, detail, what, delay, self.window_s)
        time.sleep(delay)
