"""The tuner's user-facing error, shared by the command line and the library functions it calls."""

from __future__ import annotations


class UserError(Exception):
    """A mistake the user can fix; the CLI prints it without a traceback and exits 2."""
