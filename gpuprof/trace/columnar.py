"""Kineto events decoded straight to columns, in C (``_columns.c``), with no Python object per event.

:func:`scan` is the fast path of :func:`gpuprof.trace.load.load_trace`. The C scanner walks the
document once, validating it (as strictly as msgspec's own skip does, or more: any surrogate
escape, nesting past 64 levels) and writing each field of the ``traceEvents`` array that gpuprof
reads into a column: numbers as float64 (grid and block as int64 triples),
categories and phases as small codes, and names, the kernels' collective strings and the ops'
raw arguments (``Input Dims`` ...) as ids into tables of distinct texts. Only those distinct
texts become Python objects, decoded by msgspec, so every value is the one the msgspec path
would have produced; msgspec also decodes the document with the events array cut out (its
metadata), so the file is accepted or refused as before.

Why not a general columnar JSON reader: measured on the 89 MB GPT shape of ``benchmarks.matrix``
(docs/performance.md), pyarrow's JSON reader took 0.58 s of CPU, Polars 0.64 s and DuckDB
0.25-0.34 s, against 0.35 s for the bare msgspec typed decode the load is measured by, before
any column is built; none keeps a value's JSON text (the ``ops`` frame holds ``Input Dims`` as
recorded), and pyarrow and Polars refuse a column whose type changes between events (``pid``
is a number in most events and ``"Spans"`` in some).

The scanner is narrow on purpose and returns ``None`` (the caller then loads the file the msgspec
way, to the same frames and the same errors) on whatever it does not reproduce exactly: a key
or a category written with escapes, a duplicated key, a name that is no string, ``args`` that
are no object. A value of the wrong type for its column (a string ``pid``, a list as a
``stream``, an integer of 19 digits) is flagged per event in ``rare`` (one bit per field, see
:data:`RARE_BITS`) rather than refused, since most such values sit in events whose bucket never
reads that field (the ``"pid": "Spans"`` of a ``Trace`` span); the caller refuses only where an
event's bucket reads a flagged field.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import msgspec
import numpy as np

_columns: Any
try:
    from gpuprof.trace import _columns
except ImportError:  # not compiled (the extension is optional): the msgspec path serves alone
    _columns = None

#: Whether the C scanner is there.
AVAILABLE = _columns is not None

#: The float64 columns, in the scanner's order; a field's bit in ``rare`` is its index here.
NUMERIC: tuple[str, ...] = tuple(_columns.NUMERIC) if _columns is not None else ()
#: Bit of each field in ``rare``: the numeric ones, then grid and block.
RARE_BITS: dict[str, int] = {**{f: 1 << i for i, f in enumerate(NUMERIC)},
                             **({"grid": _columns.BIT_GRID, "block": _columns.BIT_BLOCK} if _columns else {})}
STRINGS = ("collective_name", "dtype", "pg_name", "pg_id")
RAWS = ("input_dims", "input_dims_lc", "input_type", "input_strides", "concrete_inputs")
_NO_RAW = msgspec.Raw(b"")


class TraceHead(msgspec.Struct):
    """The document with its events kept as one raw value (fields as ``gpuprof.trace.chunks.TraceFile``'s)."""
    traceEvents: msgspec.Raw = _NO_RAW
    schemaVersion: Any = None
    deviceProperties: Any = None
    computeProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    traceName: Any = None
    record_shapes: Any = None
    with_stack: Any = None


_HEAD = msgspec.json.Decoder(TraceHead)
_STRS = msgspec.json.Decoder(list[str])
_ANYS = msgspec.json.Decoder(list[Any])


@dataclasses.dataclass
class Scanned:
    """A trace's events as columns (one row per event, in file order).

    ``ph``: 1 "X", 2 "i", else 0. ``cat``: index into ``gpuprof.trace.kineto.BUCKETS`` (-1: none of them).
    ``name``: index into ``names`` (the distinct names, decoded). ``num``: the float64 column of
    each of :data:`NUMERIC` (NaN where absent or null; ``pid``, ``tid`` and ``dur`` default to 0
    as the msgspec structs do). ``grid``/``block``: (n, 3) int64, -1 where not three integers.
    ``strs``/``raws``: per field of :data:`STRINGS`/:data:`RAWS`, an id into ``str_values``
    (decoded JSON values) / ``raw_texts`` (the JSON text as bytes), -1 where absent (and, for
    ``strs``, null). ``rare``: per event, the bits of :data:`RARE_BITS` whose field held a value
    its column cannot hold."""
    head: TraceHead
    events: int
    ph: np.ndarray
    cat: np.ndarray
    name: np.ndarray
    names: list[str]
    num: dict[str, np.ndarray]
    grid: np.ndarray
    block: np.ndarray
    strs: dict[str, np.ndarray]
    str_values: list[Any]
    raws: dict[str, np.ndarray]
    raw_texts: list[bytes]
    rare: np.ndarray


def _address(buffer: Any) -> int:
    addr: int = np.frombuffer(buffer, dtype=np.uint8).ctypes.data
    return addr


def _texts(data: bytes, table: tuple[bytes, bytes]) -> list[bytes]:
    off, length = np.frombuffer(table[0], dtype=np.int64).tolist(), np.frombuffer(table[1], dtype=np.int32).tolist()
    view = memoryview(data)
    return [bytes(view[o:o + n]) for o, n in zip(off, length)]


def scan(data: bytes | bytearray) -> Scanned | None:
    """The events of the Kineto JSON document ``data`` as columns, or None where this path does
    not apply (no scanner, a file msgspec refuses, anything the scanner refuses): the caller then
    decodes with msgspec, which also words any error."""
    if _columns is None or not isinstance(data, bytes):
        return None
    cols = _columns.scan(data)
    if cols is None:
        return None
    start, stop, bare = cols.pop("span")
    if bare:  # a bare chrome-trace event array: the scanner validated all of it
        head = TraceHead()
    else:
        # msgspec decodes the rest of the document, the events array replaced by "[]": the scanner
        # validated the array (as strictly as msgspec's skip, or more), msgspec validates the rest
        # and reads the metadata, and the "[]" it finds as traceEvents must be the one put there
        text = data[:start] + b"[]" + data[stop:]
        try:
            head = _HEAD.decode(text)
        except (msgspec.DecodeError, RecursionError):
            return None
        events = head.traceEvents
        if len(events) != 2 or _address(events) - _address(text) != start:
            return None
        head.traceEvents = _NO_RAW
    try:
        raw_names = _texts(data, cols.pop("names_table"))
        names = _STRS.decode(b'["' + b'","'.join(raw_names) + b'"]') if raw_names else []
        str_values = _ANYS.decode(b"[" + b",".join(_texts(data, cols.pop("strs_table"))) + b"]")
    except (msgspec.DecodeError, RecursionError):
        return None  # e.g. a name with a lone surrogate escape: msgspec's own error, from its path
    raw_texts = _texts(data, cols.pop("raws_table"))
    n = cols.pop("events")
    return Scanned(
        head=head, events=n,
        ph=np.frombuffer(cols.pop("ph"), dtype=np.uint8), cat=np.frombuffer(cols.pop("cat"), dtype=np.int8),
        name=np.frombuffer(cols.pop("name"), dtype=np.int32), names=names,
        num={f: np.frombuffer(cols.pop(f), dtype=np.float64) for f in NUMERIC},
        grid=np.frombuffer(cols.pop("grid"), dtype=np.int64).reshape(n, 3),
        block=np.frombuffer(cols.pop("block"), dtype=np.int64).reshape(n, 3),
        strs={f: np.frombuffer(cols.pop(f), dtype=np.int32) for f in STRINGS}, str_values=str_values,
        raws={f: np.frombuffer(cols.pop(f), dtype=np.int32) for f in RAWS}, raw_texts=raw_texts,
        rare=np.frombuffer(cols.pop("rare"), dtype=np.uint32),
    )
