"""The msgspec path of the trace loader: the document decoded with typed structs (only the fields
gpuprof reads are materialised), its events split into raw values and decoded 8192 at a time,
each chunk cut into the buckets' columns (:func:`from_chunks`). It loads every file the C scanner
(:mod:`gpuprof.trace.native`) does not take, to the same columns, and words every error.
"""

from __future__ import annotations

import itertools
import operator
from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from gpuprof.errors import TraceError
from gpuprof.trace.kineto import ANNOTATIONS, BUCKET_NAMES, BUCKET_OF, BUCKETS, CAT_CODE, OPS, RECORD_FUNCTIONS, Parts, to_int64

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


class TraceFile(msgspec.Struct):
    traceEvents: list[msgspec.Raw] | None = None  # each event's JSON, decoded a chunk at a time
    schemaVersion: Any = None
    deviceProperties: Any = None
    computeProperties: Any = None  # early-2021 Kineto's name for deviceProperties
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    traceName: Any = None
    record_shapes: Any = None
    with_stack: Any = None


_DECODER = msgspec.json.Decoder(TraceFile | list[msgspec.Raw])
_CHUNK_DECODER = msgspec.json.Decoder(list[_Event])
_NAME = operator.attrgetter("name")
_PH = operator.attrgetter("ph")
_CAT = operator.attrgetter("cat")
_ARGS = operator.attrgetter("args")
#: Events decoded together: the typed structs of one chunk are all that exists at once, so memory
#: holds the file, one small object per event and the columns built so far, not every event decoded.
CHUNK_EVENTS = 8_192
_FLOAT_INT = 2 ** 1023  # integers at or beyond this do not convert to a float


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
        doc = TraceFile(traceEvents=doc)
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
    return to_int64(a) if dtype == "int64" else a


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
    return to_int64(a)


def _ext(a: list[Any]) -> np.ndarray:
    """The "External id" of each event, or its lower-case spelling (GPU and runtime events, torch <= 1.9)."""
    ext = _num(_col(a, "external_id"), "int64")
    if (ext < 0).any():
        ext = np.where(ext >= 0, ext, _num(_col(a, "external_id_lc"), "int64"))
    return ext


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
    cols["api"] = np.where(cats == CAT_CODE["cuda_driver"], "driver", "runtime").astype(object)
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
    cols["on_gpu"] = cats == CAT_CODE["gpu_user_annotation"]
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


_BUILDERS: dict[str, Any] = {"kernels": _kernel_cols, "memcpys": _memcpy_cols, "runtime": _runtime_cols,
                             "annotations": _annotation_cols, "python": _python_cols}


def _cat_codes(cats: list[Any]) -> np.ndarray:
    """Each event's category code (``CAT_CODE``), -1 where it is no bucket's or not a string."""
    try:
        return np.fromiter(map(CAT_CODE.get, cats, itertools.repeat(-1)), dtype=np.int64, count=len(cats))
    except TypeError:  # an unhashable category (a list): damaged, no bucket's
        return np.fromiter((CAT_CODE.get(c, -1) if c.__class__ is str else -1 for c in cats), dtype=np.int64,
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
    bucket = BUCKET_OF[cats]
    recorded = np.fromiter((u.startswith(RECORD_FUNCTIONS) for u in uniques), dtype=bool, count=len(uniques))
    if recorded.any():
        bucket[(bucket == OPS) & recorded[name_codes]] = ANNOTATIONS
    out: dict[str, tuple[list[_Event], np.ndarray, np.ndarray]] = {}
    for b in np.unique(bucket).tolist():
        if b >= 0:
            rows = np.flatnonzero(bucket == b)
            out[BUCKET_NAMES[b]] = (list(map(evs.__getitem__, rows.tolist())), name_codes[rows], cats[rows])
    mem: list[_Event] = []
    others = bucket < 0
    is_memory = uniques == "[memory]"
    if is_memory.any():
        at = is_memory[name_codes] & _is(phs, "i")
        mem = list(map(evs.__getitem__, np.flatnonzero(at).tolist()))
        others &= ~at
    _args(list(map(evs.__getitem__, np.flatnonzero(others).tolist())), _AnyArgs)  # (args: an object or null)
    return out, mem, uniques, name_codes


def from_chunks(p: Path, data: bytes) -> Parts:
    """The msgspec path: the events split into raw values, decoded 8192 at a time into structs."""
    doc = _decode(p, data)
    events: list[msgspec.Raw] = doc.traceEvents or []
    n_events = len(events)
    chunk_text = _chunk_texts(data, events)
    chunks: dict[str, list[dict[str, Any]]] = {b: [] for b in set(BUCKETS.values())}
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


def empty_columns(bucket: str) -> dict[str, Any]:
    """The columns of no events of ``bucket`` (``"memory"``: the ``[memory]`` instants)."""
    if bucket == "memory":
        return _memory_cols([])
    none = np.zeros(0, dtype=np.int32)
    return _op_cols([], none, {}) if bucket == "ops" else _BUILDERS[bucket]([], none, none)
