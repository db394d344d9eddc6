"""Decode Kineto chrome-trace JSON (``.json`` or gzip) into a :class:`RankTrace`.

Decoding uses msgspec with typed structs: only the fields gpuprof reads are materialised, which
is several times faster and smaller than ``json.load`` into dicts on multi-GB traces. Events are
bucketed by category once; every later step works on whole columns.
"""

from __future__ import annotations

import dataclasses
import gc
import hashlib
import itertools
import math
import operator
import os
import re

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpuprof.errors import TraceError
from gpuprof import files
from gpuprof.files import read_file
from gpuprof.trace import columnar
from gpuprof.trace.links import attach_links
from gpuprof.trace.model import RankTrace
from gpuprof.trace.names import is_comm, kernel_classes

_NO_RAW = msgspec.Raw(b"")


_NULL_RAW = msgspec.Raw(b"null")


# Each bucket's "args" are decoded into a struct of the fields its columns read, not one struct of
# every field any bucket reads: msgspec's cost per object grows with the struct's fields (the
# cpu_op args of a chunk decoded 2.4x faster into the 9 fields ops read than into all 35).
# gc=False: decoded JSON holds no cycles, and untracked structs are smaller and quicker to make.
class _IdArgs(msgspec.Struct, gc=False):
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_lc: Any = msgspec.field(default=None, name="external id")  # GPU/runtime events, torch <= 1.9


class _RuntimeArgs(_IdArgs, gc=False):
    correlation: Any = None


class _AnnotationArgs(_IdArgs, gc=False):
    stream: Any = None
    device: Any = None


class _MemcpyArgs(_IdArgs, gc=False):
    correlation: Any = None
    stream: Any = None
    device: Any = None
    bytes: Any = None


class _KernelArgs(_IdArgs, gc=False):
    correlation: Any = None
    stream: Any = None
    device: Any = None
    grid: Any = None
    block: Any = None
    registers: Any = msgspec.field(default=None, name="registers per thread")
    shared_memory: Any = msgspec.field(default=None, name="shared memory")
    occupancy: Any = msgspec.field(default=None, name="est. achieved occupancy %")
    collective_name: Any = msgspec.field(default=None, name="Collective name")
    in_msg_nelems: Any = msgspec.field(default=None, name="In msg nelems")
    out_msg_nelems: Any = msgspec.field(default=None, name="Out msg nelems")
    group_size: Any = msgspec.field(default=None, name="Group size")
    dtype: Any = None
    pg_name: Any = msgspec.field(default=None, name="Process Group Name")
    pg_id: Any = msgspec.field(default=None, name="Process Group ID")
    seq: Any = msgspec.field(default=None, name="Seq")  # a collective's sequence number in its group (Kineto, 2026)


class _OpArgs(_IdArgs, gc=False):
    # Shapes stay raw JSON text until an analysis needs them: most ops' shapes are never read.
    input_dims: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Dims")
    input_dims_lc: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input dims")  # torch 1.8
    input_type: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input type")
    input_strides: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Input Strides")
    concrete_inputs: msgspec.Raw = msgspec.field(default=_NO_RAW, name="Concrete Inputs")
    sequence_number: Any = msgspec.field(default=None, name="Sequence number")
    fwd_thread_id: Any = msgspec.field(default=None, name="Fwd thread id")


class _MemoryArgs(msgspec.Struct, gc=False):
    """A ``[memory]`` instant's (profile_memory=True): the allocation's size (negative: freed) and totals after it."""
    alloc_bytes: Any = msgspec.field(default=None, name="Bytes")
    total_allocated: Any = msgspec.field(default=None, name="Total Allocated")
    total_reserved: Any = msgspec.field(default=None, name="Total Reserved")
    device_id: Any = msgspec.field(default=None, name="Device Id")
    device_type: Any = msgspec.field(default=None, name="Device Type")


class _AnyArgs(msgspec.Struct, gc=False):
    """No field: decoding into it only checks that an event's args are an object (or null)."""


class _Event(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: str = ""
    pid: Any = 0
    tid: Any = 0
    ts: Any = None
    dur: Any = 0.0
    # Kept as JSON text (skipped, not decoded) until the event's bucket is known: ``_args``.
    # Absent args read as null, as "args": null does.
    args: msgspec.Raw = _NULL_RAW


_ARG_DECODERS: dict[type, Any] = {t: msgspec.json.Decoder(list[t | None])  # type: ignore[valid-type]
                                  for t in (_RuntimeArgs, _AnnotationArgs, _MemcpyArgs, _KernelArgs, _OpArgs,
                                            _MemoryArgs, _AnyArgs)}


def _every_field() -> Any:
    """One struct of every bucket's args fields, for an event as the chunk decoder read them
    before the args were decoded per bucket: a chunk whose args fail to decode is decoded again
    with it, so the error names the event within the chunk, as before."""
    fields = {f.encode_name: (f.name, f.type, msgspec.field(default=f.default, name=f.encode_name))
              for t in _ARG_DECODERS for f in msgspec.structs.fields(t)}
    args = msgspec.defstruct("_AllArgs", list(fields.values()), gc=False)
    event = msgspec.defstruct("_WholeEvent", [
        (f.name, args | None if f.name == "args" else f.type, None if f.name == "args" else f.default)
        for f in msgspec.structs.fields(_Event)], gc=False)
    return msgspec.json.Decoder(list[event])  # type: ignore[valid-type]


_WHOLE_CHUNK_DECODER = _every_field()


class _TraceFile(msgspec.Struct):
    traceEvents: list[msgspec.Raw] | None = None  # each event's JSON, decoded a chunk at a time
    schemaVersion: Any = None
    deviceProperties: Any = None
    computeProperties: Any = None  # early-2021 Kineto's name for deviceProperties
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    traceName: Any = None
    record_shapes: Any = None
    with_stack: Any = None


_DECODER = msgspec.json.Decoder(_TraceFile | list[msgspec.Raw])
_CHUNK_DECODER = msgspec.json.Decoder(list[_Event])
_NAME = operator.attrgetter("name")
_PH = operator.attrgetter("ph")
_CAT = operator.attrgetter("cat")
_ARGS = operator.attrgetter("args")
#: Events decoded together: the typed structs of one chunk are all that exists at once, so memory
#: holds the file, one small object per event and the columns built so far, not every event decoded.
CHUNK_EVENTS = 8_192
_RANK_IN_NAME = re.compile(r"(?:rank|_r|-r)[_-]?(\d+)", re.IGNORECASE)
_FLOAT_INT = 2 ** 1023  # integers at or beyond this do not convert to a float
#: No profiler records a time this far from its origin, or a span this long: µs (about 3,000
#: years, and 11.5 days). Numbers beyond are damage, not times, and would poison every sum.
MAX_ABS_TS_US = 1e17
MAX_DUR_US = 1e12
#: Characters of an event name kept (names beyond are cut; see ``_bound_names``).
MAX_NAME = 8192

#: PyTorch's own record_function ranges. Since torch 1.10 Kineto files them as user_annotation;
#: torch 1.8-1.9 wrote them as Operator events like any op, so they are moved to the annotations
#: there (steps, DataLoader and optimizer spans are read from the annotations).
_RECORD_FUNCTIONS = ("ProfilerStep#", "enumerate(DataLoader)#", "Optimizer.step#", "Optimizer.zero_grad#")
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


def _decode(path: Path, data: bytes | bytearray, decoder: Any = _DECODER) -> Any:
    if not data.strip():
        raise TraceError("empty file", str(path))
    try:  # (load_trace keeps the garbage collector off meanwhile)
        doc = decoder.decode(data)
    except msgspec.DecodeError as e:
        msg = str(e)
        if "truncated" in msg.lower():
            raise TraceError("truncated JSON (was the run killed while the trace was written?)", str(path)) from None
        raise TraceError(f"not a Kineto trace: {msg}", str(path)) from None
    except RecursionError:  # arrays in arrays past msgspec's depth limit: no profiler writes that
        raise TraceError("not a Kineto trace: JSON nested too deeply", str(path)) from None
    if decoder is not _DECODER:
        return doc
    if isinstance(doc, list):  # a bare chrome-trace event array
        doc = _TraceFile(traceEvents=doc)
    if doc.traceEvents is None:
        raise TraceError("not a Kineto trace: no 'traceEvents' list", str(path))
    return doc


def _address(buffer: Any) -> int:
    """Where a buffer's bytes start in memory."""
    addr: int = np.frombuffer(buffer, dtype=np.uint8).ctypes.data
    return addr


def _chunk_texts(data: bytes, events: list[msgspec.Raw]) -> Any:
    """A function giving events ``i`` to ``j - 1`` as the text of one JSON array.

    Consecutive elements of one JSON array lie in the file one after another, separated by a
    comma and whitespace only, so the chunk is one slice of the file's buffer, copied once with a
    bracket at each end (joining the raw events one by one took 0.16 s of CPU on an 80 MB trace,
    against 0.42 s for decoding its chunks). Where the raw events are not views of ``data``
    (never seen: msgspec keeps them there), they are joined instead."""
    base, size = _address(data), len(data)

    def joined(i: int, j: int) -> bytes:
        return b"[" + b",".join(events[i:j]) + b"]"

    def sliced(i: int, j: int) -> bytes | bytearray:
        start, end = _address(events[i]) - base, _address(events[j - 1]) - base + len(events[j - 1])
        if not 0 <= start < end <= size:
            return joined(i, j)
        text = bytearray(end - start + 2)
        text[0], text[-1] = 0x5B, 0x5D  # "[", "]"
        text[1:-1] = memoryview(data)[start:end]
        return text

    return sliced if events and isinstance(data, bytes) else joined


def _num(values: list[Any], dtype: str = "float64") -> np.ndarray:
    """Column of numbers; anything not a number (None, strings) becomes NaN/-1."""
    try:  # fast path: numbers and None (NaN) convert in C
        a = np.array(values, dtype=np.float64)
        if a.ndim != 1:
            raise ValueError
    except (TypeError, ValueError, OverflowError):  # OverflowError: an integer of 400 digits
        a = np.fromiter((_finite(v) for v in values), dtype=np.float64, count=len(values))
    return _int64(a) if dtype == "int64" else a


def _finite(v: Any) -> float:
    """A JSON number as a float; anything else, or an integer beyond float range, NaN."""
    if type(v) is float:
        return v
    if type(v) is int:
        return float(v) if -_FLOAT_INT < v < _FLOAT_INT else np.nan
    return np.nan


def _ids(values: list[Any]) -> np.ndarray:
    """Integer ids (pid, tid) that may be written as numbers or, in torch <= 1.9 traces, as strings
    of digits (``"tid": "4093687616"``); other strings (``"stream 7"``, ``"Traces"``) become -1."""
    a = _num(values)
    if len(a) and np.isnan(a).any() and any(type(v) is str for v in values):
        a = pd.to_numeric(pd.Series(values, dtype=object), errors="coerce").to_numpy(dtype=np.float64)
    return _int64(a)


def _ext(a: list[Any]) -> np.ndarray:
    """The "External id" of each event, or its lower-case spelling (GPU and runtime events, torch <= 1.9)."""
    ext = _num(_col(a, "external_id"), "int64")
    if (ext < 0).any():
        ext = np.where(ext >= 0, ext, _num(_col(a, "external_id_lc"), "int64"))
    return ext


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


def _xyz(values: list[Any]) -> np.ndarray:
    try:  # fast path: every value an [x, y, z] of ints
        out = np.array(values, dtype=np.int64)
        if out.shape == (len(values), 3):
            return out
    except (TypeError, ValueError, OverflowError):
        pass
    out = np.full((len(values), 3), -1, dtype=np.int64)
    ok = [i for i, v in enumerate(values) if isinstance(v, list) and len(v) == 3 and all(type(x) is int for x in v)]
    if ok:
        out[ok] = [values[i] for i in ok]
    return out


def _base(evs: list[_Event], names: np.ndarray) -> dict[str, Any]:
    """Name (``names``: codes into the bucket's distinct names in order of appearance, from
    :func:`_name_codes`), ts and dur of a chunk's events; times stay absolute until every chunk is
    read (``_finish`` moves them to the trace's origin)."""
    dur = _num(_col(evs, "dur"))
    return {
        "name": names,
        "ts": _num(_col(evs, "ts")),
        "dur": np.where(np.isfinite(dur) & (dur > 0), dur, 0.0),
    }


def _name_codes(codes: np.ndarray, uniques: np.ndarray, names: dict[str, int]) -> np.ndarray:
    """A bucket's codes from a chunk's (``codes`` into ``uniques``, the chunk's distinct names):
    ``names`` gains the bucket's new names in order of first appearance; one step per distinct
    name, the events themselves only through numpy."""
    lut = np.zeros(len(uniques), dtype=np.int32)
    for k in pd.unique(codes).tolist():
        n = uniques[k]
        lut[k] = names[n] if n in names else names.setdefault(n, len(names))
    out: np.ndarray = lut[codes]
    return out


def _col(objs: list[Any], field: str) -> list[Any]:
    """One attribute of every struct (a C-level pass)."""
    return list(map(operator.attrgetter(field), objs))


def _args(evs: list[_Event], kind: type) -> list[Any]:
    """The events' args decoded as ``kind`` (one struct per event; an empty one where they have
    none or "args": null). Raises msgspec's error where args are not an object: ``_load`` then
    decodes the chunk as a whole again, so the message names the event within the file."""
    if not evs:
        return []
    a: list[Any] = _ARG_DECODERS[kind].decode(b"[" + b",".join(map(_ARGS, evs)) + b"]")
    if None in a:
        empty = kind()
        a = [x or empty for x in a]
    return a


def _strs(values: list[Any], names: dict[Any, Any], as_str: bool = False) -> list[Any]:
    """Strings of a low-cardinality column, each distinct one stored once; others become None
    (``as_str``: other values but None become their ``str``). Worked out once per distinct
    (type, value), then mapped in C."""
    keys = list(zip(map(type, values), values))
    try:
        distinct = dict.fromkeys(keys)
    except TypeError:  # a list or object as the value (damaged args): one value at a time
        if as_str:
            return [None if v is None else names.setdefault(str(v), str(v)) for v in values]
        return [names.setdefault(v, v) if isinstance(v, str) else None for v in values]
    for t, v in distinct:
        if as_str:
            distinct[t, v] = None if v is None else names.setdefault(str(v), str(v))
        else:
            distinct[t, v] = names.setdefault(v, v) if t is str else None
    return list(map(distinct.__getitem__, keys))


def _first_set(first: list[Any], second: list[Any]) -> list[Any]:
    """``first``'s value, else (where it is None) ``second``'s, per row."""
    if None not in first:
        return first
    a, b = np.fromiter(first, dtype=object, count=len(first)), np.fromiter(second, dtype=object, count=len(second))
    unset = np.fromiter(map(operator.is_, first, itertools.repeat(None)), dtype=bool, count=len(first))
    a[unset] = b[unset]
    out: list[Any] = a.tolist()
    return out


def _raws(values: list[msgspec.Raw], seen: dict[bytes, bytes | None]) -> list[bytes | None]:
    """Raw JSON arguments copied out of the file's buffer (so it can be freed), each distinct
    text stored once (shapes repeat from step to step); absent ones (empty) are None."""
    seen.setdefault(b"", None)
    copies = list(map(bytes, values))
    return list(map(seen.setdefault, copies, copies))


def _kernel_cols(evs: list[_Event], names: np.ndarray, cats: np.ndarray) -> dict[str, Any]:
    a = _args(evs, _KernelArgs)
    cols = _base(evs, names)
    cols.update(_gpu_cols(evs, a))
    grid, block = _xyz(_col(a, "grid")), _xyz(_col(a, "block"))
    for i, axis in enumerate("xyz"):
        cols[f"grid_{axis}"] = grid[:, i]
        cols[f"block_{axis}"] = block[:, i]
    cols["blocks"] = np.where(grid.min(axis=1) > 0, grid.prod(axis=1), -1)
    cols["threads_per_block"] = np.where(block.min(axis=1) > 0, block.prod(axis=1), -1)
    cols["registers"] = _num(_col(a, "registers"), "int64")
    cols["shared_mem"] = _num(_col(a, "shared_memory"), "int64")
    occ = _num(_col(a, "occupancy"))
    cols["occupancy"] = np.where(occ > 0, occ, np.nan)  # 0 means "not computed" (cluster launches)
    strs: dict[Any, Any] = {}
    cols["collective"] = _strs(_col(a, "collective_name"), strs)
    cols["coll_dtype"] = _strs(_col(a, "dtype"), strs)
    cols["in_nelems"] = _num(_col(a, "in_msg_nelems"))
    cols["out_nelems"] = _num(_col(a, "out_msg_nelems"))
    cols["group_size"] = _num(_col(a, "group_size"), "int64")
    cols["process_group"] = _strs(_first_set(_col(a, "pg_name"), _col(a, "pg_id")), strs, as_str=True)
    cols["coll_seq"] = _num(_col(a, "seq"), "int64")
    return cols


def _gpu_cols(evs: list[_Event], a: list[Any]) -> dict[str, Any]:
    device = _num(_col(a, "device"), "int64")
    pid = _ids(_col(evs, "pid"))
    return {
        "device": np.where(device >= 0, device, pid),  # GPU events on pid = device when args lack it (older traces)
        "stream": _num(_col(a, "stream"), "int64"),
        "correlation": _num(_col(a, "correlation"), "int64"),
        "external_id": _ext(a),
    }


def _memcpy_cols(evs: list[_Event], names: np.ndarray, cats: np.ndarray) -> dict[str, Any]:
    a = _args(evs, _MemcpyArgs)
    cols = _base(evs, names)
    cols.update(_gpu_cols(evs, a))
    cols["bytes"] = _num(_col(a, "bytes"))
    return cols


def _op_cols(evs: list[_Event], names: np.ndarray, seen: dict[bytes, bytes | None]) -> dict[str, Any]:
    a = _args(evs, _OpArgs)
    cols = _base(evs, names)
    cols["pid"] = _ids(_col(evs, "pid"))
    cols["tid"] = _ids(_col(evs, "tid"))
    cols["external_id"] = _ext(a)
    cols["sequence_number"] = _num(_col(a, "sequence_number"), "int64")
    cols["fwd_thread_id"] = _num(_col(a, "fwd_thread_id"), "int64")
    for col, field in (("input_dims", "input_dims"), ("input_types", "input_type"),
                       ("input_strides", "input_strides"), ("concrete_inputs", "concrete_inputs")):
        cols[col] = _raws(list(map(operator.attrgetter(field), a)), seen)
    legacy_dims = list(map(operator.attrgetter("input_dims_lc"), a))
    if any(map(len, legacy_dims)):  # torch 1.8 wrote "Input dims"
        cols["input_dims"] = _first_set(cols["input_dims"], _raws(legacy_dims, seen))
    return cols


def _runtime_cols(evs: list[_Event], names: np.ndarray, cats: np.ndarray) -> dict[str, Any]:
    a = _args(evs, _RuntimeArgs)
    cols = _base(evs, names)
    cols["api"] = np.where(cats == _CAT_CODE["cuda_driver"], "driver", "runtime").astype(object)
    cols["pid"] = _ids(_col(evs, "pid"))
    cols["tid"] = _ids(_col(evs, "tid"))
    cols["correlation"] = _num(_col(a, "correlation"), "int64")
    cols["external_id"] = _ext(a)
    return cols


def _annotation_cols(evs: list[_Event], names: np.ndarray, cats: np.ndarray) -> dict[str, Any]:
    a = _args(evs, _AnnotationArgs)
    cols = _base(evs, names)
    cols["pid"] = _ids(_col(evs, "pid"))
    cols["tid"] = _ids(_col(evs, "tid"))
    cols["on_gpu"] = cats == _CAT_CODE["gpu_user_annotation"]
    cols["device"] = _num(_col(a, "device"), "int64")
    cols["stream"] = _num(_col(a, "stream"), "int64")
    cols["external_id"] = _ext(a)
    return cols


def _python_cols(evs: list[_Event], names: np.ndarray, cats: np.ndarray) -> dict[str, Any]:
    """``python_function`` events (``with_stack=True``): the Python frames, nested by time per thread."""
    _args(evs, _AnyArgs)  # no field is read, but args must still be an object or null
    cols = _base(evs, names)
    cols["tid"] = _num(_col(evs, "tid"), "int64")
    return cols


def _memory_cols(evs: list[_Event]) -> dict[str, np.ndarray]:
    a = _args(evs, _MemoryArgs)
    return {
        "ts": _num(_col(evs, "ts")), "bytes": _num(_col(a, "alloc_bytes")),
        "total_allocated": _num(_col(a, "total_allocated")), "total_reserved": _num(_col(a, "total_reserved")),
        "device": _num(_col(a, "device_id"), "int64"), "device_type": _num(_col(a, "device_type"), "int64"),
        "pid": _num(_col(evs, "pid"), "int64"), "tid": _num(_col(evs, "tid"), "int64"),
    }


#: Columns stored as categoricals, per bucket (besides ``name``).
_CATEGORICAL = {"kernels": ("collective", "coll_dtype", "process_group"), "runtime": ("api",)}


def _frame(chunks: list[dict[str, Any]], bucket: str, t_origin: float, names: dict[str, int]) -> pd.DataFrame:
    """One bucket's chunks as a frame: times relative to ``t_origin``, names categorical."""
    if not chunks:  # the columns of no events
        none = np.zeros(0, dtype=np.int32)
        chunks = [_op_cols([], none, {}) if bucket == "ops" else _BUILDERS[bucket]([], none, none)]
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


_BUILDERS: dict[str, Any] = {"kernels": _kernel_cols, "memcpys": _memcpy_cols, "runtime": _runtime_cols,
                             "annotations": _annotation_cols, "python": _python_cols}


#: Kineto's event categories, lower case since torch 1.10 and capitalised in 1.8-1.9.
_BUCKETS = {
    "Kernel": "kernels",
    "Memcpy": "memcpys",
    "Memset": "memcpys",
    "Operator": "ops",
    "Runtime": "runtime",
    "kernel": "kernels",
    "gpu_memcpy": "memcpys",
    "gpu_memset": "memcpys",
    "cpu_op": "ops",
    "cuda_runtime": "runtime",
    "cuda_driver": "runtime",
    "user_annotation": "annotations",
    "gpu_user_annotation": "annotations",
    "python_function": "python",
}
#: Each category's code (its place in ``_BUCKETS``; -1: not a bucket), and each code's bucket.
_CAT_CODE = {c: i for i, c in enumerate(_BUCKETS)}
_BUCKET_NAMES = sorted(set(_BUCKETS.values()))
_BUCKET_OF = np.array([_BUCKET_NAMES.index(b) for b in _BUCKETS.values()] + [-1])  # (code -1: the last, no bucket)
_OPS, _ANNOTATIONS = _BUCKET_NAMES.index("ops"), _BUCKET_NAMES.index("annotations")


def _cat_codes(cats: list[Any]) -> np.ndarray:
    """Each event's category code (``_CAT_CODE``), -1 where it is no bucket's or not a string."""
    try:
        return np.fromiter(map(_CAT_CODE.get, cats, itertools.repeat(-1)), dtype=np.int64, count=len(cats))
    except TypeError:  # an unhashable category (a list): damaged, no bucket's
        return np.fromiter((_CAT_CODE.get(c, -1) if c.__class__ is str else -1 for c in cats), dtype=np.int64,
                           count=len(cats))


def _is(values: list[Any], value: str) -> np.ndarray:
    """Where ``values`` equal the string ``value`` (whatever type the others are)."""
    return np.fromiter(map(operator.eq, values, itertools.repeat(value)), dtype=bool, count=len(values))


def _split(evs: list[_Event]) -> tuple[dict[str, tuple[list[_Event], np.ndarray, np.ndarray]], list[_Event],
                                       np.ndarray, np.ndarray]:
    """A chunk's complete events by bucket, without a Python step per event: per bucket its
    events, their codes into the chunk's distinct names and their category codes; the
    ``[memory]`` instants; the chunk's distinct names and each event's code into them.

    PyTorch's own record_function ranges filed as ops (torch 1.8-1.9) go to the annotations."""
    n = len(evs)
    name_codes, uniques = pd.factorize(np.fromiter(map(_NAME, evs), dtype=object, count=n))
    phs = list(map(_PH, evs))
    cats = _cat_codes(list(map(_CAT, evs)))
    cats[~_is(phs, "X")] = -1
    bucket = _BUCKET_OF[cats]
    recorded = np.fromiter((u.startswith(_RECORD_FUNCTIONS) for u in uniques), dtype=bool, count=len(uniques))
    if recorded.any():
        bucket[(bucket == _OPS) & recorded[name_codes]] = _ANNOTATIONS
    out: dict[str, tuple[list[_Event], np.ndarray, np.ndarray]] = {}
    for b in np.unique(bucket).tolist():
        if b >= 0:
            rows = np.flatnonzero(bucket == b)
            out[_BUCKET_NAMES[b]] = (list(map(evs.__getitem__, rows.tolist())), name_codes[rows], cats[rows])
    mem: list[_Event] = []
    others = bucket < 0
    is_memory = uniques == "[memory]"
    if is_memory.any():
        at = is_memory[name_codes] & _is(phs, "i")
        mem = list(map(evs.__getitem__, np.flatnonzero(at).tolist()))
        others &= ~at
    _args(list(map(evs.__getitem__, np.flatnonzero(others).tolist())), _AnyArgs)  # (args: an object or null)
    return out, mem, uniques, name_codes


def _rank_of(doc: _TraceFile, path: Path, fallback: int) -> tuple[int, int]:
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

    ``source``, when given, holds the file's bytes already read (``[read_file(path)]``): they are
    parsed instead of reading the file again, so a caller that hashed them knows exactly what was
    parsed. The list is emptied, so the buffer is freed as early as if it had been read here."""
    gc_was_on = gc.isenabled()
    gc.disable()  # millions of small acyclic objects: collection passes would only cost time
    try:
        return _load(Path(path), fallback_rank, source)
    finally:
        if gc_was_on:
            gc.enable()


#: Fields each bucket's columns read (``[memory]`` instants as a bucket of their own): an event of
#: that bucket with a value its column cannot hold in one of them (``columnar.Scanned.rare``) sends
#: the file to the msgspec path, whose chunk-wise conversions give such values their meaning.
_READS = {
    "kernels": ("ts", "dur", "pid", "device", "stream", "correlation", "external_id", "external_id_lc", "grid",
                "block", "registers", "shared_memory", "occupancy", "in_msg_nelems", "out_msg_nelems",
                "group_size", "seq"),
    "memcpys": ("ts", "dur", "pid", "device", "stream", "correlation", "external_id", "external_id_lc", "bytes"),
    "ops": ("ts", "dur", "pid", "tid", "external_id", "external_id_lc", "sequence_number", "fwd_thread_id"),
    "runtime": ("ts", "dur", "pid", "tid", "correlation", "external_id", "external_id_lc"),
    "annotations": ("ts", "dur", "pid", "tid", "device", "stream", "external_id", "external_id_lc"),
    "python": ("ts", "dur", "tid"),
    "memory": ("ts", "alloc_bytes", "total_allocated", "total_reserved", "device_id", "device_type", "pid", "tid"),
}
#: Per bucket code (``_BUCKET_NAMES`` order, then ``[memory]``, then no bucket) the rare bits it reads.
_READ_BITS = np.array([sum(columnar.RARE_BITS.get(f, 0) for f in _READS[b]) for b in _BUCKET_NAMES]
                      + [sum(columnar.RARE_BITS.get(f, 0) for f in _READS["memory"]), 0], dtype=np.uint32)


def _int64(a: np.ndarray) -> np.ndarray:
    """Integral floats within int64's range as int64, others (NaN, inf, 2.5, 1e300) -1."""
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(a) & (a == np.floor(a)) & (np.abs(a) < 2.0**63)
    out: np.ndarray = np.where(ok, a, -1.0).astype(np.int64)
    return out


def _objects(values: Any, n: int) -> np.ndarray:
    """A 1-d object array of ``n`` values, then None (so id -1 reads None)."""
    out = np.empty(n + 1, dtype=object)
    out[:n] = values if isinstance(values, np.ndarray) else np.fromiter(values, dtype=object, count=n)
    out[n] = None
    return out


def _from_columns(box: list[bytes]) -> _Parts | None:
    """The native path: the events scanned to columns in C (:mod:`gpuprof.trace.columnar`), then
    cut into buckets with numpy: the columns :func:`_from_chunks` builds, value for value, or None
    where this path does not apply (then :func:`_from_chunks` loads the file, and words its errors).

    ``box`` holds the file's bytes; it is emptied once this path can no longer give up, so that the
    buffer is freed before the columns are built (else it would set the peak: 760 vs 730 MB at 300 MB)."""
    s = columnar.scan(box[0])
    if s is None:
        return None
    head = s.head
    index: dict[str, int] = {}  # each distinct name (raw texts that decode alike are one name)
    sid = np.fromiter((index.setdefault(n, len(index)) for n in s.names), dtype=np.int64, count=len(s.names))[s.name]
    distinct = list(index)
    cats = s.cat.astype(np.int64)
    bucket = _BUCKET_OF[cats]
    bucket[s.ph != 1] = -1
    recorded = np.fromiter((u.startswith(_RECORD_FUNCTIONS) for u in distinct), dtype=bool, count=len(distinct))
    if recorded.any():
        bucket[(bucket == _OPS) & recorded[sid]] = _ANNOTATIONS
    is_memory = np.fromiter((u == "[memory]" for u in distinct), dtype=bool, count=len(distinct))
    memory_rows = is_memory[sid] & (s.ph == 2) & (bucket < 0)
    kind = np.where(bucket >= 0, bucket, len(_BUCKET_NAMES) + 1)
    kind[memory_rows] = len(_BUCKET_NAMES)
    if (s.rare & _READ_BITS[kind]).any():
        return None
    timed = (bucket >= 0) & (bucket != _BUCKET_NAMES.index("python"))  # python frames: no time check
    dur_all = s.num["dur"]
    dur_all = np.where(np.isfinite(dur_all) & (dur_all > 0), dur_all, 0.0)
    if not ((np.abs(s.num["ts"][timed]) < MAX_ABS_TS_US).all() and (dur_all[timed] < MAX_DUR_US).all()):
        return None  # a time no profiler writes: refused by the msgspec path, in its words and chunk order
    del dur_all, timed
    box.clear()  # no way back to the msgspec path from here: the file's buffer can go
    strs = s.str_values
    coll = _objects((v if type(v) is str else None for v in strs), len(strs))
    unset = np.fromiter((v is None for v in strs), dtype=bool, count=len(strs))
    pg = _objects((None if v is None else str(v) for v in strs), len(strs))
    seen: dict[bytes, bytes | None] = {b"": None}
    raws = _objects((seen.setdefault(t, t) for t in s.raw_texts), len(s.raw_texts))
    none_set = np.r_[unset, True]

    chunks: dict[str, list[dict[str, Any]]] = {b: [] for b in set(_BUCKETS.values())}
    names: dict[str, dict[str, int]] = {b: {} for b in chunks}
    for b in _BUCKET_NAMES:
        rows = np.flatnonzero(bucket == _BUCKET_NAMES.index(b))
        if not len(rows):
            continue
        codes, uniq = pd.factorize(sid[rows])
        names[b] = {distinct[u]: i for i, u in enumerate(uniq.tolist())}

        def num(f: str) -> np.ndarray:
            out: np.ndarray = s.num[f][rows]
            return out

        dur = num("dur")
        cols: dict[str, Any] = {"name": codes.astype(np.int32), "ts": num("ts"),
                                "dur": np.where(np.isfinite(dur) & (dur > 0), dur, 0.0)}
        ext = _int64(num("external_id"))
        if (ext < 0).any():
            ext = np.where(ext >= 0, ext, _int64(num("external_id_lc")))
        if b in ("kernels", "memcpys"):
            device = _int64(num("device"))
            cols["device"] = np.where(device >= 0, device, _int64(num("pid")))
            cols["stream"] = _int64(num("stream"))
            cols["correlation"] = _int64(num("correlation"))
            cols["external_id"] = ext
        if b == "kernels":
            grid, block = s.grid[rows], s.block[rows]
            for i, axis in enumerate("xyz"):
                cols[f"grid_{axis}"] = grid[:, i]
                cols[f"block_{axis}"] = block[:, i]
            cols["blocks"] = np.where(grid.min(axis=1) > 0, grid.prod(axis=1), -1)
            cols["threads_per_block"] = np.where(block.min(axis=1) > 0, block.prod(axis=1), -1)
            cols["registers"] = _int64(num("registers"))
            cols["shared_mem"] = _int64(num("shared_memory"))
            occ = num("occupancy")
            cols["occupancy"] = np.where(occ > 0, occ, np.nan)
            cols["collective"] = coll[s.strs["collective_name"][rows]].tolist()
            cols["coll_dtype"] = coll[s.strs["dtype"][rows]].tolist()
            cols["in_nelems"] = num("in_msg_nelems")
            cols["out_nelems"] = num("out_msg_nelems")
            cols["group_size"] = _int64(num("group_size"))
            pg_name, pg_id = s.strs["pg_name"][rows], s.strs["pg_id"][rows]
            cols["process_group"] = pg[np.where(none_set[pg_name], pg_id, pg_name)].tolist()
            cols["coll_seq"] = _int64(num("seq"))
        elif b == "memcpys":
            cols["bytes"] = num("bytes")
        elif b == "python":
            cols["tid"] = _int64(num("tid"))
        else:  # ops, runtime, annotations
            if b == "runtime":
                cols["api"] = np.where(cats[rows] == _CAT_CODE["cuda_driver"], "driver", "runtime").astype(object)
            cols["pid"] = _int64(num("pid"))
            cols["tid"] = _int64(num("tid"))
            if b == "ops":
                cols["external_id"] = ext
                cols["sequence_number"] = _int64(num("sequence_number"))
                cols["fwd_thread_id"] = _int64(num("fwd_thread_id"))
                dims = s.raws["input_dims"][rows]
                legacy = s.raws["input_dims_lc"][rows]
                cols["input_dims"] = raws[np.where(dims >= 0, dims, legacy)]  # torch 1.8 wrote "Input dims"
                cols["input_types"] = raws[s.raws["input_type"][rows]]
                cols["input_strides"] = raws[s.raws["input_strides"][rows]]
                cols["concrete_inputs"] = raws[s.raws["concrete_inputs"][rows]]
            elif b == "runtime":
                cols["correlation"] = _int64(num("correlation"))
                cols["external_id"] = ext
            else:
                cols["on_gpu"] = cats[rows] == _CAT_CODE["gpu_user_annotation"]
                cols["device"] = _int64(num("device"))
                cols["stream"] = _int64(num("stream"))
                cols["external_id"] = ext
        chunks[b].append(cols)
    memory: list[dict[str, np.ndarray]] = []
    rows = np.flatnonzero(memory_rows)
    if len(rows):
        memory.append({
            "ts": s.num["ts"][rows], "bytes": s.num["alloc_bytes"][rows],
            "total_allocated": s.num["total_allocated"][rows], "total_reserved": s.num["total_reserved"][rows],
            "device": _int64(s.num["device_id"][rows]), "device_type": _int64(s.num["device_type"][rows]),
            "pid": _int64(s.num["pid"][rows]), "tid": _int64(s.num["tid"][rows]),
        })
    return head, s.events, chunks, names, memory


#: What a loader hands on: the document's metadata, its number of events, each bucket's columns
#: (a dict of columns per chunk), each bucket's names (name -> code, in order of first
#: appearance) and the ``[memory]`` instants' columns (per chunk).
_Parts = tuple[Any, int, dict[str, list[dict[str, Any]]], dict[str, dict[str, int]], list[dict[str, np.ndarray]]]


def _load(p: Path, fallback_rank: int, source: list[bytes] | None = None) -> RankTrace:
    box = [files.unpack(p, source.pop()) if source else read_bytes(p)]  # the file's bytes, held only here
    parts = _from_columns(box)
    if parts is None:  # no scanner, or a file it does not take: msgspec, chunk by chunk
        parts = _from_chunks(p, box.pop())
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
    mem_cols = {c: np.concatenate([m[c] for m in memory]) for c in memory[0]} if memory else _memory_cols([])
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



def _from_chunks(p: Path, data: bytes) -> _Parts:
    """The msgspec path: the events split into raw values, decoded 8192 at a time into structs."""
    doc = _decode(p, data)
    events: list[msgspec.Raw] = doc.traceEvents or []
    n_events = len(events)
    chunk_text = _chunk_texts(data, events)
    chunks: dict[str, list[dict[str, Any]]] = {b: [] for b in set(_BUCKETS.values())}
    names: dict[str, dict[str, int]] = {b: {} for b in chunks}  # per bucket: name -> code
    seen: dict[bytes, bytes | None] = {}
    memory: list[dict[str, np.ndarray]] = []  # [memory] instants, not a bucket: they have no name or duration
    for i in range(0, n_events, CHUNK_EVENTS):
        text = chunk_text(i, min(i + CHUNK_EVENTS, n_events))
        evs = _decode(p, text, _CHUNK_DECODER)
        try:
            buckets, mem, uniques, _ = _split(evs)
            if mem:
                memory.append(_memory_cols(mem))
            for b, (bevs, codes, cats) in buckets.items():
                bnames = _name_codes(codes, uniques, names[b])
                chunks[b].append(_op_cols(bevs, bnames, seen) if b == "ops" else _BUILDERS[b](bevs, bnames, cats))
        except (msgspec.DecodeError, RecursionError) as e:  # some event's args: worded as a whole decode words them
            _decode(p, text, _WHOLE_CHUNK_DECODER)
            raise TraceError(f"not a Kineto trace: {e}", str(p)) from None
        del evs, buckets, mem, text
    return doc, n_events, chunks, names, memory
