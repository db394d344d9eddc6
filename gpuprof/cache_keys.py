"""Cache keys and the report cache, importable without numpy, pandas or pyarrow.

A second ``gpuprof report --format json`` of unchanged trace files with the same options prints
the report stored by the first: the file is hashed (BLAKE3, ~1.5 GB/s), the stored text read
back, and nothing else is imported or computed (importing pandas and pyarrow alone took ~0.45 s
of CPU, more than the rest of such a report). The frames and results caches
(:mod:`gpuprof.trace.cache`) use the same keys and layout; this module holds the part of it a
cached report needs.

A stored report is keyed by gpuprof's own source (every ``.py`` file of gpuprof, its analyzers
and reports, and the measured tables under ``gpuprof/data``), the cache format, the report's
options and, per trace file, its resolved path and the key of the bytes the report was computed from (what the analysis parsed, not what the file
holds when the report is stored). Reports of trace files and of plain folders of trace files
(listed as :func:`gpuprof.runfolder.find_traces` lists them, the listing in the key) are stored; run
folders (a manifest, or what a killed recorder left in ``traces/``) are not: their manifest and
NVML samples would have to be covered too.
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import blake3
import msgspec

import gpuprof

#: What a trace file's name ends with (folders are listed by it).
TRACE_SUFFIXES = (".json", ".json.gz", ".pt.trace.json", ".pt.trace.json.gz")
# 5: runtime kind/op, kernels in_graph/name_class, meta graph counts (issue 10), python frames; 6: memory;
# 7: events repeated, shared correlation ids, empty ProfilerStep spans found and said (#28)
FORMAT = 7


def cache_dir() -> Path:
    if os.environ.get("GPUPROF_CACHE_DIR"):
        return Path(os.environ["GPUPROF_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuprof"


def hash_bytes(data: bytes | memoryview) -> str:
    """BLAKE3-256 hex digest: collision-resistant (XXH3 was not) at about 1.5 GB/s on one core here."""
    return blake3.blake3(data).hexdigest()


def key_of(raw: bytes) -> str:
    """The cache key of a trace file whose bytes (as on disk) are ``raw``."""
    return f"{hash_bytes(raw)}-{len(raw)}-v{gpuprof.__version__}-f{FORMAT}"


# Within a process, the key of a file whose identity and times are unchanged is remembered; ctime
# and inode change on any write or replacement (no user call sets them back), unlike mtime.
_KEYS: dict[tuple[str, int, int, int, int, int], str] = {}


def stat_id(path: Path) -> tuple[str, int, int, int, int, int]:
    st = path.stat()
    return (str(path.resolve()), st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def remember(path: Path, before: tuple[str, int, int, int, int, int], key: str) -> None:
    """Remember ``key`` for ``path`` if the file is still what ``before`` described when it was read."""
    try:
        if stat_id(path) == before:
            _KEYS[before] = key
    except OSError:
        pass


def content_key(path: Path) -> str:
    """The key of the file as it is now, for *looking up* entries (hashes it unless remembered).
    What is stored is always keyed by the bytes it was computed from, never by this."""
    from gpuprof import files

    memo = stat_id(path)
    if memo in _KEYS:
        return _KEYS[memo]
    key = key_of(files.read_file(path))
    remember(path, memo, key)
    return key


_SOURCE_HASH: str | None = None


def source_files(root: Path) -> list[Path]:
    """What a result computed by the package at ``root`` depends on besides its inputs: every
    ``.py`` file under it and the measured tables it ships (``data/*.json``: the GEMM and layout
    tables the analyzers price with), in a fixed order."""
    data = root / "data"
    return sorted(root.rglob("*.py")) + (sorted(data.glob("*.json")) if data.is_dir() else [])


def source_hash() -> str:
    """BLAKE3 of every Python source file of gpuprof and its analyzers and reports, and of the
    tables it ships (a few ms), found without importing them: a new table, as a new line of code,
    makes new results."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        roots = set()
        for name in ("gpuprof", "gpuprof.analyzers", "gpuprof.reports"):
            spec = importlib.util.find_spec(name)
            if spec is not None and spec.origin:
                roots.add(Path(spec.origin).resolve().parent)
        h = blake3.blake3()
        for root in sorted(roots):
            for f in source_files(root):
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
        _SOURCE_HASH = h.hexdigest()
    return _SOURCE_HASH


def result_key(code: str, *parts: Any) -> str:
    """A key for a result computed from ``parts`` (plain values: strings, numbers, tuples, None)
    by the code whose hash is ``code``."""
    return "r-" + hash_bytes(repr((code, FORMAT, parts)).encode())


def result_file(key: str, root: Path | None = None) -> Path:
    return (root or cache_dir()) / "results" / f"{key}.msgpack"


# --- the report cache -----------------------------------------------------------------------

def trace_files(paths: list[Path]) -> list[Path] | None:
    """The trace files a report of ``paths`` reads: files as given, plain folders' trace files;
    None when a path is neither (a run folder, a FIFO, missing: not stored)."""
    out: list[Path] = []
    for p in paths:
        if p.is_symlink():
            return None
        if p.is_file():
            out.append(p)
            continue
        if not p.is_dir() or (p / "manifest.json").exists() or (p / "traces").exists():
            return None
        found = sorted(f for f in p.iterdir() if f.name.endswith(TRACE_SUFFIXES) and f.name != "manifest.json"
                       and not f.name.endswith(".meta.json") and f.is_file())
        if not found or any(f.is_symlink() for f in found):
            return None
        out.extend(found)
    return out


def report_key(paths: list[Path], fmt: str, options: tuple[Any, ...], contents: dict[str, str] | None = None
               ) -> str | None:
    """The key of the ``fmt`` report of ``paths`` with ``options`` (None when it is not stored:
    see :func:`trace_files`). ``contents``: the content key of each trace file's bytes as parsed,
    by resolved path (what a report is stored under); without it, each file's current key (what
    a lookup uses)."""
    from gpuprof.errors import GpuprofError

    try:
        files = trace_files(paths)
        if files is None:
            return None
        resolved = [str(f.resolve()) for f in files]
        if contents is None:
            keys = [content_key(f) for f in files]
        elif set(contents) == set(resolved):
            keys = [contents[r] for r in resolved]
        else:  # the analysis read other files than are here now
            return None
    except (OSError, GpuprofError):
        return None
    return result_key(source_hash(), "report", fmt, tuple(str(p) for p in paths), tuple(zip(resolved, keys)),
                      options)


def spec_digest(spec_file: str | None) -> str | None:
    """A spec file's content hash, for keys (the file's name when it cannot be read: the report says why)."""
    if not spec_file:
        return None
    from gpuprof import files
    from gpuprof.errors import GpuprofError

    try:
        return hash_bytes(files.read_file(Path(spec_file)))
    except (GpuprofError, OSError):
        return spec_file


def cached_report(key: str) -> str | None:
    """The report stored under ``key``, or None (absent, unreadable: the entry is deleted)."""
    f = result_file(key)
    if not f.is_file() or f.is_symlink():
        return None
    from gpuprof import files
    from gpuprof.errors import GpuprofError

    try:
        text: str = msgspec.msgpack.decode(files.read_file(f), type=str)
    except (msgspec.DecodeError, OSError, ValueError, GpuprofError):
        f.unlink(missing_ok=True)
        return None
    try:
        os.utime(f)  # entries are evicted least recently used first
    except OSError:
        pass
    return text
