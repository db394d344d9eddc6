"""A parse cache: each trace's frames as Parquet, keyed by the file's content and gpuprof's version.

Decoding a multi-GB JSON trace dominates a report; the frames it yields are a fraction of its size
and read back in a fraction of the time. An entry lives in ``$GPUPROF_CACHE_DIR`` (default
``$XDG_CACHE_HOME/gpuprof``, else ``~/.cache/gpuprof``) under XXH3-128(file bytes) + size + gpuprof version
+ cache format. It is written to a temporary folder and renamed into place, so a reader never
sees half an entry; one that cannot be read, or whose recorded key differs, is deleted and rebuilt,
never trusted.

Beside the frames it keeps results (see ``get_result``): a rank's summary part and its findings'
contributions, keyed by the trace's content key, every option that shapes them, and a hash of
gpuprof's own source, so a second report of an unchanged trace loads nothing it does not need.
"""

from __future__ import annotations

import dataclasses
import json
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd
import xxhash

import gpuprof
from gpuprof.trace.model import RankTrace, TraceMeta

FORMAT = 2
FRAMES = ("kernels", "memcpys", "ops", "runtime", "annotations", "steps", "collectives")


def cache_dir() -> Path:
    if os.environ.get("GPUPROF_CACHE_DIR"):
        return Path(os.environ["GPUPROF_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpuprof"


_KEYS: dict[tuple[str, int, int], str] = {}


def content_key(path: Path) -> str:
    """The cache key of a trace file: a 128-bit XXH3 hash of its bytes (about 5 GB/s here, where
    BLAKE2b took a quarter of a cached report), its size, the gpuprof version and the cache format.
    Remembered within a process while the file's size and modification time stay the same."""
    st = path.stat()
    memo = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if memo in _KEYS:
        return _KEYS[memo]
    _KEYS[memo] = key = _hash_file(path)
    return key


def _hash_file(path: Path) -> str:
    h = xxhash.xxh3_128()
    size = 0
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 22), b""):
            h.update(block)
            size += len(block)
    return f"{h.hexdigest()}-{size}-v{gpuprof.__version__}-f{FORMAT}"


def load(path: Path, key: str, root: Path | None = None) -> RankTrace | None:
    """The cached trace for ``key``, or None (a bad entry is removed so it gets rebuilt)."""
    entry = (root or cache_dir()) / key
    if not entry.is_dir():
        return None
    try:
        meta = json.loads((entry / "meta.json").read_text())
        if meta.get("key") != key:
            raise ValueError("key mismatch")
        frames = {name: pd.read_parquet(entry / f"{name}.parquet") for name in FRAMES}
        for name, cols in meta["categoricals"].items():  # an all-null categorical reads back as float
            frames[name] = frames[name].astype({c: "category" for c in cols})
        m = meta["meta"]
        m["warnings"] = tuple(m.get("warnings", ()))
        m["path"] = str(path)
        _touch(entry)
        return RankTrace(meta=TraceMeta(**m), **frames)
    except Exception:  # anything wrong with an entry: rebuild it from the trace
        shutil.rmtree(entry, ignore_errors=True)
        return None


def store(trace: RankTrace, key: str, root: Path | None = None) -> None:
    """Write an entry; failures (read-only disk, no space) only mean no cache."""
    base = root or cache_dir()
    try:
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=base))
        for name in FRAMES:
            getattr(trace, name).to_parquet(tmp / f"{name}.parquet", index=False)
        cats = {name: [c for c, t in getattr(trace, name).dtypes.items() if isinstance(t, pd.CategoricalDtype)]
                for name in FRAMES}
        (tmp / "meta.json").write_text(json.dumps({"key": key, "meta": dataclasses.asdict(trace.meta),
                                                   "categoricals": cats}, default=_json))
        try:
            os.replace(tmp, base / key)
            prune(base)
        except OSError:  # another process stored it first
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception:
        shutil.rmtree(locals().get("tmp", base / ".none"), ignore_errors=True)


def _json(o: Any) -> Any:
    if isinstance(o, tuple):
        return list(o)
    return str(o)


# --- results ---------------------------------------------------------------------------------
# What a rank's analysis yields (its summary part, its findings' contributions) is kept too, so
# a second report of an unchanged trace with the same options skips loading it. The key covers
# every input: the trace's content key, the options, and a hash of gpuprof's own code (so an
# edited analyzer never reads a result computed by the old one). Values are pickles in the same
# cache folder: an unreadable one is deleted and recomputed.

_CODE_HASH: str | None = None


def code_hash() -> str:
    """XXH3 of every Python source file of gpuprof and its analyzers and reports (a few ms)."""
    global _CODE_HASH
    if _CODE_HASH is None:
        import gpuprof.analyzers
        import gpuprof.reports

        h = xxhash.xxh3_128()
        roots = {Path(m.__file__).resolve().parent for m in (gpuprof, gpuprof.analyzers, gpuprof.reports)
                 if m.__file__}
        for root in sorted(roots):
            for f in sorted(root.rglob("*.py")):
                h.update(str(f.relative_to(root)).encode())
                h.update(f.read_bytes())
        _CODE_HASH = h.hexdigest()
    return _CODE_HASH


def result_key(*parts: Any) -> str:
    """A key for a result computed from ``parts`` (plain values: strings, numbers, tuples, None)."""
    return "r-" + xxhash.xxh3_128(repr((code_hash(), FORMAT, parts)).encode()).hexdigest()


def get_result(key: str, root: Path | None = None) -> Any:
    f = (root or cache_dir()) / "results" / f"{key}.pkl"
    if not f.is_file():
        return None
    try:
        with open(f, "rb") as fh:
            value = pickle.load(fh)
        _touch(f)
        return value
    except Exception:  # truncated or from an incompatible version: recompute
        f.unlink(missing_ok=True)
        return None


def put_result(key: str, value: Any, root: Path | None = None) -> None:
    base = (root or cache_dir()) / "results"
    try:
        base.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=base)
        with os.fdopen(fd, "wb") as fh:
            pickle.dump(value, fh, protocol=pickle.HIGHEST_PROTOCOL)
        os.replace(tmp, base / f"{key}.pkl")
        prune(base.parent)
    except Exception:
        if "tmp" in locals():
            Path(locals()["tmp"]).unlink(missing_ok=True)


# --- size ------------------------------------------------------------------------------------

def max_bytes() -> int:
    """The cache's size limit: ``$GPUPROF_CACHE_MAX_GB`` (default 20)."""
    try:
        return int(float(os.environ.get("GPUPROF_CACHE_MAX_GB", "20")) * 2**30)
    except ValueError:
        return 20 * 2**30


def _touch(p: Path) -> None:
    try:
        os.utime(p)  # entries are evicted least recently used first
    except OSError:
        pass


def prune(root: Path | None = None, limit: int | None = None) -> list[Path]:
    """Delete the least recently used entries (trace frames and results) until the cache fits in
    ``limit`` bytes (default ``max_bytes()``); returns what was deleted."""
    base = root or cache_dir()
    limit = max_bytes() if limit is None else limit
    entries: list[tuple[float, int, Path]] = []
    try:
        for e in base.iterdir():
            if e.name.startswith(".tmp-") or e.name == "results":
                continue
            if e.is_dir():
                entries.append((e.stat().st_mtime, sum(f.stat().st_size for f in e.iterdir()), e))
        if (base / "results").is_dir():
            entries += [(f.stat().st_mtime, f.stat().st_size, f) for f in (base / "results").iterdir()
                        if f.suffix == ".pkl"]
    except OSError:
        return []
    total = sum(size for _, size, _ in entries)
    gone = []
    for _, size, e in sorted(entries, key=lambda x: x[0]):
        if total <= limit:
            break
        if e.is_dir():
            shutil.rmtree(e, ignore_errors=True)
        else:
            e.unlink(missing_ok=True)
        total -= size
        gone.append(e)
    return gone
