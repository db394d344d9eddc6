"""The caches: each trace's frames, and what analysing a rank yields, kept as plain data.

Decoding a multi-GB JSON trace dominates a report; the frames it yields are a fraction of its size
and read back in a fraction of the time. Nothing here is ever code: frames are Parquet (pyarrow),
everything else msgpack decoded by msgspec into explicit types, so an entry planted by whoever can
write to the cache folder (a shared team cache, a world-writable temp dir) is at worst wrong data
that fails validation and is rebuilt, never something that runs. A cache writer can still plant
*valid* wrong data; keep the cache private (the default ``~/.cache/gpuprof``) to trust its content.

Layout under ``$GPUPROF_CACHE_DIR`` (default ``$XDG_CACHE_HOME/gpuprof``, else ``~/.cache/gpuprof``)::

    CACHEDIR.TAG            marker: the folder holds a gpuprof cache (and backup tools skip it)
    frames/<key>/           one trace's frames: meta.json + <frame>.parquet
    results/r-<hash>.msgpack  one result (a rank's summary part, its contributions, a whole report)

``<key>`` is the BLAKE3 hash of the trace file's bytes, its size, gpuprof's version and the cache
format. The bytes hashed are the bytes parsed (see :func:`gpuprof.jobs.load_trace_keyed`), so a
file replaced while a report runs cannot file one content's frames under another's key. Entries
are written to a temporary name and renamed into place; one that cannot be read, fails its types
or whose recorded key differs is deleted and rebuilt. Pruning deletes only what matches this
layout exactly (our names, our marker), never anything else in the folder.
"""

from __future__ import annotations

import io
import math
import os
import re
import shutil
import tempfile
import time
import warnings
import dataclasses
from dataclasses import fields, is_dataclass
from pathlib import Path
from typing import Any, cast

import msgspec
import numpy as np
import pandas as pd
import pyarrow as pa

import gpuprof
from gpuprof import files
# Keys (and the report cache) live apart so that a cached report needs no pandas or pyarrow.
from gpuprof.cache_keys import (  # (re-exported: callers use them from here)
    FORMAT, cache_dir, content_key, hash_bytes, key_of, remember, source_hash, stat_id)
from gpuprof.errors import GpuprofWarning
from gpuprof.trace.model import RankTrace, TraceMeta

FRAMES = ("kernels", "memcpys", "ops", "runtime", "annotations", "steps", "collectives", "python", "memory")
MARKER = "CACHEDIR.TAG"
_MARKER_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
                "# This folder is a gpuprof cache (frames/, results/); gpuprof deletes only what it wrote there.\n")
_KEY = re.compile(r"^[0-9a-f]{64}-\d+-v[0-9A-Za-z.+_-]+-f\d+$")
_RESULT = re.compile(r"^r-[0-9a-f]{64}\.msgpack$")
_TMP = "gpuprof-tmp-"
_STALE_TMP_S = 3600.0  # a temporary entry older than this was left by a killed process


# --- trace frames ----------------------------------------------------------------------------

class _FrameMeta(msgspec.Struct, forbid_unknown_fields=True):
    key: str
    format: int
    meta: TraceMeta
    dtypes: dict[str, dict[str, str]]  # frame -> column -> dtype as written


_FRAME_META = msgspec.json.Decoder(_FrameMeta)


#: What a cache folder holds besides the marker: a folder holding other names is not ours.
_LAYOUT = {"frames", "results", MARKER}
_REFUSED: set[str] = set()


def _ensure_root(base: Path) -> bool:
    """Whether ``base`` may hold the cache, marking it (``CACHEDIR.TAG``) when gpuprof creates it
    or finds it empty. A folder that already holds other files and no marker is the user's (a
    ``GPUPROF_CACHE_DIR`` pointed at their data): it is neither marked (``tar --exclude-caches``
    and backup tools would then skip their data) nor written into, and one line on stderr says
    so, once per process."""
    tag = base / MARKER
    if tag.is_file() and not tag.is_symlink():
        return True
    try:
        if base.is_dir():
            foreign = sorted(n for n in os.listdir(base) if n not in _LAYOUT)
            if foreign:
                if str(base) not in _REFUSED:
                    _REFUSED.add(str(base))
                    warnings.warn(GpuprofWarning(
                        f"{base}: the cache folder holds files gpuprof did not write ({foreign[0]!r}"
                        f"{f' and {len(foreign) - 1} more' if len(foreign) > 1 else ''}) and no {MARKER}: not used "
                        "as a cache (set GPUPROF_CACHE_DIR to an empty or new folder)"), stacklevel=2)
                return False
        else:
            base.mkdir(parents=True, exist_ok=True)
        with open(tag, "x", encoding="utf-8") as f:
            f.write(_MARKER_TEXT)
    except FileExistsError:
        pass
    except OSError:
        return False
    return True


def _frames_dir(root: Path | None) -> Path:
    return (root or cache_dir()) / "frames"


def load(path: Path, key: str, root: Path | None = None) -> RankTrace | None:
    """The cached trace for ``key``, or None (a bad entry is removed so it gets rebuilt)."""
    if not _KEY.match(key):
        return None
    entry = _frames_dir(root) / key
    if not entry.is_dir() or entry.is_symlink():
        return None
    try:
        doc = _FRAME_META.decode(files.read(entry / "meta.json", inside=entry, max_bytes=files.SMALL_FILE_BYTES))
        if doc.key != key or doc.format != FORMAT or set(doc.dtypes) != set(FRAMES):
            raise ValueError("key or format mismatch")
        frames = {}
        for name in FRAMES:
            f = entry / f"{name}.parquet"
            if f.is_symlink():
                raise ValueError("not our file")
            df = pd.read_parquet(io.BytesIO(files.read_file(f)))  # a regular file (a FIFO would block)
            want = doc.dtypes[name]
            if list(df.columns) != list(want):
                raise ValueError(f"{name}: columns differ")
            cats = [c for c, t in want.items() if t == "category" and not isinstance(df[c].dtype, pd.CategoricalDtype)]
            if cats:  # an all-null categorical reads back as float
                df = df.astype({c: "category" for c in cats})
            if {c: str(t) for c, t in df.dtypes.items()} != want:
                raise ValueError(f"{name}: dtypes differ")
            frames[name] = df
        _touch(entry)
        return RankTrace(meta=dataclasses.replace(doc.meta, path=str(path), content_key=key), **frames)
    except Exception:  # anything wrong with an entry: rebuild it from the trace
        _remove(entry)
        return None


def store(trace: RankTrace, key: str, root: Path | None = None) -> None:
    """Write an entry; failures (read-only disk, no space) only mean no cache."""
    if not _KEY.match(key):
        return
    base = _frames_dir(root)
    tmp: Path | None = None
    try:
        if not _ensure_root(base.parent):
            return
        base.mkdir(exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=_TMP, dir=base))
        dtypes = {}
        for name in FRAMES:
            df = getattr(trace, name)
            df.to_parquet(tmp / f"{name}.parquet", index=False)
            dtypes[name] = {str(c): str(t) for c, t in df.dtypes.items()}
        doc = _FrameMeta(key=key, format=FORMAT, meta=trace.meta, dtypes=dtypes)
        (tmp / "meta.json").write_bytes(msgspec.json.encode(doc))
        try:
            os.replace(tmp, base / key)
            tmp = None
            prune(base.parent)
        except OSError:  # another process stored it first
            pass
    except Exception:
        pass
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


# --- results ---------------------------------------------------------------------------------
# What a rank's analysis yields (its summary part, its findings' contributions) is kept too, so
# a second report of an unchanged trace with the same options skips loading it. The key covers
# every input: the content key of the bytes it was computed from, the options, and a hash of
# gpuprof's own code (so an edited analyzer never reads a result computed by the old one).
# Values are msgpack, decoded into the caller's declared type (dataclasses, tuples, frames); a
# value that would not come back identical is not stored at all.

_CODE_HASH: str | None = None


def code_hash() -> str:
    """BLAKE3 of every Python source file of gpuprof and its analyzers and reports, and of its
    shipped tables (:func:`gpuprof.cache_keys.source_files`; a few ms)."""
    global _CODE_HASH
    if _CODE_HASH is None:
        _CODE_HASH = source_hash()
    return _CODE_HASH


def result_key(*parts: Any) -> str:
    """A key for a result computed from ``parts`` (plain values: strings, numbers, tuples, None)."""
    return "r-" + hash_bytes(repr((code_hash(), FORMAT, parts)).encode())


def _result_file(key: str, root: Path | None) -> Path | None:
    if not _RESULT.match(f"{key}.msgpack"):
        return None
    return (root or cache_dir()) / "results" / f"{key}.msgpack"


def get_result(key: str, kind: Any, root: Path | None = None) -> Any:
    """The result stored under ``key`` decoded as type ``kind``, or None (absent, unreadable, or
    not of that type: the entry is deleted and the caller recomputes)."""
    f = _result_file(key, root)
    if f is None or not f.is_file() or f.is_symlink():
        return None
    try:
        value = decode(files.read_file(f), kind)
        _touch(f)
        return value
    except Exception:  # truncated, tampered or from an incompatible version: recompute
        f.unlink(missing_ok=True)
        return None


def put_result(key: str, value: Any, kind: Any, root: Path | None = None) -> None:
    f = _result_file(key, root)
    if f is None:
        return
    tmp: str | None = None
    try:
        data = encode(value)
        if not same(decode(data, kind), value):
            return  # would not come back identical (e.g. a tuple inside free-form evidence): keep no copy
        if not _ensure_root(f.parent.parent):
            return
        f.parent.mkdir(exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=_TMP, dir=f.parent)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, f)
        tmp = None
        prune(f.parent.parent)
    except Exception:
        pass
    finally:
        if tmp is not None:
            Path(tmp).unlink(missing_ok=True)


# --- the value codec -------------------------------------------------------------------------
# Frames inside results travel as Arrow IPC streams of plain columns with an explicit per-column
# kind; decoding rebuilds only those kinds (numbers, booleans, strings, bytes, categoricals with
# string categories) and rejects anything else.

class _Column(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    name: str
    kind: str  # a numpy dtype name ("int64", "float64", "bool"...), "object:str", "object:bytes", "object:none",
    #            "string:<storage>" (pandas' string dtype), or "category:<dtype of the categories>"
    categories: list[str] | None = None


class _Frame(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    columns: list[_Column]
    index: tuple[int, int, int] | None  # a RangeIndex (start, stop, step), else the "__index__" column
    data: bytes


_NUMERIC = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64", "float32", "float64"}
_ARROW_OF = {k: pa.from_numpy_dtype(np.dtype(k)) for k in _NUMERIC}
_OBJECT_ARROW = {"object:str": pa.string(), "object:bytes": pa.binary(), "object:none": pa.null()}
_STRING_STORAGE = ("python", "pyarrow")


def _string_dtype(storage: str) -> Any:
    return cast(Any, pd.StringDtype)(storage, na_value=np.nan)  # pandas' default "str" dtype


def _object_kind(values: np.ndarray) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "object:none"
    if all(type(v) is str for v in present):
        return "object:str"
    if all(type(v) is bytes for v in present):
        return "object:bytes"
    raise TypeError("an object column holds values other than str, bytes or None")


def _is_default_string(dt: Any) -> bool:
    storage = getattr(dt, "storage", None)
    return isinstance(dt, pd.StringDtype) and storage in _STRING_STORAGE and bool(dt == _string_dtype(str(storage)))


def _column(name: Any, s: pd.Series) -> tuple[_Column, pa.Array]:
    if not isinstance(name, str):
        raise TypeError(f"column name {name!r} is not a string")
    dt = s.dtype
    if isinstance(dt, pd.CategoricalDtype):
        cats = dt.categories
        if dt.ordered or not all(type(c) is str for c in cats):
            raise TypeError(f"{name}: only unordered string categories are kept")
        if cats.dtype == object:
            kind = "category:object"
        elif _is_default_string(cats.dtype):
            kind = f"category:string:{getattr(cats.dtype, 'storage')}"
        else:
            raise TypeError(f"{name}: categories of dtype {cats.dtype} are not kept")
        return _Column(name, kind, [str(c) for c in cats]), pa.array(s.cat.codes.to_numpy())
    if isinstance(dt, np.dtype) and dt.name in _NUMERIC:
        return _Column(name, dt.name), pa.array(s.to_numpy(), type=_ARROW_OF[dt.name])
    if _is_default_string(dt):
        values = s.astype(object).where(s.notna(), None).to_numpy()
        return _Column(name, f"string:{getattr(dt, 'storage')}"), pa.array(list(values), type=pa.string())
    if dt == object:
        kind = _object_kind(s.to_numpy())
        return _Column(name, kind), pa.array(list(s.to_numpy()), type=_OBJECT_ARROW[kind])
    raise TypeError(f"{name}: dtype {dt} is not kept")


def _encode_frame(df: pd.DataFrame) -> _Frame:
    cols, arrays = [], []
    for name in df.columns:
        c, a = _column(name, df[name])
        cols.append(c)
        arrays.append(a)
    index: tuple[int, int, int] | None
    if isinstance(df.index, pd.RangeIndex) and df.index.name is None:
        index = (df.index.start, df.index.stop, df.index.step)
    elif df.index.dtype == np.int64 and df.index.name is None:
        index = None
        arrays.append(pa.array(df.index.to_numpy()))
    else:
        raise TypeError("only unnamed RangeIndex or int64 indexes are kept")
    if df.columns.dtype != object and not _is_default_string(df.columns.dtype):
        raise TypeError("column labels must be strings")
    names = [c.name for c in cols] + ([] if index is not None else ["__index__"])
    table = pa.Table.from_arrays(arrays, names=names)
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return _Frame(cols, index, sink.getvalue().to_pybytes())


def _strings(arr: pa.Array, what: str) -> list[Any]:
    if arr.type != pa.string():
        raise ValueError(f"{what}: not a string column")
    return list(arr.to_pylist())


def _decode_column(c: _Column, arr: pa.Array) -> Any:
    if c.kind in _NUMERIC:
        if arr.type != _ARROW_OF[c.kind] or arr.null_count:
            raise ValueError(f"{c.name}: not a {c.kind} column")
        return arr.to_numpy(zero_copy_only=False).astype(c.kind, copy=True)
    if c.kind.startswith("category:"):
        if c.categories is None or not pa.types.is_integer(arr.type) or arr.null_count:
            raise ValueError(f"{c.name}: not a categorical column")
        codes = arr.to_numpy(zero_copy_only=False)
        if len(codes) and (codes.min() < -1 or codes.max() >= len(c.categories)):
            raise ValueError(f"{c.name}: category codes out of range")
        sub = c.kind[len("category:"):]
        if sub == "object":
            cats = pd.Index(c.categories, dtype=object)
        elif sub.startswith("string:") and sub[len("string:"):] in _STRING_STORAGE:
            cats = pd.Index(c.categories, dtype=_string_dtype(sub[len("string:"):]))
        else:
            raise ValueError(f"{c.name}: unknown categories kind {sub!r}")
        return pd.Categorical.from_codes(codes, dtype=pd.CategoricalDtype(cats, ordered=False))
    if c.kind.startswith("string:") and c.kind[len("string:"):] in _STRING_STORAGE:
        return pd.array(_strings(arr, c.name), dtype=_string_dtype(c.kind[len("string:"):]))
    if c.kind in _OBJECT_ARROW:
        if arr.type != _OBJECT_ARROW[c.kind]:
            raise ValueError(f"{c.name}: not an {c.kind} column")
        values = np.empty(len(arr), dtype=object)
        values[:] = arr.to_pylist()
        return values
    raise ValueError(f"{c.name}: unknown column kind {c.kind!r}")


def _decode_frame(f: _Frame) -> pd.DataFrame:
    table = pa.ipc.open_stream(f.data).read_all()
    names = [c.name for c in f.columns] + ([] if f.index is not None else ["__index__"])
    if table.column_names != names:
        raise ValueError("frame columns differ from its schema")
    out = {c.name: _decode_column(c, col.combine_chunks()) for c, col in zip(f.columns, table.columns)}
    if f.index is not None:
        index: pd.Index = pd.RangeIndex(*f.index)
    else:
        idx = table.column("__index__").combine_chunks()
        if idx.type != pa.int64() or idx.null_count:
            raise ValueError("index is not int64")
        index = pd.Index(idx.to_numpy(zero_copy_only=False).astype(np.int64), dtype=np.int64)
    if len(index) != table.num_rows:
        raise ValueError("index length differs from the rows")
    return pd.DataFrame(out, index=index, columns=[c.name for c in f.columns])


def _enc_hook(o: Any) -> Any:
    if isinstance(o, pd.DataFrame):
        return _encode_frame(o)
    if isinstance(o, (np.integer, np.floating, np.bool_)):
        return o.item()  # comes back as the Python number with the same value (see ``same``)
    raise TypeError(f"{type(o).__name__} is not kept in the results cache")


def _dec_hook(kind: type, obj: Any) -> Any:
    if kind is pd.DataFrame:
        return _decode_frame(msgspec.convert(obj, _Frame))
    raise TypeError(f"{kind} is not a type the results cache decodes")


_ENCODER = msgspec.msgpack.Encoder(enc_hook=_enc_hook)
_DECODERS: dict[Any, msgspec.msgpack.Decoder[Any]] = {}


def encode(value: Any) -> bytes:
    return _ENCODER.encode(value)


def decode(data: bytes, kind: Any) -> Any:
    """``data`` as a value of type ``kind``; raises (msgspec.ValidationError, ValueError...) on
    anything else: wrong types, extra or missing fields, truncation, a pickle or any other payload."""
    dec = _DECODERS.get(kind)
    if dec is None:
        dec = _DECODERS[kind] = msgspec.msgpack.Decoder(kind, dec_hook=_dec_hook)
    return dec.decode(data)


def same(a: Any, b: Any) -> bool:
    """Deep equality that also requires equal types (a tuple is not a list) and treats NaN as equal
    to NaN: what "round-trips exactly" means here."""
    if isinstance(a, (float, np.floating)) and isinstance(b, (float, np.floating)):  # numpy scalars come back
        return bool(a == b) or (math.isnan(a) and math.isnan(b))                     # as Python numbers
    if isinstance(a, (np.integer, np.bool_)):
        a = a.item()
    if type(a) is not type(b):
        return False
    if isinstance(a, pd.DataFrame):
        try:
            pd.testing.assert_frame_equal(a, b, check_exact=True, check_column_type=True,
                                          check_index_type=True, check_categorical=True)
            return True
        except AssertionError:
            return False
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[k], b[k]) for k in a)
    if is_dataclass(a) and not isinstance(a, type):
        return all(same(getattr(a, f.name), getattr(b, f.name)) for f in fields(a))
    return bool(a == b)


# --- size ------------------------------------------------------------------------------------

def max_bytes() -> int:
    """The cache's size limit: ``$GPUPROF_CACHE_MAX_GB`` (default 20)."""
    try:
        gb = float(os.environ.get("GPUPROF_CACHE_MAX_GB", "20"))
    except ValueError:
        gb = 20.0
    return int(gb * 2**30) if math.isfinite(gb) and gb >= 0 else 20 * 2**30


def _touch(p: Path) -> None:
    try:
        os.utime(p)  # entries are evicted least recently used first
    except OSError:
        pass


def _remove(p: Path) -> None:
    if p.is_symlink():
        p.unlink(missing_ok=True)
    elif p.is_dir():
        shutil.rmtree(p, ignore_errors=True)
    else:
        p.unlink(missing_ok=True)


def _ours(e: Path) -> bool:
    """An entry this module wrote: a real folder named like a key holding only meta.json and
    our Parquet files."""
    if e.is_symlink() or not e.is_dir() or not _KEY.match(e.name):
        return False
    allowed = {"meta.json", *(f"{n}.parquet" for n in FRAMES)}
    names = {f.name for f in e.iterdir()}
    return "meta.json" in names and names <= allowed


def entries(root: Path | None = None) -> list[tuple[float, int, Path]]:
    """(last use, bytes, path) of every entry gpuprof wrote under ``root``; nothing else is listed,
    and nothing at all without the cache marker."""
    base = root or cache_dir()
    out: list[tuple[float, int, Path]] = []
    if not (base / MARKER).is_file():
        return out
    frames, results = base / "frames", base / "results"
    now = time.time()
    if frames.is_dir() and not frames.is_symlink():
        for e in frames.iterdir():
            try:
                if e.name.startswith(_TMP) and e.is_dir() and not e.is_symlink():
                    if now - e.stat().st_mtime > _STALE_TMP_S:
                        shutil.rmtree(e, ignore_errors=True)  # left by a killed process
                elif _ours(e):
                    out.append((e.stat().st_mtime, sum(f.stat().st_size for f in e.iterdir()), e))
            except OSError:
                continue
    if results.is_dir() and not results.is_symlink():
        for f in results.iterdir():
            try:
                if _RESULT.match(f.name) and f.is_file() and not f.is_symlink():
                    st = f.stat()
                    out.append((st.st_mtime, st.st_size, f))
            except OSError:
                continue
    return out


def prune(root: Path | None = None, limit: int | None = None) -> list[Path]:
    """Delete the least recently used entries (trace frames and results) until the cache fits in
    ``limit`` bytes (default ``max_bytes()``); returns what was deleted. Only entries of this
    layout are counted or deleted: other files and folders in the cache folder are left alone."""
    limit = max_bytes() if limit is None else limit
    found = entries(root)
    total = sum(size for _, size, _ in found)
    gone = []
    for _, size, e in sorted(found, key=lambda x: x[0]):
        if total <= limit:
            break
        _remove(e)
        total -= size
        gone.append(e)
    return gone


__all__ = ["FORMAT", "FRAMES", "cache_dir", "content_key", "get_result", "hash_bytes", "key_of", "load", "prune",
           "put_result", "remember", "source_hash", "stat_id", "store"]
