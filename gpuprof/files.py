"""The files gpuprof opens for a user: what it reads and what it writes.

Reading: regular files only. A trace, a run manifest, an ``nvml.csv`` or a ``--gpu-spec`` file
that is really a FIFO or a device (``/dev/zero``) would block or never end; they are refused by
what they are, before a byte is read, with one line naming the path.

Writing (:func:`write_new`, :func:`write_fresh`): never over an input, never over anything but a
regular file or a link, never half-written.
"""

from __future__ import annotations

import contextlib
import os
import stat
import tempfile
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


# --- writing --------------------------------------------------------------------------------
# Every file gpuprof writes for a user (a report, a diff, an annotated trace, a spec file) goes
# through ``write_new``: never over an input, never over anything but a regular file or a link
# (a link is replaced, never followed), never over an existing file without ``force``, never
# half-written.

#: Names a recorder or a profiler writes into a folder gpuprof reads: never replaced, whatever
#: ``--force`` says (the traces, the run manifest, rank records, NVML samples).
_RECORDED_SUFFIXES = (".json", ".json.gz", ".csv", ".csv.gz", ".csv.bz2", ".csv.xz")


def _entry(p: Path) -> tuple[str, str]:
    """Where a path's directory entry is: its folder resolved, its own name kept (a link is the
    link itself, not what it points to)."""
    return os.path.realpath(p.parent), p.name


class Inputs:
    """What a command read, so that nothing it writes replaces it: each input file's directory
    entry and the file it leads to (a link given as input protects both), its inode (a hard link
    to it protects it too), and every recorded file in a folder given as input
    (``_RECORDED_SUFFIXES``: traces, manifests, NVML samples)."""

    def __init__(self, paths: list[Path] | tuple[Path, ...] = ()) -> None:
        self.entries: set[tuple[str, str]] = set()
        self.inodes: set[tuple[int, int]] = set()
        for p in paths:
            self.add(Path(p))

    def add(self, p: Path) -> None:
        if p.is_dir() and not p.is_symlink():
            for sub in (p, p / "traces"):
                if sub.is_dir():
                    for f in sub.iterdir():
                        if f.name.endswith(_RECORDED_SUFFIXES):
                            self.add(f)
            return
        self.entries.add(_entry(p))
        try:
            real = Path(os.path.realpath(p))
            self.entries.add(_entry(real))
            st = os.stat(p)
            if stat.S_ISREG(st.st_mode):
                self.inodes.add((st.st_dev, st.st_ino))
        except (OSError, ValueError):
            pass

    def holds(self, out: Path) -> bool:
        """Whether writing ``out`` would replace one of the inputs (or a hard link to one)."""
        if _entry(out) in self.entries:
            return True
        try:
            st = os.lstat(out)
        except (OSError, ValueError):
            return False
        return stat.S_ISREG(st.st_mode) and (st.st_dev, st.st_ino) in self.inodes


def _kind(mode: int) -> str:
    return ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode)
            else "a device" if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
            else "a socket" if stat.S_ISSOCK(mode) else "not a regular file")


def _mode_for(path: Path) -> int:
    """The replaced file's permissions, else what the umask gives a new file (mkstemp's 0600
    would hide a shared report from its readers)."""
    try:
        st = os.lstat(path)
        if stat.S_ISREG(st.st_mode):
            return stat.S_IMODE(st.st_mode)
    except OSError:
        pass
    mask = os.umask(0)
    os.umask(mask)
    return 0o666 & ~mask


def write_new(path: Path, data: bytes, force: bool = False, inputs: Inputs | None = None,
              what: str = "the input") -> None:
    """Write ``data`` to ``path`` as a new file. Refused, with one line naming the path
    (:class:`UsageError`): one of ``inputs`` (whatever ``force`` says); anything that exists and is
    not a regular file or a link (a folder, a FIFO, ``/dev/null``); an existing file without
    ``force``. The bytes go to a temporary file beside ``path`` (same file system), are flushed
    to disk, then renamed over it: a full disk or a failing write leaves the old file as it was
    and removes the temporary one. Without ``force`` the name is claimed first (an exclusive
    create), so nothing that appears meanwhile is replaced."""
    from gpuprof.errors import UsageError

    if inputs is not None and inputs.holds(path):
        raise UsageError(f"is {what}; gpuprof never writes over what it reads", str(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or e.__class__.__name__
        raise UsageError(f"cannot write ({reason})", str(path)) from None
    if st is not None:
        if stat.S_ISDIR(st.st_mode):
            raise UsageError("is a folder; -o takes a file path", str(path))
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
            raise UsageError(f"is {_kind(st.st_mode)}, not a regular file; gpuprof only ever replaces regular "
                             "files", str(path))
        if not force:
            raise UsageError("exists; choose another -o path or pass --force to replace it", str(path))
    tmp: str | None = None
    reserved = False
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        mode = _mode_for(path)
        if not force:  # claim the name first, so nothing that appears meanwhile is replaced
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), mode))
            reserved = True
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name[:64]}.", suffix=".tmp")
        with os.fdopen(fd, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if force:  # the check above, once more, as late as it can be made
            try:
                now = os.lstat(path)
                if not (stat.S_ISREG(now.st_mode) or stat.S_ISLNK(now.st_mode)):
                    raise UsageError(f"is {_kind(now.st_mode)}, not a regular file; gpuprof only ever replaces "
                                     "regular files", str(path))
            except FileNotFoundError:
                pass
        os.replace(tmp, path)
        tmp = None
        reserved = False
    except FileExistsError:
        raise UsageError("exists; choose another -o path or pass --force to replace it", str(path)) from None
    except (OSError, ValueError) as e:  # ValueError: a NUL byte in the path
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or e.__class__.__name__
        raise UsageError(f"cannot write ({reason})", str(path)) from None
    finally:
        for leftover in (tmp, path if reserved else None):
            if leftover is not None:
                with contextlib.suppress(OSError):
                    os.unlink(leftover)


#: How many numbered names (``stem-N.suffix``) ``write_fresh`` tries before it gives up.
FRESH_TRIES = 10_000


def write_fresh(path: Path, data: bytes) -> Path:
    """Write ``data`` under ``path``, or else ``stem-N.suffix`` for the first N whose name is
    free, and return the name written. Each name is claimed by an exclusive create, so reports
    started at once never take the same name, and none fails because another took it (a dangling
    link counts as taken: it is never followed)."""
    from gpuprof.errors import UsageError

    for n in range(FRESH_TRIES):
        candidate = path if n == 0 else path.with_name(f"{path.stem}-{n}{path.suffix}")
        if os.path.lexists(candidate):
            continue
        try:
            write_new(candidate, data, force=False)
            return candidate
        except UsageError as e:
            if not os.path.lexists(candidate) or "exists" not in str(e):
                raise
    raise UsageError(f"no free name after {FRESH_TRIES} tries; pass -o", str(path))
