"""Reading the files a user names: regular files only.

A trace, a run manifest, an ``nvml.csv`` or a ``--gpu-spec`` file that is really a FIFO or a
device (``/dev/zero``) would block or never end; they are refused by what they are, before a byte
is read, with one line naming the path.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from gpuprof.errors import GpuprofError, TraceError


def read_file(path: Path, error: type[GpuprofError] = TraceError) -> bytes:
    """A regular file's bytes, as on disk. Anything else (a folder, a FIFO, a device such as
    /dev/zero) is refused with one line naming the path, before a byte is read: reading it could
    block or never end."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except FileNotFoundError:
        raise error("no such file", str(path)) from None
    except IsADirectoryError:
        raise error("is a folder, not a file", str(path)) from None
    except OSError as e:
        raise error(f"cannot read ({e.strerror})", str(path)) from None
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise error("is a folder, not a file", str(path))
        if not stat.S_ISREG(mode):
            kind = "a FIFO" if stat.S_ISFIFO(mode) else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode) \
                else "a socket" if stat.S_ISSOCK(mode) else "special"
            raise error(f"not a regular file ({kind}): refusing to read it", str(path))
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read()
        except OSError as e:
            raise error(f"cannot read ({e.strerror})", str(path)) from None
