"""Errors gpuprof raises on bad input, each knowing its exit code.

The CLI turns any :class:`GpuprofError` into one line on stderr and that exit code, never a
traceback. Messages name the file and the problem, so a user knows what to fix.
"""

from __future__ import annotations


class GpuprofError(Exception):
    """Base of every error gpuprof reports to users. ``exit_code`` is what the CLI exits with."""

    exit_code = 2

    def __init__(self, message: str, path: str | None = None) -> None:
        self.path = path
        super().__init__(f"{path}: {message}" if path else message)


class TraceError(GpuprofError):
    """The trace file cannot be read: missing, truncated, not JSON, not a Kineto trace."""

    exit_code = 3


class SpecError(GpuprofError):
    """The GPU is unknown, or a user spec file is malformed."""

    exit_code = 4


class UsageError(GpuprofError):
    """Arguments that cannot work together, or an output that would overwrite something."""

    exit_code = 2


class GpuprofWarning(UserWarning):
    """Something gpuprof did not do, or did otherwise, that a user should know of (the CLI shows
    each as one line: ``gpuprof: warning: ...``)."""
