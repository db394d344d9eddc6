"""A parse cache: each trace's frames as Parquet, keyed by the file's content and gpuprof's version.

Decoding a multi-GB JSON trace dominates a report; the frames it yields are a fraction of its size
and read back in a fraction of the time. An entry lives in ``$GPUPROF_CACHE_DIR`` (default
``$XDG_CACHE_HOME/gpuprof``, else ``~/.cache/gpuprof``) under XXH3-128(file bytes) + size + gpuprof version
+ cache format. It is written to a temporary folder and renamed into place, so a reader never
sees half an entry; one that cannot be read, or whose recorded key differs, is deleted and rebuilt,
never trusted.
"""

from __future__ import annotations

import dataclasses
import json
import os
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


def content_key(path: Path) -> str:
    """The cache key of a trace file: a 128-bit XXH3 hash of its bytes (about 5 GB/s here, where
    BLAKE2b took a quarter of a cached report), its size, the gpuprof version and the cache format."""
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
        except OSError:  # another process stored it first
            shutil.rmtree(tmp, ignore_errors=True)
    except Exception:
        shutil.rmtree(locals().get("tmp", base / ".none"), ignore_errors=True)


def _json(o: Any) -> Any:
    if isinstance(o, tuple):
        return list(o)
    return str(o)
