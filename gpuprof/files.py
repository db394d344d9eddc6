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
from typing import Any

from gpuprof.errors import GpuprofError, TraceError


def read_file(path: Path, error: type[GpuprofError] = TraceError, max_bytes: int | None = None) -> bytes:
    """A regular file's bytes, as on disk. Anything else (a folder, a FIFO, a device such as
    /dev/zero) is refused with one line naming the path, before a byte is read: reading it could
    block or never end; so is a file larger than ``max_bytes``."""
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
        size = os.fstat(fd).st_size
        if max_bytes is not None and size > max_bytes:
            raise error(f"is {size:,} bytes, more than such a file ever holds ({max_bytes:,}); refused", str(path))
    except BaseException:
        os.close(fd)
        raise
    with os.fdopen(fd, "rb") as f:
        try:
            return f.read()
        except OSError as e:
            raise error(f"cannot read ({e.strerror})", str(path)) from None


# --- reading: one path for every file gpuprof opens -----------------------------------------
# A trace, a run manifest, a rank record, the NVML samples, a spec file, a cache entry: each is
# read by :func:`read`, which opens only a regular file, only inside the folder it belongs to when
# one is named, up to a size, and decompresses by what the bytes are (never by the file's name)
# with the output bounded against the input.

#: Output allowed per input byte when decompressing (the most a real trace in the corpus and
#: samples shows is 30x; gzip's own limit is about 1032x, which only crafted files reach), and
#: below which any ratio is fine.
GUNZIP_MAX_RATIO = 200.0
GUNZIP_FREE_BYTES = 64 << 20
_GUNZIP_ENV = "GPUPROF_GUNZIP_MAX_RATIO"

#: The most a small JSON file gpuprof reads may hold on disk: a run manifest, a rank record, a
#: spec file, a cache entry's metadata (a manifest of 10,000 ranks is a few MB).
SMALL_FILE_BYTES = 64 << 20

#: What the first bytes of a file say it is: containers gpuprof decompresses (gzip, bzip2, xz),
#: and those it names and refuses.
_GZIP, _BZ2, _XZ = b"\x1f\x8b", b"BZh", b"\xfd7zXZ\x00"
_REFUSED_CONTAINERS = ((b"PK\x03\x04", "a zip archive"), (b"(\xb5/\xfd", "zstd-compressed data"),
                       (b"\x89PNG", "a PNG image"), (b"%PDF", "a PDF document"),
                       (b"\x80\x04\x95", "a Python pickle"), (b"PAR1", "a Parquet file"),
                       (b"SQLite format 3\x00", "an SQLite database"), (b"\x7fELF", "an executable"))
_UTF8_BOM = b"\xef\xbb\xbf"


def gunzip_limit() -> float:
    """The expansion ratio refused (``$GPUPROF_GUNZIP_MAX_RATIO``, default 200; 0 = no limit)."""
    import math

    raw = os.environ.get(_GUNZIP_ENV)
    if raw is None:
        return GUNZIP_MAX_RATIO
    try:
        ratio = float(raw)
    except ValueError:
        raise TraceError(f"{_GUNZIP_ENV} must be a number (0 = no limit), got {raw!r}") from None
    return math.inf if ratio == 0 or ratio == math.inf else ratio if ratio > 0 else GUNZIP_MAX_RATIO


def _container(raw: bytes | memoryview) -> str | None:
    head = bytes(raw[:16])
    for magic, what in _REFUSED_CONTAINERS:
        if head.startswith(magic):
            return what
    return None


def _printable(bs: bytes) -> bool:
    return bool(bs) and all(c in (9, 10, 13) or 32 <= c < 127 for c in bs)


def _encoding(raw: bytes | memoryview) -> str | None:
    """A text encoding other than UTF-8 that the first bytes show: a byte-order mark, or ASCII
    text (what JSON and CSV begin with) with NUL bytes between its characters, as UTF-16/32
    writes it; else None (binary garbage is left to the parser to refuse)."""
    head = bytes(raw[:16])
    for bom, name in ((b"\x00\x00\xfe\xff", "UTF-32 (big-endian)"), (b"\xff\xfe\x00\x00", "UTF-32 (little-endian)"),
                      (b"\xfe\xff", "UTF-16 (big-endian)"), (b"\xff\xfe", "UTF-16 (little-endian)")):
        if head.startswith(bom):
            return f"{name} text"
    n = len(head) - len(head) % 4
    if n >= 8:
        for width, order, name in ((4, 0, "UTF-32 (little-endian)"), (4, 3, "UTF-32 (big-endian)"),
                                   (2, 0, "UTF-16 (little-endian)"), (2, 1, "UTF-16 (big-endian)")):
            chars = head[order:n:width]
            rest = bytes(b for i, b in enumerate(head[:n]) if i % width != order)
            if _printable(chars) and not any(rest):
                return f"{name} text"
    return None


def _inflate(path: Path, raw: bytes, make: Any, name: str, magic: bytes, error: type[GpuprofError]) -> bytes:
    """``raw`` decompressed by the decompressor objects ``make()`` gives (one per member of a
    concatenated stream starting with ``magic``), streamed, and refused as soon as the output
    passes ``gunzip_limit()`` times the input consumed so far (past the first 64 MB): a crafted
    file (4 MB that expands to 8 GB) fails within that much memory instead of exhausting it."""
    import zlib

    ratio = gunzip_limit()
    out = bytearray()
    view = memoryview(raw)
    step = 1 << 20

    def bounded(used: int) -> None:
        if len(out) > GUNZIP_FREE_BYTES and len(out) > ratio * used:
            raise error(f"{name} data expands more than {ratio:g}x (past {len(out) >> 20} MB from the first "
                        f"{max(used >> 20, 1)} MB); no real trace compresses that well. Set {_GUNZIP_ENV}=0 to "
                        "read it anyway", str(path))

    pos = 0  # input bytes consumed
    d = make()
    try:
        while True:
            if d.eof:  # a member ended: another member follows (concatenated), or zero padding, or the end
                pos -= len(d.unused_data)
                if bytes(view[pos:pos + len(magic)]) != magic:
                    if any(view[pos:]):
                        raise error(f"corrupt {name} data (garbage after the {name} stream)", str(path))
                    return bytes(out)
                d = make()
            if pos >= len(view):
                raise error(f"truncated {name} stream (was the run killed while the file was written?)", str(path))
            piece: bytes | memoryview = view[pos:pos + step]
            pos += len(piece)
            if hasattr(d, "unconsumed_tail"):  # zlib: what it has not read yet comes back to us
                while piece and not d.eof:
                    out += d.decompress(piece, step * 16)
                    piece = d.unconsumed_tail
                    bounded(pos - len(piece))
                pos -= len(piece)  # (only non-empty when the member ended inside it)
            else:  # bz2, lzma: they keep unread input themselves; drain it in bounded pieces
                out += d.decompress(piece, step * 16)
                bounded(pos)
                while not d.eof and not d.needs_input:
                    out += d.decompress(b"", step * 16)
                    bounded(pos)
    except (zlib.error, OSError, EOFError, ValueError) as e:
        raise error(f"corrupt {name} data ({e})", str(path)) from None


def decompress(path: Path, raw: bytes, error: type[GpuprofError] = TraceError) -> bytes:
    """``raw`` decompressed when its first bytes are gzip, bzip2 or xz (whatever the file is
    called), else as is; bounded (see :func:`_inflate`). Data compressed twice is one line
    saying so."""
    import bz2
    import lzma
    import zlib

    if raw[:2] == _GZIP:
        name, out = "gzip", _inflate(path, raw, lambda: zlib.decompressobj(wbits=31), "gzip", _GZIP, error)
    elif raw[:3] == _BZ2 and raw[3:4].isdigit():
        name, out = "bzip2", _inflate(path, raw, bz2.BZ2Decompressor, "bzip2", _BZ2, error)
    elif raw[:6] == _XZ:
        name, out = "xz", _inflate(path, raw, lzma.LZMADecompressor, "xz", _XZ, error)
    else:
        return raw
    if out[:2] == _GZIP or (out[:3] == _BZ2 and out[3:4].isdigit()) or out[:6] == _XZ:
        raise error(f"{name} data holding compressed data again (compressed twice): decompress it once first",
                    str(path))
    return out


def unpack(path: Path, raw: bytes, error: type[GpuprofError] = TraceError, text: bool = True) -> bytes:
    """A file's bytes as read (``raw``) made ready to parse: decompressed by content
    (:func:`decompress`), a UTF-8 byte-order mark dropped. A zip or zstd file or another format
    (by its first bytes), or (``text``) text in UTF-16/32, is refused in one line naming it."""
    found = _container(raw)
    if found:
        raise error(f"is {found}, not a file gpuprof reads", str(path))
    data = decompress(path, raw, error)
    if data is not raw:
        found = _container(data)
        if found:
            raise error(f"holds {found} (compressed), not a file gpuprof reads", str(path))
    if data[:3] == _UTF8_BOM:
        return data[3:]
    if text:
        enc = _encoding(data)
        if enc:
            raise error(f"is {enc}; gpuprof reads UTF-8 (convert it, e.g. iconv -t UTF-8)", str(path))
    return data


def read(path: Path, *, inside: Path | None = None, max_bytes: int | None = None,
         error: type[GpuprofError] = TraceError, text: bool = True) -> bytes:
    """The contents of the file at ``path``, ready to parse: a regular file only
    (:func:`read_file`), inside the folder ``inside`` when given (resolved: neither ``..`` nor a
    link may lead out of it), of at most ``max_bytes`` on disk, then :func:`unpack` ed."""
    if inside is not None:
        try:
            root, real = os.path.realpath(inside), os.path.realpath(path)
        except (OSError, ValueError) as e:
            raise error(f"not a usable path ({e.__class__.__name__})", str(path)) from None
        if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
            raise error(f"leads outside its folder {inside} (to {real}); refused", str(path))
    return unpack(path, read_file(path, error, max_bytes), error, text)


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


def check_target(path: Path, force: bool = False, inputs: Inputs | None = None,
                 what: str = "the input") -> None:
    """What :func:`write_new` refuses before it writes anything, asked alone: a command calls it
    before its work, so that a refused ``-o`` costs nothing (``write_new`` asks again when it
    writes)."""
    from gpuprof.errors import UsageError

    if inputs is not None and inputs.holds(path):
        raise UsageError(f"is {what}; gpuprof never writes over what it reads", str(path))
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except (OSError, ValueError) as e:
        reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e) or e.__class__.__name__
        raise UsageError(f"cannot write ({reason})", str(path)) from None
    if stat.S_ISDIR(st.st_mode):
        raise UsageError("is a folder; -o takes a file path", str(path))
    if not (stat.S_ISREG(st.st_mode) or stat.S_ISLNK(st.st_mode)):
        raise UsageError(f"is {_kind(st.st_mode)}, not a regular file; gpuprof only ever replaces regular "
                         "files", str(path))
    if not force:
        raise UsageError("exists; choose another -o path or pass --force to replace it", str(path))


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

    check_target(path, force, inputs, what)
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
