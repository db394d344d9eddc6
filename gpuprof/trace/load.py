"""Load a Kineto chrome-trace JSON file (plain or compressed) into a :class:`RankTrace`.

The file is read once (bounded, :mod:`gpuprof.files`) and its events decoded to columns by the
C scanner (:mod:`gpuprof.trace.native`), or, where that does not apply, by msgspec a chunk at a
time (:mod:`gpuprof.trace.chunks`); both give the same columns. Here they become the trace's
frames: times from the trace's origin, names categorical, damage refused in one line, the
trace's warnings written, and the links between events attached (:mod:`gpuprof.trace.links`).
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import itertools
import re
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpuprof import files
from gpuprof.errors import TraceError
from gpuprof.trace.chunks import TraceFile, empty_columns, from_chunks
from gpuprof.trace.kineto import MAX_ABS_TS_US, MAX_DUR_US
from gpuprof.trace.links import attach_links
from gpuprof.trace.model import RankTrace
from gpuprof.trace.names import is_comm, kernel_classes
from gpuprof.trace.native import from_columns

_RANK_IN_NAME = re.compile(r"(?:rank|_r|-r)[_-]?(\d+)", re.IGNORECASE)
#: Characters of an event name kept (names beyond are cut; see ``_bound_names``).
MAX_NAME = 8192
#: ts above this (µs) is Unix time (after 2001-09-09); below it, a trace's own clock (ROCm's
#: monotonic clock in some HIP traces), which lines up with other ranks of one host only.
_EPOCH_US = 1e15
_MEMCPY_NAME = re.compile(r"^Memcpy (\w+) \((\w+) -> (\w+)\)")

# The bounded reader every file goes through (kept importable from here, where it began).
GUNZIP_MAX_RATIO = files.GUNZIP_MAX_RATIO
gunzip_limit = files.gunzip_limit
decompress = files.decompress


def read_bytes(path: Path) -> bytes:
    """A regular file's contents, decompressed by content (bounded): :func:`gpuprof.files.read`."""
    return files.read(path)


def parse_arg(text: bytes | str | None) -> Any:
    """Parse an op argument column value (``input_dims``, ``concrete_inputs``, ...) to Python."""
    if text is None:
        return None
    try:
        value = msgspec.json.decode(text)
    except (msgspec.DecodeError, RecursionError):  # RecursionError: nested past msgspec's depth limit
        return None
    return value if _int64_only(value) else None


def _int64_only(value: Any) -> bool:
    """Whether every integer in ``value`` fits int64: a shape or scalar beyond is no tensor's, and
    its products would overflow every cost formula."""
    stack = [value]
    while stack:
        v = stack.pop()
        if type(v) is int:
            if not -2 ** 63 <= v < 2 ** 63:
                return False
        elif type(v) is list:
            stack.extend(v)
        elif type(v) is dict:
            stack.extend(v.values())
    return True


#: Columns stored as categoricals, per bucket (besides ``name``).
_CATEGORICAL = {"kernels": ("collective", "coll_dtype", "process_group"), "runtime": ("api",)}


def _frame(chunks: list[dict[str, Any]], bucket: str, t_origin: float, names: dict[str, int]) -> pd.DataFrame:
    """One bucket's chunks as a frame: times relative to ``t_origin``, names categorical."""
    if not chunks:  # the columns of no events
        chunks = [empty_columns(bucket)]
    cols: dict[str, Any] = {}
    for c in chunks[0]:
        parts = [ch[c] for ch in chunks]
        if isinstance(parts[0], np.ndarray):
            cols[c] = np.concatenate(parts) if len(parts) > 1 else parts[0]
        else:
            cols[c] = list(itertools.chain.from_iterable(parts))
    chunks.clear()
    cols["name"] = pd.Categorical.from_codes(cols["name"], categories=pd.Index(list(names), dtype=object))
    for c in _CATEGORICAL.get(bucket, ()):
        cols[c] = pd.Categorical(cols[c])
    for c in ("input_dims", "input_types", "input_strides", "concrete_inputs"):
        if c in cols:
            cols[c] = pd.Series(cols[c], dtype=object)
    return _finish(pd.DataFrame(cols), bucket, t_origin)


def _finish(df: pd.DataFrame, bucket: str, t_origin: float) -> pd.DataFrame:
    df["ts"] = df["ts"] - t_origin
    df.insert(list(df.columns).index("dur") + 1, "end", df["ts"] + df["dur"])
    names: list[str] = list(df["name"].cat.categories)
    codes = df["name"].cat.codes.to_numpy()
    if bucket == "kernels":
        df.insert(list(df.columns).index("occupancy") + 1, "is_comm", is_comm(df["name"]))
        df.insert(list(df.columns).index("is_comm") + 1, "name_class",
                  pd.Series(pd.Categorical(kernel_classes(df["name"])), index=df.index))
    if bucket == "memcpys":
        parsed = [_MEMCPY_NAME.match(n) for n in names]
        for i, (col, memset) in enumerate((("kind", "Memset"), ("src", "Device"), ("dst", "Device")), start=1):
            per_name = np.array([m.group(i) if m else (memset if n.startswith("Memset") else "Unknown")
                                 for m, n in zip(parsed, names)], dtype=object)
            df[col] = pd.Categorical(per_name[codes] if len(names) else [])
    return df


def _rank_of(doc: TraceFile, path: Path, fallback: int) -> tuple[int, int]:
    info = doc.distributedInfo if isinstance(doc.distributedInfo, dict) else {}
    rank, world = info.get("rank"), info.get("world_size")
    if isinstance(rank, int):
        return rank, world if isinstance(world, int) and world > 0 else 1
    m = _RANK_IN_NAME.search(path.name)
    if m:
        return int(m.group(1)), world if isinstance(world, int) and world > 0 else 1
    return fallback, world if isinstance(world, int) and world > 0 else 1


def _bound_names(names: dict[str, int], path: Path) -> int:
    """Cut names past ``MAX_NAME`` characters in place (codes unchanged); how many were cut.

    Every later step (regexes on kernel names, tables, reports) is linear or worse in a name's
    length; a 500 MB name took minutes. Real names stay far below (CUTLASS templates: ~2 KB)."""
    long = [n for n in names if len(n) > MAX_NAME]
    if not long:
        return 0
    items = list(names.items())
    names.clear()
    for n, code in items:
        if len(n) > MAX_NAME:
            digest = hashlib.blake2b(n.encode("utf-8", "surrogatepass"), digest_size=8).hexdigest()
            n = f"{n[:MAX_NAME]}…[{len(n):,} chars, {digest}]"
        names[n] = code
    if len(names) != len(items):  # two cut names with one digest: never seen, but codes must stay aligned
        raise TraceError("event names too long to keep apart", str(path))
    return len(long)


def _check_times(p: Path, bucket: str, cols: dict[str, Any], names: dict[str, int]) -> None:
    """Refuse times no profiler writes (``ts`` of 1e308, ``dur`` of 1e300, ±inf), naming the event."""
    for field, bad in (("ts", ~(np.abs(cols["ts"]) < MAX_ABS_TS_US)), ("dur", ~(cols["dur"] < MAX_DUR_US))):
        hit = np.flatnonzero(bad)
        if len(hit):
            name = list(names)[cols["name"][hit[0]]]
            value = cols[field][hit[0]]
            raise TraceError(f"a {bucket} event ({name[:80]!r}) has '{field}' {value:g} µs, beyond any profiled time",
                             str(p))


def load_trace(path: str | Path, fallback_rank: int = 0, source: list[bytes] | None = None) -> RankTrace:
    """Load one Kineto trace file into a :class:`RankTrace`; raises :class:`TraceError` on bad input.

    ``source``, when given, holds the file's bytes already read (``[files.read_file(path)]``): they are
    parsed instead of reading the file again, so a caller that hashed them knows exactly what was
    parsed. The list is emptied, so the buffer is freed as early as if it had been read here."""
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of small acyclic objects: collection passes would only cost time
    try:
        return _load(Path(path), fallback_rank, source)
    finally:
        if gc_was_on:
            gc.enable()


def _load(p: Path, fallback_rank: int, source: list[bytes] | None = None) -> RankTrace:
    box = [files.unpack(p, source.pop()) if source else read_bytes(p)]  # the file's bytes, held only here
    parts = from_columns(box)
    if parts is None:  # no scanner, or a file it does not take: msgspec, chunk by chunk
        parts = from_chunks(p, box.pop())
    box.clear()  # the file's buffer: every column now holds its own copies
    doc, n_events, chunks, names, memory = parts
    del parts
    first_ts = np.inf
    for b, cs in chunks.items():
        if b == "python":  # frames only annotate host time: they never set the trace's origin
            continue
        for c in cs:
            bad = np.flatnonzero(np.isnan(c["ts"]))
            if len(bad):
                name = list(names[b])[c["name"][bad[0]]]
                raise TraceError(f"a {b} event ({name!r}) has a non-numeric 'ts'", str(p))
            _check_times(p, b, c, names[b])
            if len(c["ts"]):
                first_ts = min(first_ts, float(c["ts"].min()))
    if not np.isfinite(first_ts):
        raise TraceError("empty trace: no CPU ops, kernels or annotations (was the profiler ever active?)", str(p))

    base_ns = doc.baseTimeNanoseconds if type(doc.baseTimeNanoseconds) is int and \
        0 <= doc.baseTimeNanoseconds < 2 ** 62 else None  # else not an epoch in ns: times stay absolute
    if base_ns is not None:
        t0_epoch_ns, origin = base_ns + int(round(first_ts * 1000.0)), "baseTimeNanoseconds"
    else:
        t0_epoch_ns = int(round(first_ts * 1000.0))
        origin = "absolute-us" if first_ts >= _EPOCH_US else "trace-clock-us"

    cut = sum(_bound_names(names[b], p) for b in names)
    kernels = _frame(chunks["kernels"], "kernels", first_ts, names["kernels"])
    memcpys = _frame(chunks["memcpys"], "memcpys", first_ts, names["memcpys"])
    ops = _frame(chunks["ops"], "ops", first_ts, names["ops"])
    runtime = _frame(chunks["runtime"], "runtime", first_ts, names["runtime"])
    annotations = _frame(chunks["annotations"], "annotations", first_ts, names["annotations"])
    python = _frame(chunks["python"], "python", first_ts, names["python"])
    mem_cols = {c: np.concatenate([m[c] for m in memory]) for c in memory[0]} if memory else empty_columns("memory")
    mem_cols["ts"] = mem_cols["ts"] - first_ts
    mem_frame = pd.DataFrame(mem_cols)

    warnings: list[str] = []
    if cut:
        warnings.append(f"{cut} event name(s) longer than {MAX_NAME:,} characters were cut to that length "
                        "(each keeps a digest of the whole name, so distinct names stay distinct)")
    if len(kernels) + len(memcpys) == 0:
        warnings.append("no GPU events (kernels or memcpys): GPU analyses are skipped; was CUDA activity profiled?")
    has_dims = bool(ops["input_dims"].notna().any()) if len(ops) else False
    types = ops["input_types"] if len(ops) else pd.Series([], dtype=object)
    has_types = bool((types.notna() & (types != b"[]")).any())
    has_shapes = has_dims and has_types
    if len(ops) and not has_dims:
        warnings.append("no Input Dims (record_shapes=False): FLOP/byte models and shape findings are unavailable")
    elif len(ops) and not has_types:
        warnings.append("Input Dims without Input type (torch <= 1.9 traces): FLOP/byte models and shape "
                        "findings are unavailable")
    if len(ops) == 0 and len(kernels) + len(memcpys) > 0:
        warnings.append("no CPU ops (a GPU-only trace, activities=[CUDA]): no shapes, so kernels have no roofline "
                        "class (time by kernel name, communication, copies and idle are reported); host-side "
                        "analyses that read CPU ops are skipped")
    rank, world = _rank_of(doc, p, fallback_rank)
    props = next((d for d in (doc.deviceProperties, doc.computeProperties) if isinstance(d, list)), [])
    meta_kwargs = dict(
        path=str(p), rank=rank, world_size=world,
        device_properties=[d for d in props if isinstance(d, dict)],
        distributed_info=doc.distributedInfo if isinstance(doc.distributedInfo, dict) else None,
        t0_epoch_ns=t0_epoch_ns, time_origin=origin, schema_version=doc.schemaVersion,
        trace_name=doc.traceName if isinstance(doc.traceName, str) else None,
        record_shapes=(bool(doc.record_shapes) and has_dims) or has_shapes, with_stack=bool(doc.with_stack),
        events=n_events,
    )
    trace = attach_links(kernels, memcpys, ops, runtime, annotations, meta_kwargs, warnings, memory=mem_frame)
    return dataclasses.replace(trace, python=python)
